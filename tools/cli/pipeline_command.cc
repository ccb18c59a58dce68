// sluice pipeline run --spec FILE.yaml [--data DIR] [--epochs E] [--threads N]
//                     [--ids-out FILE] [--allow-python-ops --python-path DIR
//                     --python-modules M,... --python-op-timeout 60s]
// Runs a pipeline in this process (no service), checks every output's dtype
// and shape against what validation inferred from the spec, and reports
// per-stage statistics, the autotuned parallelism and, last,
// `throughput: <N> images/s`.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/pipeline/spec.h"
#include "data_worker/python/python_flags.h"
#include "data_worker/python/python_pool.h"
#include "tools/cli/command.h"
#include "tools/cli/progress.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;
using data_worker::pipeline::Executor;
using data_worker::pipeline::ExecutorOptions;
using data_worker::pipeline::OptimizerOptions;
using data_worker::pipeline::PipelineStats;

struct PipelineFlags {
  std::string spec, data, ids_out, mode = "operator", disable;
  uint64_t epochs = 1;
  uint64_t warmup_epochs = 0;
  int threads = 0;
  int64_t memory_mb = 1024;
  bool no_optimize = false;
  data_worker::python::PythonOptions python;
};

// Points the pipeline's source at `data`: a Unirecord dataset folder or an
// image folder.
absl::Status ReplaceSource(const std::string& data, proto::Pipeline& pipeline) {
  if (!fs::is_directory(data)) {
    return absl::NotFoundError("--data: '" + data + "' is not a folder");
  }
  proto::SourceNode* source = pipeline.mutable_source();
  const std::string path = fs::absolute(data).string();
  if (fs::exists(fs::path(data) / record::kManifestName)) {
    source->mutable_dataset()->set_path(path);
  } else {
    source->mutable_image_folder()->set_path(path);
  }
  return absl::OkStatus();
}

absl::StatusOr<OptimizerOptions> ParseOptimizer(const PipelineFlags& flags) {
  OptimizerOptions o = flags.no_optimize ? OptimizerOptions::None() : OptimizerOptions();
  if (flags.mode == "pipeline") {
    o.pipeline_parallel = true;
  } else if (flags.mode != "operator") {
    return absl::InvalidArgumentError("--mode: '" + flags.mode + "' is not operator or pipeline");
  }
  const std::pair<const char*, bool OptimizerOptions::*> kRewrites[] = {
      {"map_fusion", &OptimizerOptions::map_fusion},
      {"filter_fusion", &OptimizerOptions::filter_fusion},
      {"filter_pushdown", &OptimizerOptions::filter_pushdown},
      {"source_fusion", &OptimizerOptions::source_fusion},
      {"map_batch_fusion", &OptimizerOptions::map_batch_fusion},
      {"vectorization", &OptimizerOptions::vectorization},
      {"op_fusion", &OptimizerOptions::op_fusion},
      {"batch_write_fusion", &OptimizerOptions::batch_write_fusion},
  };
  for (absl::string_view name : absl::StrSplit(flags.disable, ',', absl::SkipEmpty())) {
    bool found = false;
    for (const auto& [rewrite, field] : kRewrites) {
      if (name == rewrite) {
        o.*field = false;
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--disable: unknown rewrite '%s' (map_fusion, filter_fusion, "
                          "filter_pushdown, "
                          "source_fusion, map_batch_fusion, vectorization, op_fusion, "
                          "batch_write_fusion)",
                          name));
    }
  }
  return o;
}

void PrintStats(const PipelineStats& stats) {
  std::printf("plan: %s\n", stats.plan.c_str());
  if (!stats.rewrites.empty()) {
    std::printf("rewrites: %s\n", absl::StrJoin(stats.rewrites, ", ").c_str());
  }
  std::printf("%-32s %7s %10s %8s %11s %12s %12s\n", "stage", "threads", "elements", "dropped",
              "busy s", "ms/element", "peak queue");
  for (const auto& s : stats.stages) {
    std::printf("%-32s %7d %10llu %8llu %11.2f %12.3f %7lld (%.1f MB)\n", s.name.c_str(), s.threads,
                static_cast<unsigned long long>(s.elements),
                static_cast<unsigned long long>(s.dropped), s.busy_seconds,
                s.elements > 0 ? 1e3 * s.busy_seconds / s.elements : 0.0,
                static_cast<long long>(s.peak_queue_items), s.peak_queue_bytes / 1e6);
  }
  std::printf(
      "autotuned parallelism: %d threads at peak; skipped %llu bad records, "
      "filtered %llu\n",
      stats.peak_threads, static_cast<unsigned long long>(stats.skipped),
      static_cast<unsigned long long>(stats.filtered));
}

absl::Status RunPipeline(const PipelineFlags& flags) {
  ASSIGN_OR_RETURN(proto::Pipeline pipeline,
                   sluice::pipeline_spec::LoadPipelineSpecFile(flags.spec));
  if (!flags.data.empty()) RETURN_IF_ERROR(ReplaceSource(flags.data, pipeline));
  if (flags.epochs == 0) return absl::InvalidArgumentError("--epochs must be > 0");
  if (flags.memory_mb <= 0) return absl::InvalidArgumentError("--memory-mb must be > 0");
  data_worker::python::PythonOptions python = flags.python;
  python.max_result_bytes = flags.memory_mb << 20;
  // As many processes as the pipeline's threads start with the pipeline. The interpreter is not
  // checked first (a worker does, at start-up): a run is not a rollout, and a python op whose
  // processes cannot import numpy says so (PythonPool::Call).
  python.warm = data_worker::pipeline::CpuBudgetOrAllCores(flags.threads);
  data_worker::python::ConfigurePython(python);
  // The first batch's latency counts from here: building the pipeline included, as the
  // service's counts from opening the job (bench/first_batch.sh compares the two).
  const absl::Time created = absl::Now();
  ExecutorOptions options;
  ASSIGN_OR_RETURN(options.optimizer, ParseOptimizer(flags));
  options.cpu_budget = flags.threads;
  options.memory_budget_bytes = flags.memory_mb << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<Executor> executor, Executor::Create(pipeline, options));

  std::ofstream ids;
  if (!flags.ids_out.empty()) {
    ids.open(flags.ids_out, std::ios::trunc);
    if (!ids) return absl::InvalidArgumentError("--ids-out: cannot write '" + flags.ids_out + "'");
  }
  uint64_t elements = 0;
  double timed_seconds = 0, timed_cpu = 0, timed_python_cpu = 0;
  // The Python processes' CPU (python ops): read between epochs, when they are
  // all idle.
  const std::shared_ptr<data_worker::python::PythonPool> pool =
      data_worker::python::ConfiguredPythonPool();
  auto python_cpu = [&] { return pool != nullptr ? pool->idle_cpu_seconds() : 0.0; };
  // From the first timed batch on (what bench/service_overhead.sh compares with
  // the service's consume).
  std::optional<absl::Time> first_batch;
  uint64_t first_batch_images = 0;
  double first_batch_cpu = 0;
  const uint64_t total_epochs = flags.warmup_epochs + flags.epochs;
  for (uint64_t epoch = 0; epoch < total_epochs; ++epoch) {
    const bool warmup = epoch < flags.warmup_epochs;
    ProgressBar bar(warmup ? "warmup" : absl::StrFormat("epoch %d", epoch - flags.warmup_epochs),
                    executor->source_size());
    const absl::Time start = absl::Now();
    const double cpu_start = ProcessCpuSeconds();
    const double python_cpu_start = python_cpu();
    RETURN_IF_ERROR(executor->Start(epoch));
    uint64_t epoch_elements = 0;
    while (true) {
      ASSIGN_OR_RETURN(std::optional<data_worker::pipeline::Element> out, executor->GetNext());
      if (!out.has_value()) break;
      RETURN_IF_ERROR(data_worker::pipeline::CheckOutputType(
          executor->logical(), out->columns,
          /*batched=*/executor->logical().batch.has_value()));
      epoch_elements += out->global_indices.size();
      if (!warmup && !first_batch.has_value()) {
        first_batch = absl::Now();
        first_batch_images = out->global_indices.size();
        first_batch_cpu = ProcessCpuSeconds();
      }
      if (!warmup && ids.is_open()) {
        for (uint64_t id : out->global_indices) ids << id << '\n';
      }
      bar.Update(epoch_elements);
    }
    bar.Done();
    if (!warmup) {
      timed_seconds += absl::ToDoubleSeconds(absl::Now() - start);
      timed_cpu += ProcessCpuSeconds() - cpu_start;
      timed_python_cpu += python_cpu() - python_cpu_start;
      elements += epoch_elements;
    }
  }
  PrintStats(executor->stats());
  std::printf("%llu images in %llu epoch(s), %.2fs on %u cores\n",
              static_cast<unsigned long long>(elements),
              static_cast<unsigned long long>(flags.epochs), timed_seconds,
              std::thread::hardware_concurrency());
  // CPU per image: robust to other jobs sharing the machine (wall-clock
  // throughput is not).
  std::printf("cpu: %.0f us/image\n", elements > 0 ? 1e6 * timed_cpu / elements : 0.0);
  if (pool != nullptr && pool->processes_started() > 0) {
    // A process that died (or hung past --python-op-timeout) is replaced and its elements
    // redone: the results are complete, but it costs time, and the user should hear of it.
    std::printf("python processes: %d started, %d replaced\n", pool->processes_started(),
                pool->processes_replaced());
  }
  if (pool != nullptr && timed_python_cpu > 0) {
    // Processes started during the timed epochs count from their start on
    // (numpy's import included); one replaced after a crash loses its share.
    std::printf("python cpu: %.0f us/image\n",
                elements > 0 ? 1e6 * timed_python_cpu / elements : 0.0);
  }
  if (first_batch.has_value()) {
    std::printf("first batch after %.3fs\n", absl::ToDoubleSeconds(*first_batch - created));
    PrintFromFirstBatch(absl::ToDoubleSeconds(absl::Now() - *first_batch),
                        elements - first_batch_images, ProcessCpuSeconds() - first_batch_cpu);
  }
  // Last: scripts and tests read this line.
  std::printf("throughput: %.1f images/s\n", timed_seconds > 0 ? elements / timed_seconds : 0.0);
  return absl::OkStatus();
}

}  // namespace

void AddPipelineCommands(CLI::App& app) {
  CLI::App* pipeline = app.add_subcommand("pipeline", "Run preprocessing pipelines in-process");
  pipeline->require_subcommand(1);
  auto flags = std::make_shared<PipelineFlags>();
  CLI::App* run = pipeline->add_subcommand(
      "run", "Run a pipeline spec in this process and report per-stage statistics");
  run->add_option("--spec", flags->spec, "Pipeline YAML or JSON")->required();
  run->add_option("--data", flags->data,
                  "Unirecord dataset or image folder replacing the spec's source path");
  run->add_option("--epochs", flags->epochs, "Timed epochs")->capture_default_str();
  run->add_option("--warmup-epochs", flags->warmup_epochs,
                  "Untimed epochs first (autotune warms up)")
      ->capture_default_str();
  run->add_option("--threads", flags->threads, "CPU budget in threads (0: all cores)")
      ->capture_default_str();
  run->add_option("--memory-mb", flags->memory_mb, "Bytes the stage queues may hold, in MB")
      ->capture_default_str();
  run->add_option("--ids-out", flags->ids_out,
                  "Write each element's global record index here, one per line");
  run->add_option("--mode", flags->mode,
                  "operator (per-stage threads) | pipeline (whole chain per thread)")
      ->capture_default_str();
  run->add_flag("--no-optimize", flags->no_optimize, "Run the graph as written: no rewrites");
  run->add_option("--disable", flags->disable,
                  "Rewrites to turn off, comma-separated (e.g. vectorization,op_fusion)");
  data_worker::python::AddPythonFlags(*run, &flags->python);
  run->callback([flags] { Finish(RunPipeline(*flags)); });
}

}  // namespace sluice::cli
