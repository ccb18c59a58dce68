#include "data_worker/pipeline/executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/random.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "common/record/sharding.h"
#include "data_worker/pipeline/run_stream.h"
#include "data_worker/python/python_pool.h"

namespace sluice::data_worker::pipeline {

int CpuBudgetOrAllCores(int threads) {
  return threads > 0 ? threads
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

Executor::Executor(LogicalPipeline logical, PhysicalPlan plan, ExecutorOptions options)
    : logical_(std::move(logical)), plan_(std::move(plan)), options_(options) {
  clock_ = options_.clock != nullptr ? options_.clock : RealClock::Get();
  cpu_budget_ = CpuBudgetOrAllCores(options_.cpu_budget);
  if (options_.registry != nullptr) {
    auto& r = *options_.registry;
    metrics_ = std::make_unique<ExecutorMetrics>();
    for (const StagePlan& s : plan_.stages) {
      const MetricLabels l = {{"stage", s.name}};
      metrics_->stages.push_back(ExecutorMetrics::Stage{
          &AddCounter(r, "sluice_pipeline_stage_elements_total", "Elements processed by a stage.",
                      l),
          &AddCounter(r, "sluice_pipeline_stage_busy_seconds_total",
                      "Thread-seconds a stage spent processing elements.", l),
          &AddGauge(r, "sluice_pipeline_stage_queue_depth", "Elements in a stage's output queue.",
                    l),
          &AddHistogram(r, "sluice_pipeline_stage_latency_seconds",
                        "Time one element spends in a stage's steps.", LatencyBuckets(), l)});
      for (const Step& st : s.steps) {
        if (st.kind != Step::kMap) continue;
        for (const auto& op : st.map.ops) {
          const std::string name(op->name());
          if (metrics_->ops.count(name)) continue;
          metrics_->ops[name] =
              &AddHistogram(r, "sluice_op_seconds", "Time of one op on one element.",
                            LatencyBuckets(), {{"op", name}});
        }
      }
    }
    metrics_->skipped = &AddCounter(r, "sluice_pipeline_skipped_records_total",
                                    "Bad records dropped with on_error=skip.");
  }
  if (!plan_.source_filters.empty() && logical_.source->dataset() != nullptr) {
    index_mask_.assign(logical_.source->size(), true);
    for (const record::Filter& f : plan_.source_filters) {
      std::vector<bool> keep(logical_.source->size(), false);
      for (uint64_t g : f.Select(*logical_.source->dataset())) keep[g] = true;
      for (size_t i = 0; i < keep.size(); ++i) index_mask_[i] = index_mask_[i] && keep[i];
    }
  }
}

Executor::~Executor() { Stop(); }

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const proto::Pipeline& spec,
                                                           ExecutorOptions options) {
  ASSIGN_OR_RETURN(LogicalPipeline lp, Validate(spec));
  lp.seed = JobPipelineSeed(lp.seed, options.job_seed);
  // The plan's python ops share one set of processes, this pipeline's alone.
  const python::PipelineOwnerScope python_owner;
  ASSIGN_OR_RETURN(PhysicalPlan plan, Optimize(lp, options.optimizer));
  return std::unique_ptr<Executor>(new Executor(std::move(lp), std::move(plan), options));
}

std::vector<uint64_t> Executor::EpochOrder(uint64_t epoch) const {
  const uint64_t n = logical_.source->size();
  if (logical_.shuffle) {
    return record::Permutation(n, logical_.shuffle_seed, epoch);
  }
  std::vector<uint64_t> order(n);
  for (uint64_t i = 0; i < n; ++i) order[i] = i;
  return order;
}

absl::Status Executor::Start(uint64_t epoch) { return Start(EpochOrder(epoch), epoch); }

absl::Status Executor::Start(std::vector<uint64_t> global_indices, uint64_t epoch) {
  RETURN_IF_ERROR(Open());
  const absl::StatusOr<uint64_t> run = Submit(std::move(global_indices), epoch);
  if (!run.ok()) {
    Stop();
    return run.status();
  }
  absl::MutexLock lock(&mu_);
  run_->CloseFeed();
  return absl::OkStatus();
}

absl::Status Executor::Open() {
  Stop();
  EpochContext ctx;
  ctx.logical = &logical_;
  ctx.plan = &plan_;
  ctx.metrics = metrics_.get();
  ctx.clock = clock_;
  ctx.live = &live_;
  ctx.cpu_budget = cpu_budget_.load();
  ctx.live_cpu_budget = &cpu_budget_;
  ctx.memory_budget_bytes = options_.memory_budget_bytes;
  ctx.autotune = options_.autotune;
  ctx.autotune_interval = options_.autotune_interval;
  ctx.thread_starts = &thread_starts_;
  ctx.budget = options_.worker_budget;
  ctx.cache = options_.cache.get();
  ctx.pool = &pool_;
  auto run = std::make_unique<RunStream>(ctx);
  const int ns = static_cast<int>(plan_.stages.size());
  // Initial threads: the spec's count, or 1 per AUTOTUNE stage (autotune grows
  // them), or an even share of the budget when autotune is off.
  int fixed = 0, tunable = 0;
  for (const StagePlan& s : plan_.stages) {
    if (s.parallelism == kAutotune) {
      ++tunable;
    } else {
      fixed += s.parallelism;
    }
  }
  const int even = tunable > 0 ? std::max(1, (cpu_budget_.load() - fixed) / tunable) : 1;
  std::vector<int> tuned;
  {
    absl::MutexLock lock(&mu_);
    tuned = tuned_threads_;
  }
  std::vector<int> threads(ns);
  for (int i = 0; i < ns; ++i) {
    const int p = plan_.stages[i].parallelism;
    threads[i] = p != kAutotune ? p : (options_.autotune ? 1 : even);
    if (p == kAutotune && options_.autotune && tuned.size() == plan_.stages.size()) {
      threads[i] = std::max(1, tuned[i]);
    }
  }
  run->Start(threads,
             /*autotuner=*/(options_.autotune && tunable > 0) || metrics_ != nullptr);
  absl::MutexLock lock(&mu_);
  run_ = std::move(run);
  unfinished_runs_.clear();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Executor::Submit(std::vector<uint64_t> global_indices, uint64_t epoch) {
  const uint64_t n = logical_.source->size();
  std::vector<uint64_t> indices;
  indices.reserve(global_indices.size());
  for (uint64_t g : global_indices) {
    if (g >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("global index ", g, " is out of range: the source has ", n, " records"));
    }
    if (index_mask_.empty() || index_mask_[g]) indices.push_back(g);
  }
  absl::MutexLock lock(&mu_);
  if (run_ == nullptr || run_->stopped) {
    return absl::FailedPreconditionError("Submit before Open");
  }
  const uint64_t id = next_run_id_++;
  unfinished_runs_.push_back(id);
  run_->Submit(id, std::move(indices), epoch);
  return id;
}

void Executor::CancelRun(uint64_t run) {
  absl::MutexLock lock(&mu_);
  if (run_ != nullptr && !run_->stopped) run_->CancelRun(run);
}

bool Executor::FeedIdle() const {
  absl::MutexLock lock(&mu_);
  return run_ == nullptr || run_->stopped || run_->FeedIdle();
}

absl::StatusOr<std::optional<Element>> Executor::Next() {
  RunStream* run;
  uint64_t current;
  {
    absl::MutexLock lock(&mu_);
    run = run_.get();
    if (run == nullptr || run->stopped) {
      return absl::FailedPreconditionError("Next before Open");
    }
    if (unfinished_runs_.empty()) {
      return absl::FailedPreconditionError("Next without a submitted run");
    }
    current = unfinished_runs_.front();
  }
  ItemQueue& out = run->output();
  while (true) {
    Item item;
    uint64_t seq = 0;
    if (out.Pop(&item, &seq) != ItemQueue::PopResult::kItem) {
      // Cancelled: the feed never closes while runs are unfinished.
      return absl::CancelledError("the executor was stopped");
    }
    run->Popped();
    if (item.is_hole()) continue;
    if (!item.status().ok()) {
      if (run->skipping) continue;  // the run's first error was reported
      // The rest of the run is dropped: the feed stops giving its records and
      // its outputs up to its marker are skipped.
      run->skipping = true;
      CancelRun(current);
      return item.status();
    }
    std::unique_ptr<Element> e = item.Take();
    if (e->end_of_run) {
      run->skipping = false;
      absl::MutexLock lock(&mu_);
      unfinished_runs_.pop_front();
      return std::optional<Element>();
    }
    if (run->skipping) continue;
    run->elements_out += e->global_indices.size();
    if (plan_.stages.back().batch) ++run->batches_out;
    return std::optional<Element>(std::move(*e));
  }
}

absl::StatusOr<std::optional<Element>> Executor::GetNext() {
  {
    absl::MutexLock lock(&mu_);
    if (run_ == nullptr) return absl::FailedPreconditionError("GetNext before Start");
    if (run_->done) return std::optional<Element>();
  }
  absl::StatusOr<std::optional<Element>> next = Next();
  if (next.ok() && next->has_value()) return next;
  // The end of the epoch's one run, its error, or the stop.
  {
    absl::MutexLock lock(&mu_);
    run_->done = true;
  }
  Stop();
  if (absl::IsFailedPrecondition(next.status())) {
    return absl::CancelledError("the epoch was stopped");
  }
  return next;
}

void Executor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (run_ == nullptr) return;
    if (run_->stopped) return;
    run_->stopped = true;
  }
  RunStream* r;
  {
    absl::MutexLock lock(&mu_);
    r = run_.get();
  }
  r->Cancel();
  r->Join();
  PipelineStats st = CollectStats(*r);
  r->Clear();
  absl::MutexLock lock(&mu_);
  tuned_threads_.clear();
  for (const auto& s : r->stages()) tuned_threads_.push_back(s->threads.load());
  last_stats_ = std::move(st);
}

PipelineStats Executor::CollectStats(const RunStream& r) const {
  PipelineStats st;
  st.plan = plan_.Describe();
  st.rewrites = plan_.rewrites;
  for (size_t i = 0; i < r.stages().size(); ++i) {
    const auto& s = *r.stages()[i];
    StageStats ss;
    ss.name = s.plan->name;
    ss.threads = s.threads.load();
    ss.elements = s.elements.load();
    ss.dropped = s.dropped.load();
    ss.busy_seconds = s.busy_ns.load() * 1e-9;
    const auto snap = r.queues()[i]->snapshot();
    ss.queue_capacity = snap.capacity;
    ss.peak_queue_items = snap.peak_items;
    ss.peak_queue_bytes = snap.peak_bytes;
    st.skipped += s.skipped.load();
    st.filtered += s.dropped.load() - s.skipped.load();
    st.stages.push_back(ss);
  }
  st.filtered +=
      logical_.source->size() > 0 && !index_mask_.empty()
          ? static_cast<uint64_t>(std::count(index_mask_.begin(), index_mask_.end(), false))
          : 0;
  st.elements_out = r.elements_out.load();
  st.batches_out = r.batches_out.load();
  st.peak_threads = r.peak_threads();
  for (const auto& q : r.queues()) st.peak_queued_bytes += q->snapshot().peak_bytes;
  st.wall_seconds = absl::ToDoubleSeconds(clock_->Now() - r.start_time());
  return st;
}

PipelineStats Executor::stats() const {
  absl::MutexLock lock(&mu_);
  if (run_ != nullptr && !run_->stopped) return CollectStats(*run_);
  return last_stats_;
}

}  // namespace sluice::data_worker::pipeline
