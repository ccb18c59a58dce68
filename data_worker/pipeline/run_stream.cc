#include "data_worker/pipeline/run_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "data_worker/pipeline/autotune.h"
#include "data_worker/pipeline/busy_sampler.h"

namespace sluice::data_worker::pipeline {
namespace {

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

RunStream::RunStream(const EpochContext& ctx) : ctx_(ctx), start_(ctx.clock->Now()) {
  const PhysicalPlan& plan = *ctx_.plan;
  const int ns = static_cast<int>(plan.stages.size());
  const int64_t share = ctx_.memory_budget_bytes / std::max(1, ns);
  for (int i = 0; i < ns; ++i) {
    auto s = std::make_unique<Stage>();
    s->plan = &plan.stages[i];
    s->index = i;
    if (s->plan->batch) {
      BatchAssembler::Options o;
      o.batch_size = std::max(1, s->plan->batch_size);
      o.drop_remainder = s->plan->drop_remainder;
      // Elements popped but not yet in a committed batch: two batches' worth
      // plus slack for the threads, so the stage's memory scales with the
      // batch, not with a fixed count.
      o.window =
          2 * static_cast<uint64_t>(o.batch_size) + 4 * static_cast<uint64_t>(ctx_.cpu_budget);
      o.column_names = ctx_.logical->column_names;
      o.live = ctx_.live;
      o.runs = true;
      o.max_buffer_bytes = ctx_.memory_budget_bytes;
      o.pool = ctx_.pool;
      o.writes = s->plan->writes;
      o.seed = ctx_.logical->seed;
      s->assembler = std::make_unique<BatchAssembler>(
          std::move(o),
          [this, i](uint64_t k, absl::StatusOr<Element> batch) {
            EmitBatch(i, k, std::move(batch));
          },
          [this, i](uint64_t n) { queues_[i]->SetEnd(n); },
          [this](absl::Status st, uint64_t global) { return Wrap(st, global, "batch", ""); });
    }
    for (const Step& step : s->plan->steps) {
      if (step.kind != Step::kMap) continue;
      for (const auto& op : step.map.ops) {
        s->group = std::max(s->group, op->group_size());
      }
    }
    stages_.push_back(std::move(s));
    const int64_t cap = i + 1 == ns && plan.prefetch > 0 ? plan.prefetch : 2;
    queues_.push_back(std::make_unique<ItemQueue>(cap, share, ctx_.clock));
  }
  // A grouping stage's input queue holds at least a group, so that a group
  // can be waiting when a worker comes for it.
  for (int i = 1; i < ns; ++i) {
    if (stages_[i]->group > 2) queues_[i - 1]->SetLimits(stages_[i]->group, share);
  }
}

RunStream::~RunStream() {
  Cancel();
  Join();
  Clear();
}

void RunStream::Start(const std::vector<int>& threads, bool autotuner) {
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < stages_.size(); ++i) {
      for (int t = 0; t < threads[i]; ++t) AddWorker(static_cast<int>(i));
    }
  }
  if (autotuner) autotuner_ = std::thread([this] { Autotune(); });
}

int RunStream::peak_threads() const {
  absl::MutexLock lock(&mu_);
  return peak_threads_;
}

void RunStream::Submit(uint64_t id, std::vector<uint64_t> indices, uint64_t epoch) {
  absl::MutexLock lock(&feed_mu_);
  runs_.push_back(Run{id, std::move(indices), epoch});
}

void RunStream::CloseFeed() {
  absl::MutexLock lock(&feed_mu_);
  feed_closed_ = true;
}

void RunStream::CancelRun(uint64_t id) {
  absl::MutexLock lock(&feed_mu_);
  for (Run& r : runs_) {
    if (r.id == id) r.cancelled = true;
  }
}

bool RunStream::FeedIdle() const {
  absl::MutexLock lock(&feed_mu_);
  return runs_.empty();
}

ItemQueue::PopResult RunStream::PopInput(int stage, Item* item, uint64_t* seq, bool wait) {
  if (stage > 0) {
    return wait ? queues_[stage - 1]->Pop(item, seq) : queues_[stage - 1]->TryPop(item, seq);
  }
  auto go = [this] { return budget_cancelled_.load() || outputs_waiting_.load() == 0; };
  if (!wait && ctx_.budget != nullptr && !ctx_.budget->HasRoom(go)) {
    return ItemQueue::PopResult::kNotReady;
  }
  if (wait && ctx_.budget != nullptr) {
    // Under a full worker budget the pipeline runs at most one output ahead of
    // its reader; a reader that waits for it always gets it.
    ctx_.budget->WaitForRoom(go);
  }
  absl::MutexLock lock(&feed_mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(feed_mu_) {
    return feed_cancelled_ || feed_closed_ || !runs_.empty();
  };
  if (!wait && !ready()) return ItemQueue::PopResult::kNotReady;
  feed_mu_.Await(absl::Condition(&ready));
  if (feed_cancelled_) return ItemQueue::PopResult::kCancelled;
  *seq = next_feed_;
  if (runs_.empty()) return ItemQueue::PopResult::kEnd;  // closed
  ++next_feed_;
  Run& run = runs_.front();
  const bool ends = run.cancelled || run.next >= run.indices.size();
  // A run's marker has no columns: never a recycled element.
  auto e = ends || ctx_.pool == nullptr ? std::make_unique<Element>() : ctx_.pool->Get();
  e->epoch = run.epoch;
  if (ends) {
    e->end_of_run = true;
    runs_.pop_front();
  } else {
    e->global_indices.push_back(run.indices[run.next++]);
  }
  *item = Item(std::move(e), ctx_.live);
  return ItemQueue::PopResult::kItem;
}

absl::Status RunStream::Wrap(const absl::Status& s, uint64_t global, std::string_view node,
                             std::string_view op) const {
  std::string where = absl::StrCat(ctx_.logical->source->Describe(global), ": record ", global);
  // An op's own errors start with its place in the spec ("map[1].ops[0] (Python): ..."; the
  // node of fused maps is "map[0]+map[1]"): the map is not named twice.
  const bool named = absl::StartsWith(Sv(node), "map[") && absl::StartsWith(s.message(), "map[");
  if (!node.empty() && !named) absl::StrAppend(&where, ": ", Sv(node));
  if (!op.empty() && !named) absl::StrAppend(&where, " (", Sv(op), ")");
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

void RunStream::Process(Stage& stage, const ItemRefs& items) {
  const LogicalPipeline& lp = *ctx_.logical;
  ExecutorMetrics* m = ctx_.metrics;
  auto fail = [&](Item* item, const absl::Status& s) {
    if (lp.skip_errors && s.code() == absl::StatusCode::kDataLoss) {
      item->Drop();
      stage.skipped.fetch_add(1);
      stage.dropped.fetch_add(1);
      if (m) m->skipped->Increment();
    } else {
      item->Fail(s);
    }
  };
  auto context = [&](Item* item) {
    const Element& e = *item->element();
    return ElementContext{lp.seed, e.epoch, e.global_indices[0]};
  };
  // The items not dropped or failed by an earlier step.
  auto present = [&] {
    ItemRefs v;
    for (Item* item : items) {
      if (item->element() != nullptr) v.push_back(item);
    }
    return v;
  };
  // The present items a step computes: not those read from the cache, whose
  // steps before the cache node were run before they were cached.
  auto live = [&] {
    ItemRefs v;
    for (Item* item : present()) {
      if (!item->element()->from_cache) v.push_back(item);
    }
    return v;
  };
  auto observe = [&](const Op& op, absl::Time t0, size_t n) {
    if (!m) return;
    auto it = m->ops.find(op.name());
    if (it == m->ops.end()) return;
    const double each = absl::ToDoubleSeconds(ctx_.clock->Now() - t0) / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) it->second->Observe(each);
  };
  for (const Step& step : stage.plan->steps) {
    switch (step.kind) {
      case Step::kRead:
        for (Item* item : live()) {
          Element& e = *item->element();
          const uint64_t global = e.global_indices[0];
          if (ctx_.cache != nullptr) {
            absl::StatusOr<ElementCache::Found> found = ctx_.cache->Lookup(global, &e.columns);
            if (!found.ok()) {
              fail(item, Wrap(found.status(), global, "cache", ""));
              continue;
            }
            if (*found == ElementCache::Found::kAbsent) {
              item->Drop();
              stage.dropped.fetch_add(1);
              continue;
            }
            if (*found == ElementCache::Found::kHit) {
              e.from_cache = true;
              continue;
            }
          }
          // Into the element's tensors: a recycled element keeps their storage.
          if (absl::Status s = lp.source->ReadInto(global, lp.source_columns, &e.columns);
              !s.ok()) {
            if (s.code() == absl::StatusCode::kNotFound) {
              s = absl::DataLossError(s.message());
            }
            fail(item, Wrap(s, global, "source", ""));
            continue;
          }
        }
        break;
      case Step::kMap: {
        // Runs of per-column ops go column by column, element by element; an
        // op that takes all columns (python) gets them together, for all the
        // elements of the group at once if it groups.
        const auto& ops = step.map.ops;
        for (size_t begin = 0; begin < ops.size();) {
          if (ops[begin]->takes_all_columns()) {
            const Op& op = *ops[begin];
            const ItemRefs group = live();
            if (group.empty()) break;
            std::vector<std::vector<Tensor>> cols(group.size());
            std::vector<ElementContext> ctxs;
            for (size_t i = 0; i < group.size(); ++i) {
              Element& e = *group[i]->element();
              for (int slot : step.map.slots) {
                cols[i].push_back(std::move(e.columns[slot]));
              }
              ctxs.push_back(context(group[i]));
            }
            const absl::Time t0 = m ? ctx_.clock->Now() : absl::InfinitePast();
            std::vector<absl::StatusOr<std::vector<Tensor>>> r;
            if (group.size() == 1) {
              r.push_back(op.ApplyColumns(std::move(cols[0]), ctxs[0]));
            } else {
              r = op.ApplyColumnsGroup(std::move(cols), ctxs, !lp.skip_errors);
            }
            observe(op, t0, group.size());
            for (size_t i = 0; i < group.size(); ++i) {
              if (!r[i].ok()) {
                fail(group[i], Wrap(r[i].status(), ctxs[i].global_index, step.map.name, op.name()));
                continue;
              }
              Element& e = *group[i]->element();
              for (size_t k = 0; k < step.map.slots.size(); ++k) {
                e.columns[step.map.slots[k]] = std::move((*r[i])[k]);
              }
            }
            ++begin;
            continue;
          }
          size_t end = begin;
          while (end < ops.size() && !ops[end]->takes_all_columns()) ++end;
          for (Item* item : live()) {
            Element& e = *item->element();
            const ElementContext ctx = context(item);
            bool failed = false;
            for (int slot : step.map.slots) {
              Tensor t = std::move(e.columns[slot]);
              for (size_t i = begin; i < end && !failed; ++i) {
                const Op& op = *ops[i];
                const absl::Time t0 = m ? ctx_.clock->Now() : absl::InfinitePast();
                auto r = op.Apply(std::move(t), ctx);
                observe(op, t0, 1);
                if (!r.ok()) {
                  fail(item, Wrap(r.status(), ctx.global_index, step.map.name, op.name()));
                  failed = true;
                  break;
                }
                t = std::move(*r);
              }
              if (failed) break;
              e.columns[slot] = std::move(t);
            }
          }
          begin = end;
        }
        break;
      }
      case Step::kCache:
        for (Item* item : present()) {
          Element& e = *item->element();
          if (e.from_cache) {
            e.from_cache = false;
          } else if (ctx_.cache != nullptr) {
            ctx_.cache->Offer(e.global_indices[0], e.columns);
          }
        }
        break;
      case Step::kFilter:
        for (Item* item : live()) {
          const Element& e = *item->element();
          for (const auto& [slot, filter] : step.filter.predicates) {
            const Tensor& t = e.columns[slot];
            const int64_t v =
                t.dtype() == DType::kInt32 ? int64_t{*t.data_as<int32_t>()} : *t.data_as<int64_t>();
            if (!filter.Matches(v)) {
              item->Drop();
              stage.dropped.fetch_add(1);
              break;
            }
          }
        }
        break;
    }
  }
  for (Item* item : present()) item->Recount();
}

namespace {

// The elements of `items` the stage's steps run on (not holes, errors or
// end-of-run markers).
ItemRefs Elements(ItemGroup& items) {
  ItemRefs v;
  for (Item& item : items) {
    if (item.element() != nullptr && !item.element()->end_of_run) {
      v.push_back(&item);
    }
  }
  return v;
}

}  // namespace

absl::Duration RunStream::TimedProcess(int si, const ItemRefs& items, int64_t weight) {
  Stage& stage = *stages_[si];
  const absl::Time t0 = ctx_.clock->Now();
  Process(stage, items);
  const absl::Duration busy = ctx_.clock->Now() - t0;
  stage.busy_ns.fetch_add(weight * absl::ToInt64Nanoseconds(busy));
  if (ExecutorMetrics* m = ctx_.metrics) {
    m->stages[si].busy->Increment(absl::ToDoubleSeconds(busy));
    const double each = absl::ToDoubleSeconds(busy) / static_cast<double>(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      m->stages[si].latency->Observe(each);
    }
  }
  return busy;
}

ItemQueue::PopResult RunStream::PopGroup(int si, ItemGroup* items, GroupSeqs* seqs, uint64_t* end) {
  Stage& s = *stages_[si];
  BatchAssembler* assembler = s.assembler.get();
  Item item;
  uint64_t seq = 0;
  if (assembler != nullptr && !assembler->Reserve()) {
    return ItemQueue::PopResult::kCancelled;
  }
  const auto r = PopInput(si, &item, &seq, /*wait=*/true);
  if (r != ItemQueue::PopResult::kItem) {
    if (assembler != nullptr) assembler->Unreserve();
    *end = seq;
    return r;
  }
  items->push_back(std::move(item));
  seqs->push_back(seq);
  while (items->size() < static_cast<size_t>(s.group)) {
    if (assembler != nullptr && !assembler->TryReserve()) break;
    if (PopInput(si, &item, &seq, /*wait=*/false) != ItemQueue::PopResult::kItem) {
      if (assembler != nullptr) assembler->Unreserve();
      break;
    }
    items->push_back(std::move(item));
    seqs->push_back(seq);
  }
  return ItemQueue::PopResult::kItem;
}

void RunStream::ElementWorker(int si) {
  Stage& stage = *stages_[si];
  ItemQueue& out = *queues_[si];
  BusySampler sampler;
  while (true) {
    if (LeaveIfAboveTarget(si)) return;
    ItemGroup items;
    GroupSeqs seqs;
    uint64_t end = 0;
    const auto r = PopGroup(si, &items, &seqs, &end);
    if (r == ItemQueue::PopResult::kCancelled) return;
    if (r == ItemQueue::PopResult::kEnd) {
      out.SetEnd(end);
      stage.finished = true;
      return;
    }
    const ItemRefs elements = Elements(items);
    if (!elements.empty()) {
      if (ctx_.metrics != nullptr) {
        TimedProcess(si, elements, /*weight=*/1);
      } else if (const int64_t weight = sampler.Next(); weight > 0) {
        sampler.Timed(TimedProcess(si, elements, weight));
      } else {
        Process(stage, elements);
      }
      stage.elements.fetch_add(elements.size());
      if (ExecutorMetrics* m = ctx_.metrics) {
        m->stages[si].elements->Increment(static_cast<double>(elements.size()));
      }
    }
    for (size_t i = 0; i < items.size(); ++i) {
      const int64_t bytes = items[i].bytes();
      if (si + 1 == static_cast<int>(queues_.size())) outputs_waiting_.fetch_add(1);
      if (!out.Push(seqs[i], std::move(items[i]), bytes)) return;
    }
  }
}

void RunStream::BatchWorker(int si) {
  Stage& s = *stages_[si];
  BatchAssembler& assembler = *s.assembler;
  BusySampler sampler;
  while (true) {
    if (LeaveIfAboveTarget(si)) return;
    ItemGroup items;
    GroupSeqs seqs;
    uint64_t end = 0;
    const auto r = PopGroup(si, &items, &seqs, &end);
    if (r == ItemQueue::PopResult::kCancelled) return;
    if (r == ItemQueue::PopResult::kEnd) {
      assembler.SetInputEnd(end);
      s.finished = true;
      return;
    }
    // The steps and writing into the batch (and finishing it) are the
    // stage's work: two clock reads per timed group (three with metrics,
    // which time the steps alone).
    ExecutorMetrics* m = ctx_.metrics;
    const int64_t weight = m != nullptr ? 1 : sampler.Next();
    const bool timed = weight > 0;
    const absl::Time t0 = timed ? ctx_.clock->Now() : absl::InfinitePast();
    const ItemRefs elements = Elements(items);
    if (!elements.empty() && !s.plan->steps.empty()) {
      Process(s, elements);
      if (m != nullptr) {
        const double steps = absl::ToDoubleSeconds(ctx_.clock->Now() - t0);
        m->stages[si].busy->Increment(steps);
        const double each = steps / static_cast<double>(elements.size());
        for (size_t i = 0; i < elements.size(); ++i) {
          m->stages[si].latency->Observe(each);
        }
      }
    }
    for (size_t i = 0; i < items.size(); ++i) {
      Item& item = items[i];
      const bool marker = item.element() != nullptr && item.element()->end_of_run;
      if ((item.element() != nullptr && !marker) || !item.status().ok()) {
        s.elements.fetch_add(1);
        if (m != nullptr) m->stages[si].elements->Increment();
      }
      assembler.Add(seqs[i], std::move(item));
    }
    if (timed) {
      const absl::Duration busy = ctx_.clock->Now() - t0;
      s.busy_ns.fetch_add(weight * absl::ToInt64Nanoseconds(busy));
      sampler.Timed(busy);
    }
  }
}

void RunStream::EmitBatch(int si, uint64_t k, absl::StatusOr<Element> batch) {
  Item out;
  if (!batch.ok()) {
    out = Item::Error(batch.status());
  } else if (batch->end_of_run) {
    out = Item(std::make_unique<Element>(*std::move(batch)), ctx_.live);
  } else {
    auto e = std::make_unique<Element>(std::move(*batch));
    absl::Status status;
    for (const auto& [slot, ops] : stages_[si]->plan->vectorized) {
      for (const auto& op : ops) {
        auto r = op->ApplyBatch(std::move(e->columns[slot]));
        if (!r.ok()) {
          status = absl::Status(r.status().code(), absl::StrCat("batch ", k, " (", Sv(op->name()),
                                                                "): ", r.status().message()));
          break;
        }
        e->columns[slot] = std::move(*r);
      }
      if (!status.ok()) break;
    }
    out = status.ok() ? Item(std::move(e), ctx_.live) : Item::Error(status);
  }
  const int64_t bytes = out.bytes();
  if (si + 1 == static_cast<int>(queues_.size())) outputs_waiting_.fetch_add(1);
  queues_[si]->Push(k, std::move(out), bytes);
}

bool RunStream::LeaveIfAboveTarget(int si) {
  Stage& s = *stages_[si];
  int now = s.threads.load();
  while (now > s.target.load()) {
    if (s.threads.compare_exchange_weak(now, now - 1)) return true;
  }
  return false;
}

void RunStream::AddWorker(int si) {
  if (cancelled_ || stages_[si]->finished) return;
  Stage& s = *stages_[si];
  if (s.threads.load() > s.target.fetch_add(1)) {
    return;  // a worker that was about to leave stays instead
  }
  s.threads.fetch_add(1);
  if (ctx_.thread_starts != nullptr) ctx_.thread_starts->fetch_add(1);
  if (stages_[si]->plan->batch) {
    workers_.emplace_back([this, si] { BatchWorker(si); });
  } else {
    workers_.emplace_back([this, si] { ElementWorker(si); });
  }
  int total = 0;
  for (const auto& s : stages_) total += s->threads.load();
  peak_threads_ = std::max(peak_threads_, total);
}

// Every autotune_interval: samples the stages' counters and queues, sets the
// queue-depth gauges and, with autotune on, applies DecideAutotune (more
// threads, queue limits). Until the first interval in which an element
// finished, intervals are a fifth as long: a stream starts with one thread
// per AUTOTUNE stage, and the first decision (a second thread for a starved
// consumer) then comes once the first elements are measured, not a whole
// interval after the start.
void RunStream::Autotune() {
  const int n = static_cast<int>(stages_.size());
  std::vector<uint64_t> last_elements(n, 0);
  std::vector<int64_t> last_busy(n, 0);
  absl::Duration last_wait;
  absl::Time last = ctx_.clock->Now();
  bool measured = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Duration interval =
          measured ? ctx_.autotune_interval : ctx_.autotune_interval / 5;
      if (mu_.AwaitWithTimeout(absl::Condition(&cancelled_), interval)) {
        return;
      }
    }
    AutotuneInput in;
    in.cpu_budget =
        ctx_.live_cpu_budget != nullptr ? ctx_.live_cpu_budget->load() : ctx_.cpu_budget;
    in.memory_budget_bytes = ctx_.memory_budget_bytes;
    in.prefetch = ctx_.plan->prefetch;
    for (int i = 0; i < n; ++i) {
      const Stage& s = *stages_[i];
      const auto snap = queues_[i]->snapshot();
      if (ExecutorMetrics* m = ctx_.metrics) m->stages[i].depth->Set(snap.items);
      StageSample sample;
      sample.threads = s.target.load();
      sample.tunable = s.plan->parallelism == kAutotune && ctx_.autotune;
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
        const absl::Time now = ctx_.clock->Now();
        const double interval = absl::ToDoubleSeconds(now - last);
        in.interval_seconds = interval;
        in.consumer_wait_fraction =
            interval > 0 ? absl::ToDoubleSeconds(snap.empty_wait - last_wait) / interval : 1;
        last_wait = snap.empty_wait;
        last = now;
      }
    }
    // Between runs the stages wait for the feed: nothing to learn from the
    // interval, and the thread counts stay for the next run.
    uint64_t processed = 0;
    for (const StageSample& sample : in.stages) processed += sample.elements;
    if (processed == 0 && FeedIdle()) continue;
    if (processed > 0) measured = true;
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    if (!ctx_.autotune) continue;  // metrics only
    const AutotuneDecision d = DecideAutotune(in);
    for (int i = 0; i < n; ++i) {
      Stage& s = *stages_[i];
      if (d.threads[i] < s.target.load()) s.target = std::max(1, d.threads[i]);
    }
    // A released thread leaves at its next element boundary: until then it
    // still counts, so a new thread starts only while the running ones fit.
    int running = 0;
    for (const auto& s : stages_) running += s->threads.load();
    for (int i = 0; i < n; ++i) {
      Stage& s = *stages_[i];
      while (s.target.load() < d.threads[i] && !s.finished && !cancelled_) {
        const bool spawns = s.threads.load() <= s.target.load();
        if (spawns && running >= in.cpu_budget) break;
        if (spawns) ++running;
        AddWorker(i);
      }
      const int64_t group = i + 1 < n ? stages_[i + 1]->group : 1;
      queues_[i]->SetLimits(std::max<int64_t>(d.queue_capacity[i], group), d.queue_bytes[i]);
    }
  }
}

void RunStream::Popped() {
  outputs_waiting_.fetch_sub(1);
  if (ctx_.budget != nullptr) ctx_.budget->Poke();
}

void RunStream::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  budget_cancelled_ = true;
  if (ctx_.budget != nullptr) ctx_.budget->Poke();
  {
    absl::MutexLock lock(&feed_mu_);
    feed_cancelled_ = true;
  }
  for (auto& q : queues_) q->Cancel();
  for (auto& s : stages_) {
    if (s->assembler) s->assembler->Cancel();
  }
}

void RunStream::Join() {
  if (autotuner_.joinable()) autotuner_.join();
  std::vector<std::thread> ws;
  {
    absl::MutexLock lock(&mu_);
    ws = std::move(workers_);
  }
  for (auto& t : ws) t.join();
}

void RunStream::Clear() {
  for (auto& q : queues_) q->Clear();
  for (auto& s : stages_) {
    if (s->assembler) s->assembler->Clear();
  }
}

}  // namespace sluice::data_worker::pipeline
