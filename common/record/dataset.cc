#include "common/record/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/process.h"
#include "common/base/status_macros.h"
#include "common/record/checksum.h"
#include "common/record/json.h"

namespace sluice::record {
namespace fs = std::filesystem;
namespace {

// The manifest without its checksum field, serialized compactly with sorted
// keys.
nlohmann::json ManifestBody(const Manifest& m) {
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& s : m.shards) {
    shards.push_back({{"file", s.file},
                      {"records", s.records},
                      {"bytes", s.bytes},
                      {"index_checksum", ChecksumHex(s.index_checksum)}});
  }
  return {{"format", "unirecord"},
          {"version", kShardFormatVersion},
          {"schema", nlohmann::json::parse(m.schema.ToJson())},
          {"total_records", m.total_records},
          {"shards", shards}};
}

absl::StatusOr<uint64_t> ParseHex(const nlohmann::json& v) {
  if (!v.is_string()) return absl::InvalidArgumentError("not a string");
  const std::string s = v.get<std::string>();
  uint64_t out = 0;
  if (s.size() != 16 || !absl::SimpleHexAtoi(s, &out)) {
    return absl::InvalidArgumentError("not 16 hex digits");
  }
  return out;
}

}  // namespace

absl::Status CheckInsideFolder(const std::string& dir, const std::string& path) {
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(dir, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("dataset folder '", dir, "': ", ec.message()));
  }
  const fs::path resolved = fs::weakly_canonical(path, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("'", path, "': ", ec.message()));
  }
  const fs::path relative = resolved.lexically_relative(folder);
  if (relative.empty() || *relative.begin() == "..") {
    return absl::PermissionDeniedError(absl::StrCat(
        "'", path, "' resolves to '", resolved.string(), "', outside its dataset folder '",
        folder.string(), "' (a symlink out of the dataset is refused)"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Manifest

std::string Manifest::ToJson() const {
  nlohmann::json body = ManifestBody(*this);
  const uint64_t checksum = Checksum(body.dump());
  body["checksum"] = ChecksumHex(checksum);
  return body.dump(/*indent=*/2) + "\n";
}

absl::StatusOr<Manifest> Manifest::FromJson(std::string_view json, const std::string& source) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("manifest '", source, "': ", what));
  };
  const auto parsed = ParseJson(json);
  if (parsed.is_discarded()) return bad("not valid JSON");
  if (!parsed.is_object()) return bad("not a JSON object");
  if (!parsed.contains("format") || parsed["format"] != "unirecord") {
    return bad("'format' is not \"unirecord\"");
  }
  if (!parsed.contains("checksum")) return bad("no 'checksum'");
  auto stored_checksum = ParseHex(parsed["checksum"]);
  if (!stored_checksum.ok()) return bad("'checksum' is not 16 hex digits");
  if (!parsed.contains("version") || !parsed["version"].is_number_unsigned()) {
    return bad("no unsigned 'version'");
  }
  if (parsed["version"].get<uint64_t>() != kShardFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("manifest '", source, "' has format version ", parsed["version"].dump(),
                     "; this build reads version ", kShardFormatVersion));
  }
  if (!parsed.contains("schema") || !parsed.contains("shards") || !parsed["shards"].is_array() ||
      !parsed.contains("total_records") || !parsed["total_records"].is_number_unsigned()) {
    return bad("needs 'schema', a 'shards' array and an unsigned 'total_records'");
  }
  Manifest m;
  auto schema = Schema::FromJson(parsed["schema"].dump());
  if (!schema.ok()) return bad(std::string(schema.status().message()));
  m.schema = *std::move(schema);
  m.total_records = parsed["total_records"].get<uint64_t>();
  uint64_t sum = 0;
  for (const auto& s : parsed["shards"]) {
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("records") ||
        !s["records"].is_number_unsigned() || !s.contains("bytes") ||
        !s["bytes"].is_number_unsigned() || !s.contains("index_checksum")) {
      return bad(
          "a shard entry needs 'file', 'records', 'bytes' and "
          "'index_checksum'");
    }
    ShardInfo info;
    info.file = s["file"].get<std::string>();
    const fs::path file_path(info.file);
    if (info.file.empty() || file_path.is_absolute() || file_path.has_parent_path() ||
        info.file == "." || info.file == "..") {
      return bad("shard file '" + info.file + "' must be a plain file name inside the dataset");
    }
    info.records = s["records"].get<uint64_t>();
    info.bytes = s["bytes"].get<uint64_t>();
    auto index_checksum = ParseHex(s["index_checksum"]);
    if (!index_checksum.ok()) return bad("shard '" + info.file + "': bad 'index_checksum'");
    info.index_checksum = *index_checksum;
    sum += info.records;
    m.shards.push_back(std::move(info));
  }
  if (Checksum(ManifestBody(m).dump()) != *stored_checksum) {
    return bad("checksum mismatch: the manifest was modified or corrupted");
  }
  if (sum != m.total_records) {
    return bad(
        absl::StrCat("shards hold ", sum, " records but 'total_records' says ", m.total_records));
  }
  return m;
}

absl::StatusOr<Manifest> Manifest::ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("no manifest at '", path, "': is this a Unirecord dataset folder?"));
  }
  std::stringstream content;
  content << in.rdbuf();
  return FromJson(content.str(), path);
}

// ---------------------------------------------------------------------------------------------
// DatasetWriter

absl::StatusOr<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(const std::string& dir,
                                                                     const Schema& schema,
                                                                     Options options) {
  RETURN_IF_ERROR(schema.Validate());
  if (options.shard_size_bytes == 0) {
    return absl::InvalidArgumentError("--shard-size must be > 0");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError("cannot create '" + dir + "': " + ec.message());
  if (fs::exists(fs::path(dir) / kManifestName)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", dir, "' already holds a dataset (", kManifestName, "); remove it first"));
  }
  return std::unique_ptr<DatasetWriter>(new DatasetWriter(dir, schema, options));
}

absl::Status DatasetWriter::Add(const std::vector<Tensor>& values) {
  ASSIGN_OR_RETURN(std::string encoded, EncodeRecord(schema_, values));
  // Index entry (24 bytes + 8 per indexed column) is small next to the limit;
  // it is counted by projected_size() once the record is in.
  if (shard_ != nullptr && shard_->record_count() > 0 &&
      shard_->projected_size() + encoded.size() + 64 > options_.shard_size_bytes) {
    RETURN_IF_ERROR(CloseShard());
  }
  if (shard_ == nullptr) {
    const std::string file = absl::StrFormat("shard-%05d.urec", shards_.size());
    ASSIGN_OR_RETURN(shard_, ShardWriter::Create((fs::path(dir_) / file).string(), schema_));
  }
  RETURN_IF_ERROR(shard_->AddEncoded(encoded));
  ++total_records_;
  return absl::OkStatus();
}

absl::Status DatasetWriter::CloseShard() {
  RETURN_IF_ERROR(shard_->Finish());
  shards_.push_back({fs::path(shard_->path()).filename().string(), shard_->record_count(),
                     static_cast<uint64_t>(fs::file_size(shard_->path())),
                     shard_->index_checksum()});
  shard_.reset();
  return absl::OkStatus();
}

absl::StatusOr<Manifest> DatasetWriter::Finish() {
  if (total_records_ == 0) {
    return absl::InvalidArgumentError("no records were written to '" + dir_ + "'");
  }
  if (shard_ != nullptr) RETURN_IF_ERROR(CloseShard());
  Manifest manifest{schema_, shards_, total_records_};
  RETURN_IF_ERROR(
      WriteFileAtomically((fs::path(dir_) / kManifestName).string(), manifest.ToJson()));
  return manifest;
}

// ---------------------------------------------------------------------------------------------
// Dataset

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const std::string& dir) {
  if (!fs::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat("dataset folder '", dir, "' does not exist"));
  }
  ASSIGN_OR_RETURN(Manifest manifest, Manifest::ReadFile((fs::path(dir) / kManifestName).string()));
  if (manifest.total_records == 0) {
    return absl::InvalidArgumentError(absl::StrCat("dataset '", dir, "' is empty (0 records)"));
  }
  auto dataset = std::unique_ptr<Dataset>(new Dataset(dir, std::move(manifest)));
  uint64_t start = 0;
  for (const ShardInfo& info : dataset->manifest_.shards) {
    const std::string path = (fs::path(dir) / info.file).string();
    if (!fs::exists(path)) {
      return absl::NotFoundError(absl::StrCat("dataset '", dir, "': shard '", info.file,
                                              "' named in the manifest is missing"));
    }
    // A shard must stay inside its folder also through symlinks: a dataset
    // under a worker's --data-root must not make it read files outside.
    RETURN_IF_ERROR(CheckInsideFolder(dir, path));
    ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> shard, ShardReader::Open(path));
    if (shard->record_count() != info.records || shard->index_checksum() != info.index_checksum) {
      return absl::DataLossError(absl::StrCat("shard '", path, "' does not match the manifest (",
                                              shard->record_count(), " records, manifest says ",
                                              info.records, "; or its index changed)"));
    }
    if (!(shard->schema() == dataset->manifest_.schema)) {
      return absl::DataLossError("shard '" + path + "' has a different schema than the manifest");
    }
    dataset->starts_.push_back(start);
    start += info.records;
    dataset->shards_.push_back(std::move(shard));
  }
  return dataset;
}

std::pair<size_t, uint64_t> Dataset::Locate(uint64_t global) const {
  const size_t shard =
      std::upper_bound(starts_.begin(), starts_.end(), global) - starts_.begin() - 1;
  return {shard, global - starts_[shard]};
}

absl::Status Dataset::CheckIndex(uint64_t global) const {
  if (global < size()) return absl::OkStatus();
  return absl::OutOfRangeError(
      absl::StrCat("record ", global, " is past the end of '", dir_, "' (", size(), " records)"));
}

absl::StatusOr<std::string_view> Dataset::ReadView(uint64_t global) const {
  RETURN_IF_ERROR(CheckIndex(global));
  const auto [shard, local] = Locate(global);
  return shards_[shard]->ReadView(local);
}

absl::StatusOr<std::string> Dataset::ReadEncoded(uint64_t global) const {
  RETURN_IF_ERROR(CheckIndex(global));
  const auto [shard, local] = Locate(global);
  return shards_[shard]->ReadEncoded(local);
}

absl::StatusOr<Record> Dataset::Read(uint64_t global) const {
  RETURN_IF_ERROR(CheckIndex(global));
  const auto [shard, local] = Locate(global);
  return shards_[shard]->Read(local);
}

std::vector<std::string> VerifyDataset(const std::string& dir) {
  std::vector<std::string> problems;
  auto manifest = Manifest::ReadFile((fs::path(dir) / kManifestName).string());
  if (!manifest.ok()) return {std::string(manifest.status().message())};
  for (const ShardInfo& info : manifest->shards) {
    const std::string path = (fs::path(dir) / info.file).string();
    auto shard = ShardReader::Open(path);
    if (!shard.ok()) {
      problems.push_back(std::string(shard.status().message()));
      continue;
    }
    if ((*shard)->record_count() != info.records ||
        (*shard)->index_checksum() != info.index_checksum) {
      problems.push_back(absl::StrCat("shard '", path, "': does not match the manifest (",
                                      (*shard)->record_count(), " records, manifest says ",
                                      info.records, "; or its index changed)"));
    }
    for (uint64_t i = 0; i < (*shard)->record_count(); ++i) {
      auto record = (*shard)->Read(i);
      if (!record.ok()) problems.push_back(std::string(record.status().message()));
    }
  }
  return problems;
}

}  // namespace sluice::record
