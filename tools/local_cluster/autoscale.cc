#include "tools/local_cluster/autoscale.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"
#include "common/service/protocol.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/dispatcher.grpc.pb.h"

namespace sluice::tools {
namespace {

using Json = nlohmann::ordered_json;  // keys in the documented order

// A rate or fraction as `sluice status --json` has always printed it: 6
// significant digits, a whole number without a fraction ("821", not "821.0").
// The one textual change from the hand-written emitter: a value of 10^6 or
// more is written out (1234570, the same number as its old "1.23457e+06").
// NaN and infinities, which JSON cannot carry, are null (they were "nan").
Json Number(double v) {
  if (!std::isfinite(v)) return nullptr;
  const double rounded = std::strtod(absl::StrFormat("%.6g", v).c_str(), nullptr);
  if (std::trunc(rounded) == rounded && std::fabs(rounded) < 1e15)
    return static_cast<int64_t>(rounded);
  return rounded;
}

}  // namespace

absl::StatusOr<proto::GetStatusResponse> FetchStatus(const std::string& address,
                                                     int starting_workers, absl::Duration timeout,
                                                     const service::ChannelOptions& security) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   service::CreateChannel(address, security));
  auto stub = proto::DispatcherService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  proto::GetStatusRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_starting_workers(starting_workers);
  proto::GetStatusResponse response;
  const grpc::Status status = stub->GetStatus(&context, request, &response);
  if (!status.ok()) {
    absl::Status s = service::FromGrpcStatus(status);
    return absl::Status(s.code(), absl::StrCat("GetStatus from ", address, ": ", s.message()));
  }
  return response;
}

namespace {

Json CachesJson(const proto::GetStatusResponse& s) {
  Json caches = Json::array();
  for (const proto::CacheStatus& c : s.caches()) {
    caches.push_back({{"name", c.name()},
                      {"fingerprint", c.fingerprint()},
                      {"splits_committed", c.splits_committed()},
                      {"splits_total", c.splits_total()},
                      {"bytes", c.bytes()},
                      {"job_ids", std::vector<uint64_t>(c.job_ids().begin(), c.job_ids().end())}});
  }
  return caches;
}

}  // namespace

std::string CachesJsonText(const proto::GetStatusResponse& s) {
  return Json({{"caches", CachesJson(s)}, {"cache_budget_bytes", s.cache_budget_bytes()}})
      .dump(/*indent=*/-1, /*indent_char=*/' ', /*ensure_ascii=*/false,
            Json::error_handler_t::replace);
}

std::string StatusJson(const proto::GetStatusResponse& s) {
  Json workers = Json::array();
  for (const proto::WorkerStatus& w : s.workers()) {
    workers.push_back({{"worker_id", w.worker_id()},
                       {"address", w.address()},
                       {"state", w.state()},
                       {"splits", w.splits()},
                       {"queue_depth", w.queue_depth()},
                       {"queue_capacity", w.queue_capacity()},
                       {"elements_per_second", Number(w.elements_per_second())},
                       {"elements_per_busy_second", Number(w.elements_per_busy_second())},
                       {"age_seconds", Number(w.age_seconds())},
                       {"assigned_job_id", w.assigned_job_id()}});
  }
  Json jobs = Json::array();
  for (const proto::JobStatus& j : s.jobs()) {
    Json consumers = Json::array();
    for (const proto::ConsumerStatus& c : j.consumers()) {
      consumers.push_back({{"consumer_index", c.consumer_index()},
                           {"epoch", c.epoch()},
                           {"finished", c.finished()},
                           {"splits_done", c.splits_done()},
                           {"splits", c.splits()},
                           {"batches_per_second", Number(c.batches_per_second())},
                           {"wait_fraction", Number(c.wait_fraction())},
                           {"paused", c.paused()},
                           {"silent_seconds", Number(c.silent_seconds())}});
    }
    // `cache: auto` (docs/cache.md): null for a job without it.
    Json cache_decision = nullptr;
    if (j.has_cache_decision()) {
      const proto::CacheDecision& d = j.cache_decision();
      cache_decision = {{"decided", d.decided()},
                        {"cache", d.cache()},
                        {"after_node", d.after_node()},
                        {"name", d.name()},
                        {"fingerprint", d.fingerprint()},
                        {"estimated_bytes", d.estimated_bytes()},
                        {"cpu_seconds_saved_per_epoch", Number(d.cpu_seconds_saved_per_epoch())},
                        {"records_measured", d.records_measured()},
                        {"from_epoch", d.from_epoch()},
                        {"reason", d.reason()}};
    }
    jobs.push_back(
        {{"job_id", j.job_id()},
         {"job_name", j.job_name()},
         {"batch_size", j.batch_size()},
         {"num_epochs", j.num_epochs()},
         {"demand_elements_per_second", Number(j.demand_elements_per_second())},
         {"capacity_elements_per_second", Number(j.capacity_elements_per_second())},
         {"need_workers", Number(j.need_workers())},
         {"priority", j.priority()},
         {"min_workers", j.min_workers()},
         {"allocated_workers", Number(j.allocated_workers())},
         {"allocation_reason", j.allocation_reason()},
         {"share_group", j.share_group()},
         {"shares_with", std::vector<uint64_t>(j.shares_with().begin(), j.shares_with().end())},
         {"cache_decision", std::move(cache_decision)},
         {"consumers", std::move(consumers)}});
  }
  const Json status = {{"workers", std::move(workers)},
                       {"desired_workers", s.desired_workers()},
                       {"current_workers", s.current_workers()},
                       {"reason", s.reason()},
                       {"scaler", s.scaler()},
                       {"min_workers", s.min_workers()},
                       {"max_workers", s.max_workers()},
                       {"pool_bound", s.pool_bound()},
                       {"drain", std::vector<uint64_t>(s.drain().begin(), s.drain().end())},
                       {"jobs", std::move(jobs)}};
  // Bytes that are not UTF-8 (a job name is the client's) become U+FFFD
  // instead of an exception.
  return status.dump(/*indent=*/-1, /*indent_char=*/' ', /*ensure_ascii=*/false,
                     Json::error_handler_t::replace);
}

namespace {

// A client's text (a job name) as part of one terminal line: control characters (an escape
// sequence, a newline) as \xNN and a backslash doubled; other bytes, UTF-8 included, as they are.
std::string ForTerminal(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", byte);
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string StatusText(const proto::GetStatusResponse& s) {
  std::string out = absl::StrFormat(
      "workers: %d current, %d desired (scaler %s, min %d, max %d)\n  why: "
      "%s\n",
      s.current_workers(), s.desired_workers(), s.scaler(), s.min_workers(), s.max_workers(),
      s.reason());
  absl::StrAppendFormat(&out, "\n%-6s %-22s %-9s %6s %9s %10s %10s\n", "ID", "ADDRESS", "STATE",
                        "SPLITS", "QUEUE", "EL/S", "EL/BUSY-S");
  for (const proto::WorkerStatus& w : s.workers()) {
    absl::StrAppendFormat(&out, "%-6d %-22s %-9s %6d %4d/%-4d %10.1f %10.1f\n", w.worker_id(),
                          w.address(), w.state(), w.splits(), w.queue_depth(), w.queue_capacity(),
                          w.elements_per_second(), w.elements_per_busy_second());
  }
  for (const proto::JobStatus& j : s.jobs()) {
    absl::StrAppendFormat(&out,
                          "\njob %d '%s' (batch %d, %s): demand %.1f el/s, %.1f el/s per "
                          "worker, need %.2f workers\n",
                          j.job_id(), ForTerminal(j.job_name()), j.batch_size(),
                          j.num_epochs() == 0 ? std::string("epochs: forever")
                                              : absl::StrCat("epochs: ", j.num_epochs()),
                          j.demand_elements_per_second(), j.capacity_elements_per_second(),
                          j.need_workers());
    if (j.share_group() != 0) {
      absl::StrAppendFormat(
          &out, "  sharing auto (group %016x): %s\n", j.share_group(),
          j.shares_with().empty()
              ? std::string("no other job shares its production now")
              : absl::StrCat("shares production with jobs ", absl::StrJoin(j.shares_with(), ", ")));
    }
    if (s.pool_bound()) {
      absl::StrAppendFormat(&out, "  allocated %.2f workers (priority %d, min_workers %d): %s\n",
                            j.allocated_workers(), j.priority(), j.min_workers(),
                            j.allocation_reason());
      std::vector<uint64_t> assigned;
      for (const proto::WorkerStatus& w : s.workers()) {
        if (w.assigned_job_id() == j.job_id()) assigned.push_back(w.worker_id());
      }
      if (!assigned.empty()) {
        absl::StrAppend(&out, "  served first by worker(s) ", absl::StrJoin(assigned, ", "), "\n");
      }
    }
    if (j.has_cache_decision()) {
      const proto::CacheDecision& d = j.cache_decision();
      absl::StrAppendFormat(&out, "  cache auto: %s%s\n",
                            !d.decided() ? ""
                            : d.cache()  ? absl::StrFormat("from epoch %d, ", d.from_epoch())
                                         : std::string("no cache: "),
                            d.reason());
    }
    if (!j.cache().empty()) absl::StrAppendFormat(&out, "  %s\n", j.cache());
    absl::StrAppendFormat(&out, "  %-9s %6s %12s %10s %8s\n", "CONSUMER", "EPOCH", "PROGRESS",
                          "BATCHES/S", "WAIT");
    for (const proto::ConsumerStatus& c : j.consumers()) {
      absl::StrAppendFormat(
          &out, "  %-9d %6d %12s %10.2f %7.1f%%%s%s\n", c.consumer_index(), c.epoch(),
          c.finished() ? std::string("finished") : absl::StrCat(c.splits_done(), "/", c.splits()),
          c.batches_per_second(), 100 * c.wait_fraction(),
          c.paused() ? "  paused (reads nothing: its slot frees its worker)" : "",
          c.silent_seconds() > 0
              ? absl::StrFormat("  silent %.0fs (no heartbeat: counted as no demand)",
                                c.silent_seconds())
              : "");
    }
  }
  return out;
}

absl::StatusOr<AutoscaleStep> LocalAutoscaler::Step() {
  AutoscaleStep step;
  step.exited = cluster_->ReapExitedWorkers();
  // Workers that are not registered yet: the dispatcher counts them as
  // current, so it does not ask for them twice.
  absl::StatusOr<proto::GetStatusResponse> status = FetchStatus(cluster_->dispatcher_address());
  if (!status.ok()) return status.status();
  std::set<std::string> registered, draining;
  for (const proto::WorkerStatus& w : status->workers()) {
    registered.insert(w.address());
    if (w.state() == "draining") draining.insert(w.address());
  }
  int starting = 0;
  for (int i = 0; i < cluster_->num_workers(); ++i) {
    const std::string& address = cluster_->worker(i).address;
    if (!registered.contains(address)) ++starting;
    if (draining.contains(address)) ++step.draining;
  }
  ASSIGN_OR_RETURN(*status, FetchStatus(cluster_->dispatcher_address(), starting));
  step.live = cluster_->num_workers();
  step.desired = status->desired_workers();
  step.reason = status->reason();
  const int active = step.live - step.draining;
  const int want = std::min(step.desired, max_workers_);
  for (int i = active; i < want; ++i) {
    RETURN_IF_ERROR(cluster_->AddWorker().status());
    ++step.started;
  }
  return step;
}

}  // namespace sluice::tools
