// autoscale_sim: sluice's autoscaling policy next to Cachew's, tf.data
// service's and a CPU HPA on the same load steps (sim.h explains the model;
// docs/BENCHMARKS.md records the results). Prints a Markdown table; --csv
// writes it as CSV, --series the per-period trace of the combined scenario
// for bench/autoscale_sim/plot.py.
//
//   autoscale_sim [--csv out.csv] [--series series.csv] [--seed 1]
//                 [--seeds 20] [--headroom 1.05] [--reasons] [--periods]
//                 [--bench-trace bench.csv --bench-startup 0.6 ...]
//   autoscale_sim --trace FILE... [--seeds 5]
//                 replays trace files (trace.h) instead: per trace and
//                 policy, worker-seconds / oracle, trainer wait, periods to
//                 converge, direction changes, mean and p90 job completion
//                 time, and the goals against the best peer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/autoscale_sim/sim.h"
#include "bench/autoscale_sim/trace.h"

namespace sluice::autoscale_sim {
namespace {

JobSpec BaseJob() {
  // 4 trainers, batch 64, a 250 ms step: 1024 elements/s. A worker produces
  // 120 elements/s: 8.53 workers.
  return JobSpec{
      .id = 1, .consumers = 4, .batch_size = 64, .step_seconds = 0.25, .cost = 1.0 / 120};
}

JobSpec SecondJob() {
  // 2 trainers, batch 32, a 100 ms step: 640 elements/s at 80 elements/s
  // per worker: 8 more workers.
  return JobSpec{.id = 2, .consumers = 2, .batch_size = 32, .step_seconds = 0.1, .cost = 1.0 / 80};
}

using Kind = LoadStep::Kind;

std::vector<Scenario> StepScenarios() {
  auto one = [](std::string name, LoadStep step) {
    step.at = 31;  // mid-period: the first window after it is mixed
    return Scenario{.name = std::move(name),
                    .jobs = {BaseJob()},
                    .steps = {step},
                    .duration = 90,
                    .measure_from = 30};
  };
  return {
      one("demand x2", {.kind = Kind::kDemandTimes, .factor = 2}),
      one("pipeline cost x3", {.kind = Kind::kCostTimes, .factor = 3}),
      one("a worker lost", {.kind = Kind::kLoseWorker}),
      one("second job arrives", {.kind = Kind::kAddJob, .job_spec = SecondJob()}),
      one("all consumers stop", {.kind = Kind::kAllStop}),
  };
}

Scenario Combined() {
  return Scenario{.name = "combined",
                  .jobs = {BaseJob()},
                  .steps = {{.at = 41, .kind = Kind::kDemandTimes, .factor = 2},
                            {.at = 81, .kind = Kind::kAddJob, .job_spec = SecondJob()},
                            {.at = 121, .kind = Kind::kCostTimes, .factor = 3},
                            {.at = 161, .kind = Kind::kLoseWorker},
                            {.at = 201, .kind = Kind::kAllStop}},
                  .duration = 260,
                  .measure_from = 0};
}

// The combined trace's mean trainer wait, until every trainer left (202 s).
double CombinedMeanWait(const RunResult& r) {
  double wait = 0;
  int n = 0;
  for (const PeriodRecord& p : r.periods) {
    if (p.time <= 202) {
      wait += p.wait;
      ++n;
    }
  }
  return n > 0 ? wait / n : 0;
}

// bench/autoscale.sh's run, replayed: one worker from the start (min 1, max
// 6), a sleep pipeline of ~198 elements per busy second per worker (20 ms per
// element on 2 threads, 2 splits at a time) with no cold phase (sleeping is
// as fast cold as warm), job A (1 consumer, batch 8, 40 ms step: 200 el/s)
// from t=0, job B (batch 8, 20 ms step: 400 el/s) from t=join; B runs out of
// epochs at b_end, A at a_end. The simulator's clock starts `lead` seconds
// before the bench's t=0 (the worker registered that long before consumer A
// started); the trace is written in the bench's time.
struct BenchTrace {
  double join = 30, a_end = 82, b_end = 78, lead = 1, duration = 100;
};

Scenario BenchScenario(const BenchTrace& b) {
  const JobSpec a{
      .id = 1, .consumers = 1, .batch_size = 8, .step_seconds = 0.04, .cost = 1.0 / 198};
  JobSpec j = a;
  j.id = 2;
  j.step_seconds = 0.02;
  return Scenario{.name = "bench/autoscale.sh",
                  .jobs = {},
                  .steps = {{.at = b.lead, .kind = Kind::kAddJob, .job_spec = a},
                            {.at = b.lead + b.join, .kind = Kind::kAddJob, .job_spec = j},
                            {.at = b.lead + b.b_end, .kind = Kind::kJobStop, .job = 2},
                            {.at = b.lead + b.a_end, .kind = Kind::kJobStop, .job = 1}},
                  .duration = b.lead + b.duration,
                  .initial_workers = 1,
                  .measure_from = 0};
}

// The true need after the scenario's (single) step.
double NeedAfter(const Scenario& s, const std::vector<PeriodRecord>& periods) {
  for (const PeriodRecord& r : periods) {
    if (r.time > s.measure_from + 1e-9) return r.need;
  }
  return 0;
}

struct Metrics {
  int converge = -1;  // periods; -1 = never
  double wait_after = 0;
  bool wait_measured = false;
  double wait_all = 0;  // over every period after the step
  double cost_ratio = 0;
  int direction_changes = 0;
};

Metrics Measure(const Scenario& s, const RunResult& r, const WorldOptions& o) {
  Metrics m;
  std::vector<const PeriodRecord*> after;
  int before = 0;
  for (const PeriodRecord& p : r.periods) {
    if (p.time > s.measure_from + 1e-9) {
      after.push_back(&p);
    } else {
      before = p.desired;
    }
  }
  const double need = NeedAfter(s, r.periods);
  const int low = OracleWorkers(need, o);
  const int high =
      std::min(o.max_workers, std::max(OracleWorkers(need * 1.25, o), OracleWorkers(need, o) + 1));
  // The first period from which every decision stays in [low, high].
  int first_ok = -1;
  for (size_t i = 0; i < after.size(); ++i) {
    const bool ok = after[i]->desired >= low && after[i]->desired <= high;
    if (!ok) {
      first_ok = -1;
    } else if (first_ok < 0) {
      first_ok = static_cast<int>(i);
    }
  }
  m.converge = first_ok < 0 ? -1 : first_ok + 1;
  // Wait once the converged workers could be up: from the decision plus the
  // start-up and the cold time, rounded to whole periods.
  double from = after.empty() ? 0 : after.back()->time - 10 * o.period;
  if (first_ok >= 0) {
    from = after[static_cast<size_t>(first_ok)]->time + o.startup_delay + o.cold_seconds;
  }
  double wait = 0;
  int n = 0;
  for (const PeriodRecord* p : after) {
    if (p->time - o.period >= from - 1e-9) {
      wait += p->wait;
      ++n;
    }
  }
  double all = 0;
  for (const PeriodRecord* p : after) all += p->wait;
  m.wait_all = after.empty() ? 0 : all / static_cast<double>(after.size());
  m.wait_measured = n > 0 && first_ok >= 0;
  m.wait_after = n > 0 ? wait / n : 0;
  m.cost_ratio = r.oracle_worker_seconds > 0 ? r.worker_seconds / r.oracle_worker_seconds : 0;
  int last_sign = 0, previous = before;
  for (const PeriodRecord* p : after) {
    const int diff = p->desired - previous;
    previous = p->desired;
    if (diff == 0) continue;
    const int sign = diff > 0 ? 1 : -1;
    if (last_sign != 0 && sign != last_sign) ++m.direction_changes;
    last_sign = sign;
  }
  return m;
}

struct PolicyFactory {
  std::string name;
  // The policy for a pool of at most `max_workers` (the dispatcher's
  // --max-workers).
  std::function<std::unique_ptr<Policy>(int max_workers)> make;
};

// What --trace reports for one run.
struct TraceMetrics {
  double cost_ratio = 0;  // worker-seconds / oracle's
  double wait = 0;        // trainer-seconds waiting / trainer-seconds
  double converge = 0;    // mean periods to converge over converged events
  int events = 0;
  int never = 0;  // events after which it never converged
  int direction_changes = 0;
  double jct_mean = 0;  // over jobs with work that completed
  double jct_p90 = 0;
  int jobs_with_work = 0;
  int unfinished = 0;  // jobs with work that did not complete
};

// Periods from each event (a load step, a job completing) until the decision
// enters the oracle's band and stays there until the next event.
void MeasureConvergence(const Scenario& s, const RunResult& r, const WorldOptions& o,
                        TraceMetrics& m) {
  std::vector<double> events;
  for (const LoadStep& step : s.steps) events.push_back(step.at);
  for (const JobRecord& j : r.jobs) {
    if (j.completed >= 0) events.push_back(j.completed);
  }
  std::sort(events.begin(), events.end());
  events.erase(
      std::unique(events.begin(), events.end(), [](double a, double b) { return b - a < 1e-6; }),
      events.end());
  const int max_workers = s.max_workers > 0 ? s.max_workers : o.max_workers;
  WorldOptions bounded = o;
  bounded.max_workers = max_workers;
  double sum = 0;
  for (size_t e = 0; e < events.size(); ++e) {
    const double end = e + 1 < events.size() ? events[e + 1] : s.duration + 1;
    std::vector<const PeriodRecord*> segment;
    for (const PeriodRecord& p : r.periods) {
      if (p.time > events[e] + 1e-9 && p.time <= end + 1e-9) {
        segment.push_back(&p);
      }
    }
    if (segment.empty()) continue;
    const double need = segment.back()->need;
    const int low = OracleWorkers(need, bounded);
    const int high = std::min(max_workers, std::max(OracleWorkers(need * 1.25, bounded), low + 1));
    int first_ok = -1;
    for (size_t i = 0; i < segment.size(); ++i) {
      const bool ok = segment[i]->desired >= low && segment[i]->desired <= high;
      if (!ok) {
        first_ok = -1;
      } else if (first_ok < 0) {
        first_ok = static_cast<int>(i);
      }
    }
    ++m.events;
    if (first_ok < 0) {
      ++m.never;
    } else {
      sum += first_ok + 1;
    }
  }
  const int converged = m.events - m.never;
  m.converge = converged > 0 ? sum / converged : 0;
}

TraceMetrics MeasureTrace(const Scenario& s, const RunResult& r, const WorldOptions& o) {
  TraceMetrics m;
  m.cost_ratio = r.oracle_worker_seconds > 0 ? r.worker_seconds / r.oracle_worker_seconds : 0;
  m.wait = r.trainer_seconds > 0 ? r.wait_seconds / r.trainer_seconds : 0;
  MeasureConvergence(s, r, o, m);
  int last_sign = 0, previous = -1;
  for (const PeriodRecord& p : r.periods) {
    if (previous >= 0 && p.desired != previous) {
      const int sign = p.desired > previous ? 1 : -1;
      if (last_sign != 0 && sign != last_sign) ++m.direction_changes;
      last_sign = sign;
    }
    previous = p.desired;
  }
  std::vector<double> jct;
  std::map<uint64_t, double> work;
  for (const JobSpec& j : s.jobs) work[j.id] = j.work;
  for (const LoadStep& step : s.steps) {
    if (step.kind == LoadStep::Kind::kAddJob) {
      work[step.job_spec.id] = step.job_spec.work;
    }
  }
  for (const JobRecord& j : r.jobs) {
    if (work[j.id] <= 0) continue;
    ++m.jobs_with_work;
    if (j.completed < 0) {
      ++m.unfinished;
      // Its trainers left first: it ended then, whatever the policy (no policy can make a job
      // that is cancelled end later). Still running at the end: counted as running to the
      // end, a lower bound on its JCT.
      jct.push_back((j.stopped >= 0 ? j.stopped : s.duration) - j.arrived);
    } else {
      jct.push_back(j.completed - j.arrived);
    }
  }
  if (!jct.empty()) {
    double sum = 0;
    for (double x : jct) sum += x;
    m.jct_mean = sum / static_cast<double>(jct.size());
    std::sort(jct.begin(), jct.end());
    // Nearest rank.
    const size_t rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(jct.size())));
    m.jct_p90 = jct[std::max<size_t>(rank, 1) - 1];
  }
  return m;
}

struct Range {
  double sum = 0, min = 1e300, max = -1e300;
  int n = 0;
  void Add(double x) {
    sum += x;
    min = std::min(min, x);
    max = std::max(max, x);
    ++n;
  }
  double mean() const { return n > 0 ? sum / n : 0; }
};

// a / b in `format`, or "-" where it is not a number (nothing measured).
std::string Ratio(double a, double b, const absl::FormatSpec<double>& format) {
  return b > 0 && std::isfinite(a / b) ? absl::StrFormat(format, a / b) : "-";
}

int RunTraces(const std::vector<std::string>& paths, const std::vector<PolicyFactory>& policies,
              const WorldOptions& o, int seeds, const dispatcher::AutoscalerOptions& sluice_options,
              bool reasons, bool periods) {
  std::vector<Scenario> scenarios;
  for (const std::string& path : paths) {
    absl::StatusOr<Scenario> s = ReadTrace(path);
    if (!s.ok()) {
      std::fprintf(stderr, "autoscale_sim: %s\n", std::string(s.status().message()).c_str());
      return 2;
    }
    scenarios.push_back(*std::move(s));
  }
  absl::PrintF(
      "# period %.0f s, start-up %.0f s, cold %.0f s at %.0f%%, speed jitter "
      "+-%.0f%%, measurement noise +-%.0f%%, seeds 1..%d, sluice headroom "
      "%.2f (noise z %.1f, at least %.2f)\n",
      o.period, o.startup_delay, o.cold_seconds, o.cold_speed * 100, o.speed_jitter * 100,
      o.measure_noise * 100, seeds, sluice_options.headroom, sluice_options.noise_z,
      sluice_options.min_headroom);
  absl::PrintF(
      "# per policy: mean over seeds (min-max); converge = mean periods from "
      "an event until the count stays in the oracle's band (never: events it "
      "never settled after, over all seeds); JCT of a job that did not complete "
      "(unfinished): until its trainers left, or until the end\n");
  for (const Scenario& s : scenarios) {
    absl::PrintF(
        "\n%s (max_workers %d)\n\n| policy | worker-s / oracle | trainer "
        "wait | periods to converge | never | direction changes | mean JCT s "
        "| p90 JCT s | unfinished |\n|---|---|---|---|---|---|---|---|---|\n",
        s.name, s.max_workers > 0 ? s.max_workers : o.max_workers);
    struct Summary {
      std::string name;
      Range cost, wait, converge, changes, jct, p90;
      int never = 0, events = 0, unfinished = 0, jobs = 0;
    };
    std::vector<Summary> summaries;
    std::string reason_lines;  // --reasons: sluice's, seed 1, after the table
    // --periods: every policy's decision per period, seed 1.
    std::map<double, std::pair<double, std::map<std::string, int>>> period_rows;
    // --periods on a trace with work: each job's completion per policy, seed 1.
    std::map<uint64_t, std::pair<double, std::map<std::string, std::string>>> job_rows;
    for (const PolicyFactory& f : policies) {
      Summary sum{.name = f.name};
      for (int seed = 1; seed <= seeds; ++seed) {
        WorldOptions so = o;
        so.seed = static_cast<uint64_t>(seed);
        std::unique_ptr<Policy> policy = f.make(s.max_workers > 0 ? s.max_workers : o.max_workers);
        const RunResult r = Run(s, *policy, so);
        if (reasons && seed == 1 && &f == &policies.front()) {
          int last = -1;
          for (const PeriodRecord& p : r.periods) {
            if (p.desired != last) {
              absl::StrAppendFormat(&reason_lines, "    t=%5.1f  oracle %.0f  %s\n", p.time,
                                    p.oracle, p.reason);
            }
            last = p.desired;
          }
        }
        if (periods && seed == 1) {
          for (const PeriodRecord& p : r.periods) {
            auto& row = period_rows[p.time];
            row.first = p.oracle;
            row.second[f.name] = p.desired;
          }
          for (const JobRecord& j : r.jobs) {
            auto& row = job_rows[j.id];
            row.first = j.arrived;
            row.second[f.name] = j.completed >= 0 ? absl::StrFormat("%.1f", j.completed - j.arrived)
                                 : j.stopped >= 0 ? absl::StrFormat("stopped at %.1f", j.stopped)
                                                  : "-";
          }
        }
        const TraceMetrics m = MeasureTrace(s, r, so);
        sum.cost.Add(m.cost_ratio);
        sum.wait.Add(100 * m.wait);
        if (m.events > m.never) sum.converge.Add(m.converge);
        sum.never += m.never;
        sum.events += m.events;
        sum.changes.Add(m.direction_changes);
        sum.jobs = m.jobs_with_work;
        if (m.jobs_with_work > 0) {
          sum.jct.Add(m.jct_mean);
          sum.p90.Add(m.jct_p90);
        }
        sum.unfinished += m.unfinished;
      }
      const std::string jct = sum.jobs > 0 ? absl::StrFormat("%.1f (%.1f-%.1f)", sum.jct.mean(),
                                                             sum.jct.min, sum.jct.max)
                                           : "-";
      const std::string p90 = sum.jobs > 0 ? absl::StrFormat("%.1f", sum.p90.mean()) : "-";
      absl::PrintF(
          "| %s | %.3f (%.2f-%.2f) | %.1f%% (%.1f-%.1f) | %s | %d/%d | %.1f "
          "(max %.0f) | %s | %s | %d |\n",
          f.name, sum.cost.mean(), sum.cost.min, sum.cost.max, sum.wait.mean(), sum.wait.min,
          sum.wait.max, sum.converge.n > 0 ? absl::StrFormat("%.1f", sum.converge.mean()) : "-",
          sum.never, sum.events, sum.changes.mean(), sum.changes.max, jct, p90, sum.unfinished);
      summaries.push_back(sum);
    }
    if (!reason_lines.empty()) absl::PrintF("\nsluice's decisions (seed 1):\n%s", reason_lines);
    if (!period_rows.empty()) {
      absl::PrintF("\nper period (seed 1): time, oracle, each policy's decision\n\n| t | oracle |");
      for (const PolicyFactory& f : policies) absl::PrintF(" %s |", f.name);
      std::string separator;
      for (size_t i = 0; i < policies.size(); ++i) separator += "---|";
      absl::PrintF("\n|---|---|%s\n", separator);
      for (const auto& [t, row] : period_rows) {
        absl::PrintF("| %.1f | %.0f |", t, row.first);
        for (const PolicyFactory& f : policies) {
          auto d = row.second.find(f.name);
          absl::PrintF("%s", d == row.second.end() ? " |" : absl::StrFormat(" %d |", d->second));
        }
        absl::PrintF("\n");
      }
    }
    if (job_rows.size() >= 2) {
      absl::PrintF(
          "\nper job (seed 1): arrival, each policy's completion time (s)\n\n| job | arrived |");
      for (const PolicyFactory& f : policies) absl::PrintF(" %s |", f.name);
      std::string separator;
      for (size_t i = 0; i < policies.size(); ++i) separator += "---|";
      absl::PrintF("\n|---|---|%s\n", separator);
      for (const auto& [id, row] : job_rows) {
        absl::PrintF("| %d | %.1f |", id, row.first);
        for (const PolicyFactory& f : policies) absl::PrintF(" %s |", row.second.at(f.name));
        absl::PrintF("\n");
      }
    }
    // The goals, against the best faithful peer.
    const Summary& sl = summaries[0];
    if (sl.jobs >= 2) {
      double best = 1e300;
      std::string who;
      for (size_t i = 1; i < summaries.size(); ++i) {
        if (summaries[i].jct.mean() < best) {
          best = summaries[i].jct.mean();
          who = summaries[i].name;
        }
      }
      absl::PrintF("\nmean JCT: best peer (%s) %.1f s / sluice %.1f s = %s\n", who, best,
                   sl.jct.mean(), Ratio(best, sl.jct.mean(), "%.2fx"));
    } else {
      // The best peer that feeds the trainers as well (trainer wait at most
      // one point above sluice's): fewer worker-seconds bought with waiting
      // trainers is not a saving.
      double best = 1e300;
      std::string who;
      for (size_t i = 1; i < summaries.size(); ++i) {
        if (summaries[i].wait.mean() <= sl.wait.mean() + 1 && summaries[i].cost.mean() < best) {
          best = summaries[i].cost.mean();
          who = summaries[i].name;
        }
      }
      if (who.empty()) {
        absl::PrintF(
            "\nworker-seconds: sluice %.3f; no peer keeps trainer wait within "
            "1 point of sluice's %.1f%%\n",
            sl.cost.mean(), sl.wait.mean());
      } else {
        absl::PrintF(
            "\nworker-seconds: sluice %.3f / best peer at no more wait (%s) "
            "%.3f = %s\n",
            sl.cost.mean(), who, best, Ratio(sl.cost.mean(), best, "%.3f"));
      }
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"sluice autoscaling policies in a discrete-event simulator"};
  std::string csv_path, series_path;
  WorldOptions o;
  double headroom = dispatcher::AutoscalerOptions{}.headroom;
  double noise_z = dispatcher::AutoscalerOptions{}.noise_z;
  double min_headroom = dispatcher::AutoscalerOptions{}.min_headroom;
  app.add_option("--csv", csv_path, "write the table as CSV here");
  app.add_option("--series", series_path, "write the combined trace (per period, per policy) here");
  app.add_option("--seed", o.seed, "noise seed");
  int seeds = 20;
  app.add_option("--seeds", seeds, "also run seeds 1..N and print min-max over them (0: skip)");
  app.add_option("--headroom", headroom,
                 "sluice's headroom (the most it uses; all it uses with "
                 "--noise-z 0)");
  app.add_option("--noise-z", noise_z,
                 "sluice's headroom from the measured noise: 1 + z x need's "
                 "relative standard error (0: fixed --headroom)");
  app.add_option("--min-headroom", min_headroom, "the least headroom the noise can give");
  bool reasons = false;
  app.add_flag("--reasons", reasons,
               "print sluice's reason at each change in the combined trace (with --trace: in each "
               "trace, seed 1)");
  bool periods = false;
  app.add_flag("--periods", periods,
               "with --trace: print every policy's decision per period, and on a multi-job trace "
               "each job's completion time, (seed 1) after each table");
  std::string bench_path;
  app.add_option("--bench-trace", bench_path,
                 "replay bench/autoscale.sh's load with sluice's policy and "
                 "write its per-period trace (CSV) here");
  BenchTrace bench;
  double bench_startup = 0.6;
  app.add_option("--bench-join", bench.join, "job B joins (s)");
  app.add_option("--bench-a-end", bench.a_end, "job A ends (s)");
  app.add_option("--bench-b-end", bench.b_end, "job B ends (s)");
  app.add_option("--bench-startup", bench_startup,
                 "worker start-up delay measured on the real run (s)");
  std::vector<std::string> trace_paths;
  app.add_option("--trace", trace_paths,
                 "replay these trace files (bench/autoscale_sim/trace.h) "
                 "instead of the built-in steps; per policy over --seeds")
      ->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);

  dispatcher::AutoscalerOptions sluice_options;
  sluice_options.min_workers = o.min_workers;
  sluice_options.max_workers = o.max_workers;
  sluice_options.period = absl::Seconds(o.period);
  sluice_options.headroom = headroom;
  sluice_options.noise_z = noise_z;
  sluice_options.min_headroom = min_headroom;
  const std::vector<PolicyFactory> policies = {
      {"sluice",
       [&](int max_workers) {
         dispatcher::AutoscalerOptions so = sluice_options;
         so.max_workers = max_workers;
         return MakeSluicePolicy(so);
       }},
      {"cachew", [&](int max_workers) { return MakeCachewPolicy(o.min_workers, max_workers); }},
      {"tf.data", [&](int max_workers) { return MakeTfDataPolicy(o.min_workers, max_workers); }},
      {"hpa-cpu",
       [&](int max_workers) { return MakeHpaPolicy(o.min_workers, max_workers, o.period); }},
  };
  if (!trace_paths.empty()) {
    return RunTraces(trace_paths, policies, o, std::max(1, seeds), sluice_options, reasons,
                     periods);
  }

  std::printf(
      "# period %.0f s, start-up %.0f s, cold %.0f s at %.0f%%, speed jitter "
      "+-%.0f%%, measurement noise +-%.0f%%, seed %llu, sluice headroom "
      "%.2f (noise z %.1f, at least %.2f)\n\n",
      o.period, o.startup_delay, o.cold_seconds, o.cold_speed * 100, o.speed_jitter * 100,
      o.measure_noise * 100, static_cast<unsigned long long>(o.seed), headroom, noise_z,
      min_headroom);
  std::printf(
      "| step | policy | periods to converge | trainer wait after | "
      "trainer wait, whole run | worker-s / oracle | direction changes "
      "|\n|---|---|---|---|---|---|---|\n");
  std::string csv =
      "step,policy,periods_to_converge,wait_after,wait_all,"
      "worker_seconds_ratio,direction_changes\n";
  for (const Scenario& s : StepScenarios()) {
    for (const PolicyFactory& f : policies) {
      std::unique_ptr<Policy> policy = f.make(o.max_workers);
      const RunResult r = Run(s, *policy, o);
      const Metrics m = Measure(s, r, o);
      const std::string converge = m.converge < 0 ? "never" : absl::StrCat(m.converge);
      const std::string wait =
          absl::StrFormat("%.1f%%%s", 100 * m.wait_after, m.wait_measured ? "" : " (last 10)");
      absl::PrintF("| %s | %s | %s | %s | %.1f%% | %.2f | %d |\n", s.name, f.name, converge, wait,
                   100 * m.wait_all, m.cost_ratio, m.direction_changes);
      absl::StrAppendFormat(&csv, "%s,%s,%d,%.4f,%.4f,%.4f,%d\n", s.name, f.name, m.converge,
                            m.wait_after, m.wait_all, m.cost_ratio, m.direction_changes);
    }
  }
  if (!csv_path.empty()) {
    std::ofstream(csv_path) << csv;
  }

  // The same over seeds 1..N: is the result a property of the policy or of
  // one noise sequence?
  if (seeds > 0) {
    absl::PrintF(
        "\nover seeds 1..%d:\n\n| step | policy | periods to converge | "
        "never converged | trainer wait, whole run (mean) | worker-s / oracle "
        "(min-max) | worker-s / oracle (mean) | direction changes (max) "
        "|\n|---|---|---|---|---|---|---|---|\n",
        seeds);
    for (const Scenario& s : StepScenarios()) {
      for (const PolicyFactory& f : policies) {
        int conv_min = 1 << 30, conv_max = -1, never = 0, changes = 0;
        double wait = 0, ratio_min = 1e9, ratio_max = 0, ratio_sum = 0;
        for (int seed = 1; seed <= seeds; ++seed) {
          WorldOptions so = o;
          so.seed = static_cast<uint64_t>(seed);
          std::unique_ptr<Policy> policy = f.make(o.max_workers);
          const Metrics m = Measure(s, Run(s, *policy, so), so);
          if (m.converge < 0) {
            ++never;
          } else {
            conv_min = std::min(conv_min, m.converge);
            conv_max = std::max(conv_max, m.converge);
          }
          wait += m.wait_all / seeds;
          ratio_min = std::min(ratio_min, m.cost_ratio);
          ratio_max = std::max(ratio_max, m.cost_ratio);
          ratio_sum += m.cost_ratio;
          changes = std::max(changes, m.direction_changes);
        }
        const std::string conv = conv_max < 0           ? "-"
                                 : conv_min == conv_max ? absl::StrCat(conv_min)
                                                        : absl::StrCat(conv_min, "-", conv_max);
        absl::PrintF("| %s | %s | %s | %d | %.1f%% | %.2f-%.2f | %.3f | %d |\n", s.name, f.name,
                     conv, never, 100 * wait, ratio_min, ratio_max, ratio_sum / seeds, changes);
      }
    }
  }

  // The combined trace, for the plot.
  const Scenario combined = Combined();
  std::string series = "policy,time,desired,provisioned,ready,oracle,wait\n";
  std::printf("\ncombined trace (%s): worker-s / oracle, mean trainer wait\n",
              "demand x2 @41 s, second job @81 s, cost x3 @121 s, worker lost "
              "@161 s, all stop @201 s");
  for (const PolicyFactory& f : policies) {
    std::unique_ptr<Policy> policy = f.make(o.max_workers);
    const RunResult r = Run(combined, *policy, o);
    for (const PeriodRecord& p : r.periods) {
      absl::StrAppendFormat(&series, "%s,%.1f,%d,%d,%d,%.0f,%.4f\n", f.name, p.time, p.desired,
                            p.provisioned, p.ready, p.oracle, p.wait);
    }
    if (reasons) {
      int last = -1;
      for (const PeriodRecord& p : r.periods) {
        if (!p.reason.empty() && p.desired != last) {
          absl::PrintF("    t=%5.1f  %s\n", p.time, p.reason);
        }
        last = p.desired;
      }
    }
    std::printf("  %-9s %.2f  %.1f%%\n", f.name.c_str(), r.worker_seconds / r.oracle_worker_seconds,
                100 * CombinedMeanWait(r));
  }
  if (!series_path.empty()) std::ofstream(series_path) << series;
  if (seeds > 0) {
    std::printf(
        "\ncombined trace over seeds 1..%d: worker-s / oracle mean (min-max), "
        "mean trainer wait\n",
        seeds);
    for (const PolicyFactory& f : policies) {
      double ratio_sum = 0, ratio_min = 1e9, ratio_max = 0, wait_sum = 0;
      for (int seed = 1; seed <= seeds; ++seed) {
        WorldOptions so = o;
        so.seed = static_cast<uint64_t>(seed);
        std::unique_ptr<Policy> policy = f.make(o.max_workers);
        const RunResult r = Run(combined, *policy, so);
        const double ratio = r.worker_seconds / r.oracle_worker_seconds;
        ratio_sum += ratio;
        ratio_min = std::min(ratio_min, ratio);
        ratio_max = std::max(ratio_max, ratio);
        wait_sum += CombinedMeanWait(r);
      }
      std::printf("  %-9s %.3f (%.2f-%.2f)  %.2f%%\n", f.name.c_str(), ratio_sum / seeds, ratio_min,
                  ratio_max, 100 * wait_sum / seeds);
    }
  }

  if (!bench_path.empty()) {
    WorldOptions bo = o;
    bo.startup_delay = bench_startup;
    bo.cold_seconds = 0;
    bo.min_workers = 1;
    bo.max_workers = 6;
    dispatcher::AutoscalerOptions bench_options = sluice_options;
    bench_options.min_workers = 1;
    bench_options.max_workers = 6;
    std::unique_ptr<Policy> policy = MakeSluicePolicy(bench_options);
    const RunResult r = Run(BenchScenario(bench), *policy, bo);
    std::string out = "time,desired,provisioned,ready,oracle,wait\n";
    absl::PrintF("\nbench/autoscale.sh replayed (start-up %.1f s), sluice:\n", bench_startup);
    int last = -1;
    for (const PeriodRecord& p : r.periods) {
      const double t = p.time - bench.lead;
      absl::StrAppendFormat(&out, "%.2f,%d,%d,%d,%.0f,%.4f\n", t, p.desired, p.provisioned, p.ready,
                            p.oracle, p.wait);
      if (p.desired != last) {
        absl::PrintF("  t=%5.1f  desired %d  %s\n", t, p.desired, p.reason);
      }
      last = p.desired;
    }
    std::ofstream(bench_path) << out;
  }
  return 0;
}

}  // namespace
}  // namespace sluice::autoscale_sim

int main(int argc, char** argv) { return sluice::autoscale_sim::Main(argc, argv); }
