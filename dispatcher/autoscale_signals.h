// The autoscaling signals: what the dispatcher keeps of each consumer's and worker's heartbeats
// between two scale decisions (docs/autoscaling.md, "The signals"). DispatcherImpl owns them and
// turns them into the Autoscaler's input each period; they hold no lock of their own.
#ifndef SLUICE_DISPATCHER_AUTOSCALE_SIGNALS_H_
#define SLUICE_DISPATCHER_AUTOSCALE_SIGNALS_H_

#include <cstdint>
#include <map>

#include "absl/time/time.h"

namespace sluice::dispatcher {

// What one consumer (trainer) last reported, and its rates over the window since the previous
// scale decision (ClientHeartbeat).
struct ConsumerSignal {
  double buffer_fill = 0;
  double wait_seconds_total = 0;
  double wait_fraction = 0;
  absl::Time last_report = absl::InfinitePast();
  uint64_t batches_returned_total = 0;
  uint64_t epoch = 0;
  absl::Time epoch_started = absl::InfinitePast();
  // How long its previous epoch lasted (0: unknown, it began before the consumer's first report).
  double previous_epoch_seconds = 0;
  // At the previous scale decision, and the rates over that window.
  absl::Time window_start = absl::InfinitePast();
  uint64_t window_batches = 0;
  double window_wait = 0;
  double batches_per_second = 0;
  double window_wait_fraction = 0;
  // The last report whose counters moved (a batch returned, or time waited), and the longest
  // stretch of the window in which they did not: at least this long the trainer neither received
  // nor waited (ConsumerSample::longest_idle_seconds: its step, or a pause).
  absl::Time last_active = absl::InfinitePast();
  double window_longest_idle = 0;
  // Its iterator was closed (ClientHeartbeatRequest.leaving): away without waiting for the
  // lease.
  bool left = false;
};
// A worker's cumulative elements and busy seconds (for all jobs or one),
// and the capacity measured over the window since the previous decision.
struct BusyCounter {
  uint64_t elements_total = 0;
  double busy_seconds_total = 0;
  uint64_t window_elements = 0;
  double window_busy = 0;
  bool window_set = false;
  double elements_per_busy_second = 0;

  // A heartbeat's cumulative counters; smaller than the last ones means
  // the worker restarted (or forgot the job): the window starts again.
  void Report(uint64_t elements, double busy_seconds);
  // Ends the window if it holds enough busy time to measure (0.05 s);
  // otherwise the last capacity stays and the window stays open.
  void Measure();
};
// What one worker last reported (WorkerHeartbeat): liveness, queues, capacity.
struct WorkerSignal {
  absl::Time last_seen;
  absl::Time registered = absl::InfinitePast();
  double elements_per_second = 0;
  uint64_t queue_depth = 0;
  uint64_t queue_capacity = 0;
  uint32_t blocked_producers = 0;
  // All jobs together, and per job (WorkerHeartbeatRequest.job_busy; empty
  // from a worker that reports only totals).
  BusyCounter all;
  std::map<uint64_t, BusyCounter> jobs;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_AUTOSCALE_SIGNALS_H_
