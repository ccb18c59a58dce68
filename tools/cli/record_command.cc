// sluice record convert | verify | inspect | cat — tools for Unirecord
// datasets.
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/record/convert/convert.h"
#include "common/record/dataset.h"
#include "tools/cli/command.h"
#include "tools/cli/progress.h"

namespace sluice::cli {
namespace {

using record::Dataset;
using record::DType;

struct ConvertFlags {
  std::string input, output, format = "imagefolder";
  uint64_t shard_size = record::kDefaultShardSizeBytes;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

absl::Status RunConvert(const ConvertFlags& flags) {
  record::ConvertOptions options;
  options.input = flags.input;
  options.output = flags.output;
  ASSIGN_OR_RETURN(options.format, record::ParseInputFormat(flags.format));
  options.shard_size_bytes = flags.shard_size;
  options.threads = flags.threads;
  ProgressBar bar("convert", 0);
  options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  ASSIGN_OR_RETURN(record::Manifest manifest, record::Convert(options));
  bar.Done();
  uint64_t bytes = 0;
  for (const auto& s : manifest.shards) bytes += s.bytes;
  std::printf("wrote %llu records in %zu shard(s), %.1f MB, to %s\n",
              static_cast<unsigned long long>(manifest.total_records), manifest.shards.size(),
              bytes / 1e6, flags.output.c_str());
  return absl::OkStatus();
}

void RunVerify(const std::string& dir) {
  auto manifest =
      record::Manifest::ReadFile((std::filesystem::path(dir) / record::kManifestName).string());
  const std::vector<std::string> problems = record::VerifyDataset(dir);
  for (const std::string& p : problems) std::printf("%s\n", p.c_str());
  if (!problems.empty()) {
    Finish(absl::DataLossError(absl::StrFormat("%d problem(s) in %s", problems.size(), dir)));
    return;
  }
  std::printf("ok: %llu records in %zu shard(s) verified\n",
              static_cast<unsigned long long>(manifest->total_records), manifest->shards.size());
}

std::string Shape(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ",") + "]";
}

absl::Status RunInspect(const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Dataset::Open(dir));
  uint64_t bytes = 0, payload = 0;
  for (const auto& s : ds->manifest().shards) bytes += s.bytes;
  for (size_t i = 0; i < ds->num_shards(); ++i) {
    for (const auto& e : ds->shard(i).index()) payload += e.size;
  }
  std::printf("dataset:  %s\nrecords:  %llu\nshards:   %zu\nbytes:    %llu (%.1f MB)\n",
              dir.c_str(), static_cast<unsigned long long>(ds->size()), ds->num_shards(),
              static_cast<unsigned long long>(bytes), bytes / 1e6);
  std::printf("record:   mean %.1f KB\nschema:\n", payload / 1e3 / ds->size());
  for (const auto& c : ds->schema().columns) {
    std::printf("  %-12s %-8s shape %s%s\n", c.name.c_str(),
                std::string(record::DTypeName(c.dtype)).c_str(), Shape(c.shape).c_str(),
                c.indexed ? "  (indexed)" : "");
  }
  for (size_t i = 0; i < ds->num_shards(); ++i) {
    const auto& info = ds->manifest().shards[i];
    std::printf("  shard %-20s %8llu records %10llu bytes\n", info.file.c_str(),
                static_cast<unsigned long long>(info.records),
                static_cast<unsigned long long>(info.bytes));
  }
  // Histograms of indexed integer columns, from the index alone.
  const auto indexed = ds->shard(0).indexed_columns();
  for (size_t k = 0; k < indexed.size(); ++k) {
    if (ds->schema().columns[ds->schema().ColumnIndex(indexed[k])].dtype == DType::kFloat32)
      continue;
    std::map<int64_t, uint64_t> histogram;
    for (size_t s = 0; s < ds->num_shards(); ++s) {
      for (uint64_t i = 0; i < ds->shard(s).record_count(); ++i)
        ++histogram[ds->shard(s).key(i, k)];
    }
    std::printf("%s histogram (%zu distinct):\n", indexed[k].c_str(), histogram.size());
    for (const auto& [value, count] : histogram) {
      std::printf("  %6lld %8llu\n", static_cast<long long>(value),
                  static_cast<unsigned long long>(count));
    }
  }
  return absl::OkStatus();
}

std::string Describe(const record::ColumnSpec& spec, const record::TensorView& v) {
  switch (spec.dtype) {
    case DType::kString:
      return "\"" + std::string(v.data) + "\"";
    case DType::kBytes: {
      std::string hex;
      for (size_t i = 0; i < std::min<size_t>(16, v.data.size()); ++i) {
        hex += absl::StrFormat("%02x", static_cast<uint8_t>(v.data[i]));
      }
      return absl::StrFormat("%d bytes: %s%s", v.data.size(), hex, v.data.size() > 16 ? "..." : "");
    }
    case DType::kInt64:
      if (v.shape.empty()) return std::to_string(v.AsInt64());
      [[fallthrough]];
    default:
      return absl::StrFormat("%s %s, %d bytes", record::DTypeName(spec.dtype), Shape(v.shape),
                             v.data.size());
  }
}

absl::Status RunCat(const std::string& dir, uint64_t index, const std::string& column) {
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Dataset::Open(dir));
  ASSIGN_OR_RETURN(record::Record r, ds->Read(index));
  const record::Schema& schema = ds->schema();
  if (!column.empty()) {
    const int c = schema.ColumnIndex(column);
    if (c < 0) return absl::InvalidArgumentError("--column: no column '" + column + "' in " + dir);
    // Raw bytes, so `sluice record cat DS --index 3 --column image > x.jpg`
    // works.
    std::fwrite(r.columns[c].data.data(), 1, r.columns[c].data.size(), stdout);
    if (schema.columns[c].dtype == DType::kString && isatty(fileno(stdout))) std::printf("\n");
    return absl::OkStatus();
  }
  std::printf("record %llu of %s\n", static_cast<unsigned long long>(index), dir.c_str());
  for (size_t c = 0; c < schema.columns.size(); ++c) {
    std::printf("  %-12s %s\n", schema.columns[c].name.c_str(),
                Describe(schema.columns[c], r.columns[c]).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

void AddRecordCommands(CLI::App& app) {
  CLI::App* record = app.add_subcommand("record", "Unirecord dataset tools");
  record->require_subcommand(1);

  auto convert = std::make_shared<ConvertFlags>();
  CLI::App* c = record->add_subcommand("convert",
                                       "Convert an ImageFolder tree, TFRecord "
                                       "files or WebDataset tars to Unirecord");
  c->add_option("--input", convert->input, "Input folder, file or tar")->required();
  c->add_option("--output", convert->output, "Dataset folder to create")->required();
  c->add_option("--format", convert->format, "imagefolder | tfrecord | wds")->capture_default_str();
  c->add_option("--shard-size", convert->shard_size, "Shard size limit in bytes")
      ->capture_default_str();
  c->add_option("--threads", convert->threads, "Reader threads")->capture_default_str();
  c->callback([convert] { Finish(RunConvert(*convert)); });

  auto dir = std::make_shared<std::string>();
  CLI::App* v = record->add_subcommand("verify",
                                       "Check every checksum; one line per "
                                       "problem (shard file and record index)");
  v->add_option("DIR", *dir, "Dataset folder")->required();
  v->callback([dir] { RunVerify(*dir); });

  CLI::App* i = record->add_subcommand("inspect", "Schema, record count, sizes, label histogram");
  i->add_option("DIR", *dir, "Dataset folder")->required();
  i->callback([dir] { Finish(RunInspect(*dir)); });

  auto index = std::make_shared<uint64_t>(0);
  auto column = std::make_shared<std::string>();
  CLI::App* cat = record->add_subcommand("cat",
                                         "Print one record; with --column, write that "
                                         "column's raw bytes to stdout");
  cat->add_option("DIR", *dir, "Dataset folder")->required();
  cat->add_option("--index", *index, "Global record index")->required();
  cat->add_option("--column", *column, "Column whose raw bytes to write");
  cat->callback([dir, index, column] { Finish(RunCat(*dir, *index, *column)); });
}

}  // namespace sluice::cli
