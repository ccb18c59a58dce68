#include "data_worker/pipeline/autotune.h"

#include <algorithm>

namespace sluice::data_worker::pipeline {

AutotuneDecision DecideAutotune(const AutotuneInput& in) {
  AutotuneDecision d;
  const size_t n = in.stages.size();
  int total = 0;
  for (const auto& s : in.stages) {
    d.threads.push_back(s.threads);
    total += s.threads;
  }
  // 1. Give a thread back: while the total is over the budget (the budget
  // shrank), the tunable stage with the most capacity loses one; otherwise a
  // tunable stage whose threads sat idle for more than kIdleThreads thread-
  // intervals loses one (it holds a budget slot another stage could use).
  auto capacity = [&](size_t i) {
    const auto& s = in.stages[i];
    if (s.elements == 0 || s.busy_seconds <= 0) return 1e300;  // unknown
    return d.threads[i] / (s.busy_seconds / s.elements);       // elements/s
  };
  auto can_release = [&](size_t i) {
    return in.stages[i].tunable && !in.stages[i].finished && d.threads[i] > 1;
  };
  while (total > in.cpu_budget) {
    int victim = -1;
    for (size_t i = 0; i < n; ++i) {
      if (can_release(i) && (victim < 0 || capacity(i) > capacity(victim))) {
        victim = static_cast<int>(i);
      }
    }
    if (victim < 0) break;  // only fixed or single-thread stages left
    --d.threads[victim];
    --total;
    d.released = victim;
  }
  if (d.released < 0 && in.interval_seconds > 0) {
    constexpr double kIdleThreads = 1.5;
    for (size_t i = 0; i < n; ++i) {
      const double idle = d.threads[i] - in.stages[i].busy_seconds / in.interval_seconds;
      if (can_release(i) && idle > kIdleThreads) {
        --d.threads[i];
        --total;
        d.released = static_cast<int>(i);
        break;  // one per interval
      }
    }
  }
  // 2. One more thread for the stage with the lowest capacity (threads / mean
  // busy time), while the budget allows and the consumer still waits for
  // data. Not the stage that just gave one back.
  if (total < in.cpu_budget && in.consumer_wait_fraction > 0.02) {
    double best = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto& s = in.stages[i];
      if (s.elements == 0 || s.busy_seconds <= 0) continue;
      if (static_cast<int>(i) == d.released) continue;
      const double c = capacity(i);
      if (d.bottleneck < 0 || c < best) {
        best = c;
        d.bottleneck = static_cast<int>(i);
      }
    }
    if (d.bottleneck >= 0 &&
        (!in.stages[d.bottleneck].tunable || in.stages[d.bottleneck].finished)) {
      // The bottleneck is fixed by the spec: nothing to gain elsewhere.
      d.bottleneck = -1;
    }
    if (d.bottleneck >= 0) ++d.threads[d.bottleneck];
  }
  // 3. Queue sizes: twice the consumer stage's threads (the prefetch size for
  // the last queue), then scaled down so that capacity × largest element fits
  // the memory budget.
  std::vector<int64_t> want(n);
  for (size_t i = 0; i < n; ++i) {
    if (i + 1 < n) {
      want[i] = std::max(2, 2 * d.threads[i + 1]);
    } else {
      want[i] = in.prefetch > 0 ? in.prefetch : 2;
    }
  }
  double need = 0;
  for (size_t i = 0; i < n; ++i) need += double(want[i]) * in.stages[i].max_element_bytes;
  const double budget = static_cast<double>(in.memory_budget_bytes);
  for (size_t i = 0; i < n; ++i) {
    const int64_t bytes = in.stages[i].max_element_bytes;
    double share = n > 0 ? budget / n : budget;
    if (need > 0) share = budget * (double(want[i]) * bytes) / need;
    if (need <= budget || bytes == 0) {
      d.queue_capacity.push_back(want[i]);
      d.queue_bytes.push_back(static_cast<int64_t>(
          need <= budget && need > 0 ? budget * (double(want[i]) * bytes) / need : share));
    } else {
      d.queue_capacity.push_back(std::max<int64_t>(1, static_cast<int64_t>(share / bytes)));
      d.queue_bytes.push_back(static_cast<int64_t>(share));
    }
  }
  return d;
}

}  // namespace sluice::data_worker::pipeline
