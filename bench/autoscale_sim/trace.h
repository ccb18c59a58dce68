// Load traces for `autoscale_sim --trace FILE`: jobs arriving and leaving,
// step times, per-element costs, worker failures, and the pool's bound. The
// traces the policies were first tuned on are in bench/autoscale_sim/traces/
// tune/. Four held-out sets followed, each committed before any policy ran on
// it and reported blind first: traces/heldout/, heldout2/, heldout3/ and
// heldout4/. Once reported, a set is a tuning set too (the rule:
// tune only on the repo's traces, report the others separately); the next
// blind report needs a new set (docs/BENCHMARKS.md says which figures were
// blind).
//
// Format: one directive per line; '#' starts a comment; blank lines are
// ignored. Times in seconds from the start; the `at` lines in time order
// (lines of the same time apply in file order).
//
//   duration 600          seconds simulated (required)
//   max_workers 8         the pool's bound (default: the simulator's, 128)
//   initial_workers 0     workers at t=0 (default 0: the oracle's count)
//   measure_from 0        worker-seconds and wait are counted from here
//   at T job ID consumers=N batch=B step=S rate=R [work=E] [priority=P]
//                         [min_workers=M] [buffer=K]
//                         job ID arrives: N trainers, batches of B elements
//                         every S seconds each; one worker makes R elements
//                         per second of it (or cost=C worker-seconds per
//                         element); it completes after consuming E elements
//                         (default: never); its clients buffer K batches each
//   at T demand xF        every job's step time ÷ F
//   at T cost ID xF       job ID's cost per element × F
//   at T lose_worker      the oldest ready worker dies
//   at T slow_worker xF   the oldest ready worker's speed × F
//   at T priority ID P    job ID's priority becomes P (an integer)
//   at T stop ID          job ID's trainers leave (a job whose work is not
//                         done ends there: its JCT is T - its arrival, and
//                         it counts as unfinished)
//   at T stop all         every trainer leaves
//
// Checked (a trace that breaks one is refused, naming the line): numbers are
// decimal; counts are whole numbers within an int (max_workers and
// initial_workers at most 100000, initial_workers at most max_workers); each
// directive and each job key is given once; jobs arriving at 0 come before the
// events at 0; no event names a job that left; no job needs more than 1e6
// workers (its demand x cost, after the demand and cost events);
// duration is at most 1e6 s; measure_from and every event come before it; a
// file holds at most 16 MiB.
//
// Example: two jobs under a pool of 8 workers; job 2 arrives at 20 s with
// priority 1 and completes after 60000 elements.
//
//   duration 300
//   max_workers 8
//   at 0 job 1 consumers=2 batch=64 step=0.25 rate=100 work=100000
//   at 20 job 2 consumers=1 batch=32 step=0.1 rate=80 work=60000 priority=1
#ifndef SLUICE_BENCH_AUTOSCALE_SIM_TRACE_H_
#define SLUICE_BENCH_AUTOSCALE_SIM_TRACE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/autoscale_sim/sim.h"

namespace sluice::autoscale_sim {

// Parses `text`; `name` names it in errors and in the Scenario. Errors:
// InvalidArgument naming the line and the directive or key at fault.
absl::StatusOr<Scenario> ParseTrace(absl::string_view text, const std::string& name);

// Reads and parses the file at `path`: NotFound if it cannot be read.
absl::StatusOr<Scenario> ReadTrace(const std::string& path);

}  // namespace sluice::autoscale_sim

#endif  // SLUICE_BENCH_AUTOSCALE_SIM_TRACE_H_
