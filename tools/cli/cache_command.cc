// sluice cache list   --dispatcher ADDR [--json]
// sluice cache verify --dispatcher ADDR --cache-root DIR [NAME]
// sluice cache rm     --dispatcher ADDR NAME
// Cache nodes' files (docs/cache.md): what the dispatcher has committed, whether every committed
// file still reads back with its checksums, and removing a cache by name. Every flag is also
// SLUICE_<FLAG>; the TLS and token flags are `sluice status`'s.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/record/shard.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"
#include "common/service/protocol.h"
#include "common/service/server_main.h"
#include "proto/dispatcher.grpc.pb.h"
#include "tools/cli/command.h"
#include "tools/local_cluster/autoscale.h"

namespace sluice::cli {
namespace {

struct CacheFlags {
  std::string dispatcher;
  std::string cache_root;
  std::string name;
  bool json = false;
  service::ChannelOptions security;
};

absl::StatusOr<std::unique_ptr<proto::DispatcherService::Stub>> Stub(const CacheFlags& f) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   service::CreateChannel(f.dispatcher, f.security));
  return proto::DispatcherService::NewStub(channel);
}

absl::StatusOr<proto::GetStatusResponse> Caches(const CacheFlags& f, bool files) {
  ASSIGN_OR_RETURN(auto stub, Stub(f));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  proto::GetStatusRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_starting_workers(-1);
  request.set_cache_files(files);
  proto::GetStatusResponse response;
  const grpc::Status status = stub->GetStatus(&context, request, &response);
  if (!status.ok()) {
    absl::Status s = service::FromGrpcStatus(status);
    return absl::Status(s.code(), absl::StrCat("GetStatus from ", f.dispatcher, ": ", s.message()));
  }
  return response;
}

absl::Status RunList(const CacheFlags& f) {
  ASSIGN_OR_RETURN(proto::GetStatusResponse status, Caches(f, /*files=*/false));
  if (f.json) {
    std::printf("%s\n", tools::CachesJsonText(status).c_str());
    return absl::OkStatus();
  }
  std::printf("%-20s %-16s %13s %14s  %s\n", "NAME", "FINGERPRINT", "SPLITS", "BYTES", "JOBS");
  for (const proto::CacheStatus& c : status.caches()) {
    std::string jobs;
    for (uint64_t id : c.job_ids()) absl::StrAppend(&jobs, jobs.empty() ? "" : ",", id);
    std::printf("%-20s %-16s %13s %14llu  %s\n", c.name().c_str(), c.fingerprint().c_str(),
                absl::StrCat(c.splits_committed(), "/", c.splits_total()).c_str(),
                static_cast<unsigned long long>(c.bytes()), jobs.empty() ? "-" : jobs.c_str());
  }
  if (status.cache_budget_bytes() > 0) {
    std::printf("budget: %llu bytes (--cache-budget-bytes)\n",
                static_cast<unsigned long long>(status.cache_budget_bytes()));
  }
  return absl::OkStatus();
}

// Opens the file (header, footer and index checksums), compares what the dispatcher recorded,
// and reads every record (each record's checksum).
absl::Status VerifyFile(const std::string& root, const proto::CacheSplitFile& f) {
  const std::string path = (std::filesystem::path(root) / f.path()).string();
  ASSIGN_OR_RETURN(std::unique_ptr<record::ShardReader> reader, record::ShardReader::Open(path));
  if (reader->record_count() != f.records() || reader->index_checksum() != f.index_checksum() ||
      reader->file_size() != f.bytes()) {
    return absl::DataLossError(
        absl::StrCat(path, ": holds ", reader->record_count(), " records, ", reader->file_size(),
                     " bytes, index checksum ", reader->index_checksum(), "; the commit recorded ",
                     f.records(), ", ", f.bytes(), ", ", f.index_checksum()));
  }
  for (uint64_t i = 0; i < reader->record_count(); ++i) {
    RETURN_IF_ERROR(reader->ReadView(i).status());
  }
  return absl::OkStatus();
}

absl::Status RunVerify(const CacheFlags& f) {
  ASSIGN_OR_RETURN(proto::GetStatusResponse status, Caches(f, /*files=*/true));
  int caches = 0;
  uint64_t files = 0, records = 0;
  bool named = false;
  for (const proto::CacheStatus& c : status.caches()) {
    if (!f.name.empty() && c.name() != f.name) continue;
    named = true;
    ++caches;
    for (const proto::CacheSplitFile& file : c.files()) {
      if (absl::Status s = VerifyFile(f.cache_root, file); !s.ok()) {
        return absl::DataLossError(
            absl::StrCat("cache '", c.name(), "' split ", file.split_id(), ": ", s.message()));
      }
      ++files;
      records += file.records();
    }
  }
  if (!f.name.empty() && !named) {
    return absl::NotFoundError(absl::StrCat("no cache named '", f.name, "'"));
  }
  std::printf("ok: %d cache(s), %llu committed file(s), %llu records read back\n", caches,
              static_cast<unsigned long long>(files), static_cast<unsigned long long>(records));
  return absl::OkStatus();
}

absl::Status RunRemove(const CacheFlags& f) {
  ASSIGN_OR_RETURN(auto stub, Stub(f));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  proto::RemoveCacheRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_name(f.name);
  proto::RemoveCacheResponse response;
  const grpc::Status status = stub->RemoveCache(&context, request, &response);
  if (!status.ok()) return service::FromGrpcStatus(status);
  std::printf(
      "removed cache '%s' (%d fingerprint(s), %llu files, %llu bytes): workers stop reading it "
      "and delete its folder at their next heartbeat\n",
      f.name.c_str(), response.fingerprints_size(),
      static_cast<unsigned long long>(response.files()),
      static_cast<unsigned long long>(response.bytes()));
  return absl::OkStatus();
}

}  // namespace

void AddCacheCommands(CLI::App& app) {
  CLI::App* cache = app.add_subcommand("cache", "Cache nodes' files: list, verify, rm");
  cache->require_subcommand(1);
  auto add = [&](const char* name, const char* help) {
    auto flags = std::make_shared<CacheFlags>();
    CLI::App* cmd = cache->add_subcommand(name, help);
    cmd->add_option("--dispatcher", flags->dispatcher, "Dispatcher host:port")->required();
    service::AddClientSecurityFlags(*cmd, &flags->security);
    return std::make_pair(cmd, flags);
  };
  {
    auto added = add("list", "Caches: name, fingerprint, splits committed/total, bytes");
    CLI::App* cmd = added.first;
    std::shared_ptr<CacheFlags> flags = added.second;
    cmd->add_flag("--json", flags->json, "One JSON object");
    service::SetEnvNames(*cmd);
    cmd->callback([flags] { Finish(RunList(*flags)); });
  }
  {
    auto added = add(
        "verify", "Re-read every committed file and check its checksums; names the first bad one");
    CLI::App* cmd = added.first;
    std::shared_ptr<CacheFlags> flags = added.second;
    cmd->add_option("--cache-root", flags->cache_root, "The workers' --cache-root")->required();
    cmd->add_option("name", flags->name, "Only this cache");
    service::SetEnvNames(*cmd);
    cmd->callback([flags] { Finish(RunVerify(*flags)); });
  }
  {
    auto added = add("rm", "Remove a cache by name (refused while a live job uses it)");
    CLI::App* cmd = added.first;
    std::shared_ptr<CacheFlags> flags = added.second;
    cmd->add_option("name", flags->name, "The cache's name")->required();
    service::SetEnvNames(*cmd);
    cmd->callback([flags] { Finish(RunRemove(*flags)); });
  }
}

}  // namespace sluice::cli
