#include "data_worker/pipeline/executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "common/record/sharding.h"
#include "data_worker/pipeline/autotune.h"
#include "data_worker/pipeline/ordered_queue.h"

namespace sluice::data_worker::pipeline {
namespace {

absl::string_view Sv(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

int64_t BytesOf(const Element& e) {
  int64_t n = 0;
  for (const Tensor& t : e.columns) n += t.num_bytes();
  return n;
}

// Adds `delta` to the executor-wide live byte count and tracks the peak.
void AddLive(std::atomic<int64_t>* live, std::atomic<int64_t>* peak,
             int64_t delta) {
  const int64_t now = live->fetch_add(delta) + delta;
  int64_t p = peak->load();
  while (now > p && !peak->compare_exchange_weak(p, now)) {
  }
}

// What flows between stages: an element, a hole (dropped element: e null,
// status OK) or the error that ends the epoch at this place in the sequence.
// Its bytes count as live while it exists.
class Item {
 public:
  Item() = default;
  Item(std::unique_ptr<Element> e, std::atomic<int64_t>* live,
       std::atomic<int64_t>* peak)
      : e_(std::move(e)), live_(live), peak_(peak) {
    Recount();
  }
  static Item Error(absl::Status s) {
    Item i;
    i.status_ = std::move(s);
    return i;
  }
  Item(Item&& o) noexcept { *this = std::move(o); }
  Item& operator=(Item&& o) noexcept {
    Release();
    e_ = std::move(o.e_);
    status_ = std::move(o.status_);
    live_ = o.live_;
    peak_ = o.peak_;
    counted_ = o.counted_;
    o.counted_ = 0;
    return *this;
  }
  ~Item() { Release(); }

  Element* element() { return e_.get(); }
  std::unique_ptr<Element> Take() {
    Release();
    return std::move(e_);
  }
  const absl::Status& status() const { return status_; }
  bool is_hole() const { return e_ == nullptr && status_.ok(); }
  int64_t bytes() const { return counted_; }
  void Drop() {
    Release();
    e_.reset();
  }
  void Fail(absl::Status s) {
    Drop();
    status_ = std::move(s);
  }
  void Recount() {
    if (live_ == nullptr) return;
    const int64_t n = e_ ? BytesOf(*e_) : 0;
    AddLive(live_, peak_, n - counted_);
    counted_ = n;
  }

 private:
  void Release() {
    if (live_ != nullptr && counted_ != 0) AddLive(live_, peak_, -counted_);
    counted_ = 0;
  }
  std::unique_ptr<Element> e_;
  absl::Status status_;
  std::atomic<int64_t>* live_ = nullptr;
  std::atomic<int64_t>* peak_ = nullptr;
  int64_t counted_ = 0;
};

using Queue = OrderedQueue<Item>;

}  // namespace

struct Executor::Metrics {
  struct Stage {
    prometheus::Counter* elements;
    prometheus::Counter* busy;
    prometheus::Gauge* depth;
    prometheus::Histogram* latency;
  };
  std::vector<Stage> stages;
  std::map<std::string, prometheus::Histogram*, std::less<>> ops;
  prometheus::Counter* skipped;
};

namespace {

struct BatchState {
  std::vector<Tensor> columns;
  std::vector<uint64_t> ids;
  bool allocated = false;
  int64_t assigned = 0;
  int64_t filled = 0;
  int64_t expected = 0;
  bool discard = false;
  absl::Status error;
  int64_t counted = 0;  // live bytes accounted for the buffer
};

}  // namespace

struct Executor::EpochRun {
  struct Stage {
    const StagePlan* plan = nullptr;
    int index = 0;
    std::atomic<int> threads{0};
    std::atomic<uint64_t> elements{0};
    std::atomic<uint64_t> dropped{0};
    std::atomic<uint64_t> skipped{0};
    std::atomic<int64_t> busy_ns{0};
    std::atomic<bool> finished{false};
    // Batch stage state (reorder buffer, open batches).
    absl::Mutex bmu;
    std::map<uint64_t, Item> pending ABSL_GUARDED_BY(bmu);
    uint64_t popped ABSL_GUARDED_BY(bmu) = 0;
    uint64_t next_commit ABSL_GUARDED_BY(bmu) = 0;
    uint64_t count ABSL_GUARDED_BY(bmu) = 0;
    std::optional<uint64_t> input_end ABSL_GUARDED_BY(bmu);
    bool stopped ABSL_GUARDED_BY(bmu) = false;
    bool cancelled ABSL_GUARDED_BY(bmu) = false;
    std::map<uint64_t, BatchState> batches ABSL_GUARDED_BY(bmu);
  };

  Executor* ex = nullptr;
  uint64_t epoch = 0;
  std::vector<uint64_t> indices;
  absl::Time start;

  absl::Mutex feed_mu;
  uint64_t next_feed ABSL_GUARDED_BY(feed_mu) = 0;
  bool feed_cancelled ABSL_GUARDED_BY(feed_mu) = false;

  std::vector<std::unique_ptr<Stage>> stages;
  std::vector<std::unique_ptr<Queue>> queues;  // queue i = output of stage i

  absl::Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  std::vector<std::thread> workers ABSL_GUARDED_BY(mu);
  int peak_threads ABSL_GUARDED_BY(mu) = 0;
  int64_t peak_queued_bytes ABSL_GUARDED_BY(mu) = 0;
  std::thread autotuner;

  bool stopped_ = false;  // guarded by the executor's mu_
  bool done = false;  // GetNext saw the end or an error (consumer thread only)
  std::atomic<uint64_t> elements_out{0};
  std::atomic<uint64_t> batches_out{0};

  // --- called by workers ---
  Queue::PopResult PopInput(int stage, Item* item, uint64_t* seq) {
    if (stage > 0) return queues[stage - 1]->Pop(item, seq);
    absl::MutexLock lock(&feed_mu);
    if (feed_cancelled) return Queue::PopResult::kCancelled;
    if (next_feed >= indices.size()) {
      *seq = indices.size();
      return Queue::PopResult::kEnd;
    }
    *seq = next_feed;
    auto e = std::make_unique<Element>();
    e->global_indices.push_back(indices[next_feed]);
    e->epoch = epoch;
    ++next_feed;
    *item = Item(std::move(e), &ex->live_bytes_, &ex->peak_live_bytes_);
    return Queue::PopResult::kItem;
  }

  absl::Status Wrap(const absl::Status& s, uint64_t global,
                    std::string_view node, std::string_view op) {
    std::string where = absl::StrCat(ex->logical_.source->Describe(global),
                                     ": record ", global);
    if (!node.empty()) absl::StrAppend(&where, ": ", Sv(node));
    if (!op.empty()) absl::StrAppend(&where, " (", Sv(op), ")");
    return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
  }

  // Runs the per-element steps of `stage` on `item` (turning it into a hole or
  // an error).
  void Process(Stage& stage, Item* item) {
    Element& e = *item->element();
    const uint64_t global = e.global_indices[0];
    const ElementContext ctx{ex->logical_.seed, epoch, global};
    Metrics* m = ex->metrics_.get();
    auto fail = [&](const absl::Status& s) {
      if (ex->logical_.skip_errors && s.code() == absl::StatusCode::kDataLoss) {
        item->Drop();
        stage.skipped.fetch_add(1);
        stage.dropped.fetch_add(1);
        if (m) m->skipped->Increment();
      } else {
        item->Fail(s);
      }
    };
    for (const Step& step : stage.plan->steps) {
      switch (step.kind) {
        case Step::kRead: {
          auto cols =
              ex->logical_.source->Read(global, ex->logical_.source_columns);
          if (!cols.ok()) {
            absl::Status s = cols.status();
            if (s.code() == absl::StatusCode::kNotFound)
              s = absl::DataLossError(s.message());
            return fail(Wrap(s, global, "source", ""));
          }
          e.columns = std::move(*cols);
          break;
        }
        case Step::kMap:
          for (int slot : step.map.slots) {
            Tensor t = std::move(e.columns[slot]);
            for (const auto& op : step.map.ops) {
              const absl::Time t0 =
                  m ? ex->clock_->Now() : absl::InfinitePast();
              auto r = op->Apply(std::move(t), ctx);
              if (m) {
                auto it = m->ops.find(op->name());
                if (it != m->ops.end())
                  it->second->Observe(
                      absl::ToDoubleSeconds(ex->clock_->Now() - t0));
              }
              if (!r.ok())
                return fail(
                    Wrap(r.status(), global, step.map.name, op->name()));
              t = std::move(*r);
            }
            e.columns[slot] = std::move(t);
          }
          break;
        case Step::kFilter:
          for (const auto& [slot, filter] : step.filter.predicates) {
            const Tensor& t = e.columns[slot];
            const int64_t v = t.dtype() == DType::kInt32
                                  ? int64_t{*t.data_as<int32_t>()}
                                  : *t.data_as<int64_t>();
            if (!filter.Matches(v)) {
              item->Drop();
              stage.dropped.fetch_add(1);
              return;
            }
          }
          break;
      }
    }
    item->Recount();
  }

  void ElementWorker(int si) {
    Stage& stage = *stages[si];
    Queue& out = *queues[si];
    while (true) {
      Item item;
      uint64_t seq = 0;
      const auto r = PopInput(si, &item, &seq);
      if (r == Queue::PopResult::kCancelled) return;
      if (r == Queue::PopResult::kEnd) {
        out.SetEnd(seq);
        stage.finished = true;
        return;
      }
      if (item.element() != nullptr) {
        const absl::Time t0 = ex->clock_->Now();
        Process(stage, &item);
        const absl::Duration busy = ex->clock_->Now() - t0;
        stage.busy_ns.fetch_add(absl::ToInt64Nanoseconds(busy));
        stage.elements.fetch_add(1);
        if (Metrics* m = ex->metrics_.get()) {
          m->stages[si].elements->Increment();
          m->stages[si].busy->Increment(absl::ToDoubleSeconds(busy));
          m->stages[si].latency->Observe(absl::ToDoubleSeconds(busy));
        }
      }
      const int64_t bytes = item.bytes();
      if (!out.Push(seq, std::move(item), bytes)) return;
    }
  }

  struct Action {
    enum Kind { kCopy, kFinish } kind;
    uint64_t batch;
    int64_t slot = 0;
    Item item;
  };

  // Commits pending items in sequence order: assigns batch slots, notes the end
  // and errors.
  void Drain(Stage& s, std::vector<Action>* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.bmu) {
    const int64_t B = s.plan->batch_size;
    while (!s.pending.empty() && s.pending.begin()->first == s.next_commit) {
      Item item = std::move(s.pending.begin()->second);
      s.pending.erase(s.pending.begin());
      ++s.next_commit;
      if (s.stopped || item.is_hole()) continue;
      if (!item.status().ok()) {
        const uint64_t k = s.count / B;
        BatchState& b = s.batches[k];
        b.error = item.status();
        b.expected = b.assigned;
        s.stopped = true;
        queues[s.index]->SetEnd(k + 1);
        if (b.filled == b.expected)
          actions->push_back(Action{Action::kFinish, k, 0, Item()});
        continue;
      }
      const uint64_t pos = s.count++;
      const uint64_t k = pos / B;
      BatchState& b = s.batches[k];
      if (b.expected == 0) b.expected = B;
      ++b.assigned;
      actions->push_back(Action{Action::kCopy, k, static_cast<int64_t>(pos % B),
                                std::move(item)});
    }
    if (!s.stopped && s.input_end && s.next_commit >= *s.input_end) {
      s.stopped = true;
      const uint64_t full = s.count / B;
      const uint64_t rem = s.count % B;
      const bool partial = rem != 0 && !s.plan->drop_remainder;
      queues[s.index]->SetEnd(full + (partial ? 1 : 0));
      if (rem != 0) {
        BatchState& b = s.batches[full];
        if (partial) {
          b.expected = rem;
          if (b.filled == b.expected)
            actions->push_back(Action{Action::kFinish, full, 0, Item()});
        } else {
          b.discard = true;
          if (b.filled == b.assigned) s.batches.erase(full);
        }
      }
    }
  }

  void RunActions(Stage& s, std::vector<Action>& actions) {
    for (Action& a : actions) {
      if (a.kind == Action::kFinish) {
        Finish(s, a.batch);
        continue;
      }
      Element& e = *a.item.element();
      const int64_t B = s.plan->batch_size;
      BatchState* b;
      absl::Status shape_error;
      {
        absl::MutexLock lock(&s.bmu);
        b = &s.batches[a.batch];
        if (!b->allocated) {
          b->allocated = true;
          b->ids.assign(B, 0);
          int64_t bytes = 0;
          for (const Tensor& t : e.columns) {
            std::vector<int64_t> shape = {B};
            shape.insert(shape.end(), t.shape().begin(), t.shape().end());
            b->columns.push_back(Tensor::Allocate(t.dtype(), shape));
            bytes += b->columns.back().num_bytes();
          }
          b->counted = bytes;
          AddLive(&ex->live_bytes_, &ex->peak_live_bytes_, bytes);
        }
      }
      for (size_t c = 0; c < e.columns.size() && shape_error.ok(); ++c) {
        const Tensor& t = e.columns[c];
        const Tensor& dst = b->columns[c];
        const bool same = t.dtype() == dst.dtype() &&
                          t.rank() + 1 == dst.rank() &&
                          std::equal(t.shape().begin(), t.shape().end(),
                                     dst.shape().begin() + 1);
        if (!same) {
          std::vector<int64_t> want(dst.shape().begin() + 1, dst.shape().end());
          shape_error =
              Wrap(absl::InvalidArgumentError(absl::StrCat(
                       "column '", ex->logical_.column_names[c], "' is ",
                       Sv(DTypeToString(t.dtype())), ShapeToString(t.shape()),
                       " but the batch holds ", Sv(DTypeToString(dst.dtype())),
                       ShapeToString(want),
                       "; resize or crop to a fixed size first")),
                   e.global_indices[0], "batch", "");
          break;
        }
        std::memcpy(b->columns[c].data() + a.slot * t.num_bytes(), t.data(),
                    t.num_bytes());
      }
      b->ids[a.slot] = e.global_indices[0];
      a.item = Item();
      bool finish = false;
      {
        absl::MutexLock lock(&s.bmu);
        if (!shape_error.ok() && b->error.ok()) b->error = shape_error;
        ++b->filled;
        if (b->discard && b->filled == b->assigned) {
          AddLive(&ex->live_bytes_, &ex->peak_live_bytes_, -b->counted);
          s.batches.erase(a.batch);
        } else if (b->filled == b->expected && b->assigned == b->expected) {
          finish = true;
        }
      }
      if (finish) Finish(s, a.batch);
    }
    actions.clear();
  }

  void Finish(Stage& s, uint64_t k) {
    BatchState b;
    {
      absl::MutexLock lock(&s.bmu);
      auto it = s.batches.find(k);
      b = std::move(it->second);
      s.batches.erase(it);
    }
    AddLive(&ex->live_bytes_, &ex->peak_live_bytes_, -b.counted);
    Item out;
    if (!b.error.ok()) {
      out = Item::Error(b.error);
    } else {
      auto e = std::make_unique<Element>();
      e->epoch = epoch;
      const int64_t n = b.expected;
      b.ids.resize(n);
      e->global_indices = std::move(b.ids);
      for (Tensor& t : b.columns) {
        if (t.dim(0) != n) {
          std::vector<int64_t> shape = t.shape();
          const size_t per = t.num_bytes() / shape[0];
          shape[0] = n;
          Tensor small = Tensor::Allocate(t.dtype(), shape);
          std::memcpy(small.data(), t.data(), per * n);
          t = std::move(small);
        }
        e->columns.push_back(std::move(t));
      }
      absl::Status status;
      for (const auto& [slot, ops] : s.plan->vectorized) {
        for (const auto& op : ops) {
          auto r = op->ApplyBatch(std::move(e->columns[slot]));
          if (!r.ok()) {
            status =
                absl::Status(r.status().code(),
                             absl::StrCat("batch ", k, " (", Sv(op->name()),
                                          "): ", r.status().message()));
            break;
          }
          e->columns[slot] = std::move(*r);
        }
        if (!status.ok()) break;
      }
      out = status.ok()
                ? Item(std::move(e), &ex->live_bytes_, &ex->peak_live_bytes_)
                : Item::Error(status);
    }
    const int64_t bytes = out.bytes();
    queues[s.index]->Push(k, std::move(out), bytes);
  }

  void BatchWorker(int si) {
    Stage& s = *stages[si];
    std::vector<Action> actions;
    // Elements popped but not yet in a committed batch: two batches' worth plus
    // slack for the threads, so the stage's memory scales with the batch, not
    // with a fixed count.
    const uint64_t window =
        2 * static_cast<uint64_t>(std::max(1, s.plan->batch_size)) +
        4 * static_cast<uint64_t>(ex->cpu_budget_);
    while (true) {
      {
        absl::MutexLock lock(&s.bmu);
        auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.bmu) {
          return s.cancelled || s.popped < s.next_commit + window;
        };
        s.bmu.Await(absl::Condition(&room));
        if (s.cancelled) return;
        ++s.popped;
      }
      Item item;
      uint64_t seq = 0;
      const auto r = PopInput(si, &item, &seq);
      if (r == Queue::PopResult::kCancelled) return;
      if (r == Queue::PopResult::kEnd) {
        {
          absl::MutexLock lock(&s.bmu);
          --s.popped;
          s.input_end = seq;
          Drain(s, &actions);
        }
        RunActions(s, actions);
        s.finished = true;
        return;
      }
      if (item.element() != nullptr && !s.plan->steps.empty()) {
        const absl::Time t0 = ex->clock_->Now();
        Process(s, &item);
        const absl::Duration busy = ex->clock_->Now() - t0;
        s.busy_ns.fetch_add(absl::ToInt64Nanoseconds(busy));
        if (Metrics* m = ex->metrics_.get()) {
          m->stages[si].busy->Increment(absl::ToDoubleSeconds(busy));
          m->stages[si].latency->Observe(absl::ToDoubleSeconds(busy));
        }
      }
      if (item.element() != nullptr || !item.status().ok()) {
        s.elements.fetch_add(1);
        if (Metrics* m = ex->metrics_.get())
          m->stages[si].elements->Increment();
      }
      const absl::Time c0 = ex->clock_->Now();
      {
        absl::MutexLock lock(&s.bmu);
        s.pending.emplace(seq, std::move(item));
        Drain(s, &actions);
      }
      RunActions(s, actions);
      s.busy_ns.fetch_add(absl::ToInt64Nanoseconds(ex->clock_->Now() - c0));
    }
  }

  void AddWorker(int si) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (cancelled || stages[si]->finished) return;
    stages[si]->threads.fetch_add(1);
    if (stages[si]->plan->batch) {
      workers.emplace_back([this, si] { BatchWorker(si); });
    } else {
      workers.emplace_back([this, si] { ElementWorker(si); });
    }
    int total = 0;
    for (const auto& s : stages) total += s->threads.load();
    peak_threads = std::max(peak_threads, total);
  }

  // The autotune thread: every autotune_interval, samples the stages' counters
  // and queues, sets the queue-depth gauges and, with autotune on, applies
  // DecideAutotune (more threads, queue limits).
  void Autotune() {
    const int n = static_cast<int>(stages.size());
    std::vector<uint64_t> last_elements(n, 0);
    std::vector<int64_t> last_busy(n, 0);
    absl::Duration last_wait;
    absl::Time last = ex->clock_->Now();
    while (true) {
      {
        absl::MutexLock lock(&mu);
        if (mu.AwaitWithTimeout(absl::Condition(&cancelled),
                                ex->options_.autotune_interval))
          return;
      }
      AutotuneInput in;
      in.cpu_budget = ex->cpu_budget_;
      in.memory_budget_bytes = ex->options_.memory_budget_bytes;
      in.prefetch = ex->plan_.prefetch;
      int64_t queued = 0;
      for (int i = 0; i < n; ++i) {
        const Stage& s = *stages[i];
        const auto snap = queues[i]->snapshot();
        queued += snap.bytes;
        if (Metrics* m = ex->metrics_.get())
          m->stages[i].depth->Set(snap.items);
        StageSample sample;
        sample.threads = s.threads.load();
        sample.tunable =
            s.plan->parallelism == kAutotune && ex->options_.autotune;
        sample.finished = s.finished.load();
        const uint64_t el = s.elements.load();
        const int64_t busy = s.busy_ns.load();
        sample.elements = el - last_elements[i];
        sample.busy_seconds = (busy - last_busy[i]) * 1e-9;
        last_elements[i] = el;
        last_busy[i] = busy;
        sample.max_element_bytes = snap.max_item_bytes;
        in.stages.push_back(sample);
        if (i == n - 1) {
          const absl::Time now = ex->clock_->Now();
          const double interval = absl::ToDoubleSeconds(now - last);
          in.consumer_wait_fraction =
              interval > 0
                  ? absl::ToDoubleSeconds(snap.empty_wait - last_wait) /
                        interval
                  : 1;
          last_wait = snap.empty_wait;
          last = now;
        }
      }
      absl::MutexLock lock(&mu);
      if (cancelled) return;
      peak_queued_bytes = std::max(peak_queued_bytes, queued);
      if (!ex->options_.autotune) continue;  // metrics only
      const AutotuneDecision d = DecideAutotune(in);
      for (int i = 0; i < n; ++i) {
        while (stages[i]->threads.load() < d.threads[i] && !stages[i]->finished)
          AddWorker(i);
        queues[i]->SetLimits(d.queue_capacity[i], d.queue_bytes[i]);
      }
    }
  }

  void Cancel() {
    {
      absl::MutexLock lock(&mu);
      cancelled = true;
    }
    {
      absl::MutexLock lock(&feed_mu);
      feed_cancelled = true;
    }
    for (auto& q : queues) q->Cancel();
    for (auto& s : stages) {
      absl::MutexLock lock(&s->bmu);
      s->cancelled = true;
    }
  }

  void Join() {
    if (autotuner.joinable()) autotuner.join();
    std::vector<std::thread> ws;
    {
      absl::MutexLock lock(&mu);
      ws = std::move(workers);
    }
    for (auto& t : ws) t.join();
  }

  // Frees what the joined threads left behind (queued items, partial batches).
  void Clear() {
    for (auto& q : queues) q->Clear();
    for (auto& s : stages) {
      std::map<uint64_t, Item> pending;
      absl::MutexLock lock(&s->bmu);
      pending.swap(s->pending);
      for (auto& [k, b] : s->batches)
        AddLive(&ex->live_bytes_, &ex->peak_live_bytes_, -b.counted);
      s->batches.clear();
    }
  }
};

Executor::Executor(LogicalPipeline logical, PhysicalPlan plan,
                   ExecutorOptions options)
    : logical_(std::move(logical)), plan_(std::move(plan)), options_(options) {
  clock_ = options_.clock != nullptr ? options_.clock : RealClock::Get();
  cpu_budget_ =
      options_.cpu_budget > 0
          ? options_.cpu_budget
          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (options_.registry != nullptr) {
    auto& r = *options_.registry;
    metrics_ = std::make_unique<Metrics>();
    for (const StagePlan& s : plan_.stages) {
      const MetricLabels l = {{"stage", s.name}};
      metrics_->stages.push_back(Metrics::Stage{
          &AddCounter(r, "sluice_pipeline_stage_elements_total",
                      "Elements processed by a stage.", l),
          &AddCounter(r, "sluice_pipeline_stage_busy_seconds_total",
                      "Thread-seconds a stage spent processing elements.", l),
          &AddGauge(r, "sluice_pipeline_stage_queue_depth",
                    "Elements in a stage's output queue.", l),
          &AddHistogram(r, "sluice_pipeline_stage_latency_seconds",
                        "Time one element spends in a stage's steps.",
                        LatencyBuckets(), l)});
      for (const Step& st : s.steps) {
        if (st.kind != Step::kMap) continue;
        for (const auto& op : st.map.ops) {
          const std::string name(op->name());
          if (metrics_->ops.count(name)) continue;
          metrics_->ops[name] = &AddHistogram(r, "sluice_op_seconds",
                                              "Time of one op on one element.",
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
      for (size_t i = 0; i < keep.size(); ++i)
        index_mask_[i] = index_mask_[i] && keep[i];
    }
  }
}

Executor::~Executor() { Stop(); }

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(
    const proto::Pipeline& spec, ExecutorOptions options) {
  ASSIGN_OR_RETURN(LogicalPipeline lp, Validate(spec));
  ASSIGN_OR_RETURN(PhysicalPlan plan, Optimize(lp, options.optimizer));
  return std::unique_ptr<Executor>(
      new Executor(std::move(lp), std::move(plan), options));
}

absl::Status Executor::Start(uint64_t epoch) {
  const uint64_t n = logical_.source->size();
  std::vector<uint64_t> order;
  if (logical_.shuffle) {
    order = record::Permutation(n, logical_.shuffle_seed, epoch);
  } else {
    order.resize(n);
    for (uint64_t i = 0; i < n; ++i) order[i] = i;
  }
  return Start(std::move(order), epoch);
}

absl::Status Executor::Start(std::vector<uint64_t> global_indices,
                             uint64_t epoch) {
  Stop();
  const uint64_t n = logical_.source->size();
  std::vector<uint64_t> indices;
  indices.reserve(global_indices.size());
  for (uint64_t g : global_indices) {
    if (g >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("global index ", g, " is out of range: the source has ",
                       n, " records"));
    }
    if (index_mask_.empty() || index_mask_[g]) indices.push_back(g);
  }
  auto run = std::make_unique<EpochRun>();
  run->ex = this;
  run->epoch = epoch;
  run->indices = std::move(indices);
  run->start = clock_->Now();
  const int ns = static_cast<int>(plan_.stages.size());
  const int64_t share = options_.memory_budget_bytes / std::max(1, ns);
  for (int i = 0; i < ns; ++i) {
    auto s = std::make_unique<EpochRun::Stage>();
    s->plan = &plan_.stages[i];
    s->index = i;
    run->stages.push_back(std::move(s));
    const int64_t cap = i + 1 == ns && plan_.prefetch > 0 ? plan_.prefetch : 2;
    run->queues.push_back(std::make_unique<Queue>(cap, share, clock_));
  }
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
  const int even =
      tunable > 0 ? std::max(1, (cpu_budget_ - fixed) / tunable) : 1;
  std::vector<int> tuned;
  {
    absl::MutexLock lock(&mu_);
    tuned = tuned_threads_;
  }
  {
    absl::MutexLock lock(&run->mu);
    for (int i = 0; i < ns; ++i) {
      const int p = plan_.stages[i].parallelism;
      int threads = p != kAutotune ? p : (options_.autotune ? 1 : even);
      if (p == kAutotune && options_.autotune &&
          tuned.size() == plan_.stages.size()) {
        threads = std::max(1, tuned[i]);
      }
      for (int t = 0; t < threads; ++t) run->AddWorker(i);
    }
  }
  if ((options_.autotune && tunable > 0) || metrics_ != nullptr) {
    EpochRun* r = run.get();
    run->autotuner = std::thread([r] { r->Autotune(); });
  }
  absl::MutexLock lock(&mu_);
  run_ = std::move(run);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Element>> Executor::GetNext() {
  EpochRun* run;
  {
    absl::MutexLock lock(&mu_);
    run = run_.get();
  }
  if (run == nullptr)
    return absl::FailedPreconditionError("GetNext before Start");
  if (run->done) return std::optional<Element>();
  Queue& out = *run->queues.back();
  while (true) {
    Item item;
    uint64_t seq = 0;
    const auto r = out.Pop(&item, &seq);
    if (r != Queue::PopResult::kItem) {
      run->done = true;
      Stop();
      if (r == Queue::PopResult::kCancelled)
        return absl::CancelledError("the epoch was stopped");
      return std::optional<Element>();
    }
    if (!item.status().ok()) {
      run->done = true;
      const absl::Status s = item.status();
      Stop();
      return s;
    }
    if (item.is_hole()) continue;
    std::unique_ptr<Element> e = item.Take();
    run->elements_out += e->global_indices.size();
    if (plan_.stages.back().batch) ++run->batches_out;
    return std::optional<Element>(std::move(*e));
  }
}

absl::Status Executor::Run(std::vector<uint64_t> global_indices, uint64_t epoch,
                           const std::function<bool(Element)>& sink) {
  RETURN_IF_ERROR(Start(std::move(global_indices), epoch));
  while (true) {
    ASSIGN_OR_RETURN(std::optional<Element> e, GetNext());
    if (!e) return absl::OkStatus();
    if (!sink(std::move(*e))) {
      Stop();
      return absl::OkStatus();
    }
  }
}

void Executor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (run_ == nullptr) return;
    if (run_->stopped_) return;
    run_->stopped_ = true;
  }
  EpochRun* r;
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
  for (const auto& s : r->stages) tuned_threads_.push_back(s->threads.load());
  last_stats_ = std::move(st);
}

PipelineStats Executor::CollectStats(const EpochRun& r) const {
  PipelineStats st;
  st.plan = plan_.Describe();
  st.rewrites = plan_.rewrites;
  for (size_t i = 0; i < r.stages.size(); ++i) {
    const auto& s = *r.stages[i];
    StageStats ss;
    ss.name = s.plan->name;
    ss.threads = s.threads.load();
    ss.elements = s.elements.load();
    ss.dropped = s.dropped.load();
    ss.busy_seconds = s.busy_ns.load() * 1e-9;
    const auto snap = r.queues[i]->snapshot();
    ss.queue_capacity = snap.capacity;
    ss.peak_queue_items = snap.peak_items;
    ss.peak_queue_bytes = snap.peak_bytes;
    st.skipped += s.skipped.load();
    st.filtered += s.dropped.load() - s.skipped.load();
    st.stages.push_back(ss);
  }
  st.filtered += r.ex->logical_.source->size() > 0 && !index_mask_.empty()
                     ? static_cast<uint64_t>(std::count(
                           index_mask_.begin(), index_mask_.end(), false))
                     : 0;
  st.elements_out = r.elements_out.load();
  st.batches_out = r.batches_out.load();
  {
    absl::MutexLock lock(&const_cast<EpochRun&>(r).mu);
    st.peak_threads = r.peak_threads;
  }
  for (const auto& q : r.queues)
    st.peak_queued_bytes += q->snapshot().peak_bytes;
  st.wall_seconds = absl::ToDoubleSeconds(clock_->Now() - r.start);
  return st;
}

PipelineStats Executor::stats() const {
  absl::MutexLock lock(&mu_);
  if (run_ != nullptr && !run_->stopped_) return CollectStats(*run_);
  return last_stats_;
}

}  // namespace sluice::data_worker::pipeline
