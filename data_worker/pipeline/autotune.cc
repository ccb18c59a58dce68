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
  // 1. One more thread for the stage with the lowest capacity (threads / mean
  // busy time), while
  //    the budget allows and the consumer still waits for data.
  if (total < in.cpu_budget && in.consumer_wait_fraction > 0.02) {
    double best = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto& s = in.stages[i];
      if (s.elements == 0 || s.busy_seconds <= 0) continue;
      const double capacity =
          s.threads / (s.busy_seconds / s.elements);  // elements/s
      if (d.bottleneck < 0 || capacity < best) {
        best = capacity;
        d.bottleneck = static_cast<int>(i);
      }
    }
    if (d.bottleneck >= 0 && (!in.stages[d.bottleneck].tunable ||
                              in.stages[d.bottleneck].finished)) {
      d.bottleneck =
          -1;  // the bottleneck is fixed by the spec: nothing to gain elsewhere
    }
    if (d.bottleneck >= 0) ++d.threads[d.bottleneck];
  }
  // 2. Queue sizes: twice the consumer stage's threads (the prefetch size for
  // the last queue),
  //    then scaled down so that capacity × largest element fits the memory
  //    budget.
  std::vector<int64_t> want(n);
  for (size_t i = 0; i < n; ++i) {
    if (i + 1 < n) {
      want[i] = std::max(2, 2 * d.threads[i + 1]);
    } else {
      want[i] = in.prefetch > 0 ? in.prefetch : 2;
    }
  }
  double need = 0;
  for (size_t i = 0; i < n; ++i)
    need += double(want[i]) * in.stages[i].max_element_bytes;
  const double budget = static_cast<double>(in.memory_budget_bytes);
  for (size_t i = 0; i < n; ++i) {
    const int64_t bytes = in.stages[i].max_element_bytes;
    double share = n > 0 ? budget / n : budget;
    if (need > 0) share = budget * (double(want[i]) * bytes) / need;
    if (need <= budget || bytes == 0) {
      d.queue_capacity.push_back(want[i]);
      d.queue_bytes.push_back(static_cast<int64_t>(
          need <= budget && need > 0 ? budget * (double(want[i]) * bytes) / need
                                     : share));
    } else {
      d.queue_capacity.push_back(
          std::max<int64_t>(1, static_cast<int64_t>(share / bytes)));
      d.queue_bytes.push_back(static_cast<int64_t>(share));
    }
  }
  return d;
}

}  // namespace sluice::data_worker::pipeline
