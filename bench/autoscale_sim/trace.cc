#include "bench/autoscale_sim/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice::autoscale_sim {
namespace {

using Kind = LoadStep::Kind;

// The most workers a job may need (at arrival, or after its demand and cost
// factors): far above any pool, and far below where counts stop being ints.
constexpr double kMostWorkers = 1e6;
// The largest trace file read.
constexpr std::streamsize kMostBytes = 16 << 20;
// The most workers a pool may hold (max_workers, initial_workers).
constexpr double kMostPool = 100000;
// The longest trace simulated: 11.6 days, 500,000 control periods of 2 s a run (each kept for
// the tables), where times still resolve to well under a microsecond.
constexpr double kMostSeconds = 1000000;

class LineParser {
 public:
  LineParser(const std::string& name, int line) : name_(name), line_(line) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ":", line_, ": ", what));
  }

  // A decimal number: digits, a sign, a point, an exponent (no hex, nan or inf).
  absl::StatusOr<double> Number(absl::string_view token, absl::string_view what) const {
    double x = 0;
    const bool decimal =
        !token.empty() && token.find_first_not_of("0123456789+-.eE") == absl::string_view::npos;
    if (!decimal || !absl::SimpleAtod(token, &x) || !std::isfinite(x)) {
      return Error(absl::StrCat(what, " must be a number, got '", token, "'"));
    }
    return x;
  }

  // A whole number within [low, high] (an int, unless `high` says less).
  absl::StatusOr<int> Integer(absl::string_view token, absl::string_view what, double low,
                              double high = std::numeric_limits<int>::max()) const {
    absl::StatusOr<double> x = Number(token, what);
    if (!x.ok()) return x.status();
    if (*x != std::floor(*x)) return Error(absl::StrCat(what, " must be an integer"));
    if (*x < low || *x > high) {
      return Error(absl::StrCat(what, " must be within ", static_cast<int64_t>(low), "..",
                                static_cast<int64_t>(high), ", got ", token));
    }
    return static_cast<int>(*x);
  }

  // "x2" -> 2 (a positive factor).
  absl::StatusOr<double> Factor(absl::string_view token) const {
    if (!absl::ConsumePrefix(&token, "x")) {
      return Error(absl::StrCat("expected a factor like x2, got '", token, "'"));
    }
    absl::StatusOr<double> f = Number(token, "the factor");
    if (f.ok() && *f <= 0) return Error("the factor must be positive");
    return f;
  }

  absl::StatusOr<uint64_t> JobId(absl::string_view token) const {
    uint64_t id = 0;
    if (!absl::SimpleAtoi(token, &id) || id == 0) {
      return Error(absl::StrCat("a job id is a positive integer, got '", token, "'"));
    }
    return id;
  }

 private:
  const std::string& name_;
  const int line_;
};

absl::StatusOr<JobSpec> ParseJob(const LineParser& p, const std::vector<std::string>& tokens) {
  // at T job ID key=value...
  if (tokens.size() < 4) return p.Error("'job' needs an id");
  JobSpec j;
  auto id = p.JobId(tokens[3]);
  if (!id.ok()) return id.status();
  j.id = *id;
  std::map<std::string, double> kv;
  std::map<std::string, std::string> text;
  for (size_t i = 4; i < tokens.size(); ++i) {
    std::vector<std::string> parts = absl::StrSplit(tokens[i], '=');
    if (parts.size() != 2) {
      return p.Error(absl::StrCat("expected key=value, got '", tokens[i], "'"));
    }
    auto v = p.Number(parts[1], parts[0]);
    if (!v.ok()) return v.status();
    if (!kv.emplace(parts[0], *v).second) {
      return p.Error(absl::StrCat("job ", j.id, " sets ", parts[0], "= twice"));
    }
    text[parts[0]] = parts[1];
  }
  for (const char* required : {"consumers", "batch", "step"}) {
    if (!kv.contains(required)) {
      return p.Error(absl::StrCat("job ", j.id, " needs ", required, "="));
    }
  }
  if (kv.contains("rate") == kv.contains("cost")) {
    return p.Error(absl::StrCat("job ", j.id, " needs exactly one of rate= and cost="));
  }
  for (const auto& [key, value] : kv) {
    if (key == "consumers" || key == "batch" || key == "buffer") {
      // batch: a whole number a double holds exactly.
      auto n =
          p.Integer(text[key], key, 1, key == "batch" ? 1e15 : std::numeric_limits<int>::max());
      if (!n.ok()) return n.status();
    } else if (key == "priority") {
      auto n = p.Integer(text[key], key, std::numeric_limits<int>::min());
      if (!n.ok()) return n.status();
    } else if (key == "min_workers") {
      auto n = p.Integer(text[key], key, 0);
      if (!n.ok()) return n.status();
    } else if (key == "step" || key == "rate" || key == "cost") {
      if (value <= 0) return p.Error(absl::StrCat(key, " must be positive"));
    } else if (key == "work") {
      if (value < 0) return p.Error(absl::StrCat(key, " must be >= 0"));
    } else {
      return p.Error(absl::StrCat("unknown job key '", key, "'"));
    }
  }
  j.consumers = static_cast<int>(kv["consumers"]);
  j.batch_size = static_cast<uint64_t>(kv["batch"]);
  j.step_seconds = kv["step"];
  j.cost = kv.contains("rate") ? 1 / kv["rate"] : kv["cost"];
  if (kv.contains("work")) j.work = kv["work"];
  if (kv.contains("priority")) j.priority = static_cast<int>(kv["priority"]);
  if (kv.contains("min_workers")) {
    j.min_workers = static_cast<int>(kv["min_workers"]);
  }
  if (kv.contains("buffer")) j.buffer_batches = static_cast<int>(kv["buffer"]);
  return j;
}

absl::StatusOr<LoadStep> ParseStep(const LineParser& p, const std::vector<std::string>& tokens,
                                   double at) {
  LoadStep step;
  step.at = at;
  const std::string& what = tokens[2];
  const size_t n = tokens.size();
  if (what == "job") {
    auto job = ParseJob(p, tokens);
    if (!job.ok()) return job.status();
    step.kind = Kind::kAddJob;
    step.job_spec = *job;
    step.job = job->id;
  } else if (what == "demand" && n == 4) {
    step.kind = Kind::kDemandTimes;
    auto f = p.Factor(tokens[3]);
    if (!f.ok()) return f.status();
    step.factor = *f;
  } else if (what == "cost" && n == 5) {
    step.kind = Kind::kCostTimes;
    auto id = p.JobId(tokens[3]);
    if (!id.ok()) return id.status();
    step.job = *id;
    auto f = p.Factor(tokens[4]);
    if (!f.ok()) return f.status();
    step.factor = *f;
  } else if (what == "lose_worker" && n == 3) {
    step.kind = Kind::kLoseWorker;
  } else if (what == "slow_worker" && n == 4) {
    step.kind = Kind::kSlowWorker;
    auto f = p.Factor(tokens[3]);
    if (!f.ok()) return f.status();
    step.factor = *f;
  } else if (what == "priority" && n == 5) {
    step.kind = Kind::kPriority;
    auto id = p.JobId(tokens[3]);
    if (!id.ok()) return id.status();
    step.job = *id;
    auto priority = p.Integer(tokens[4], "the priority", std::numeric_limits<int>::min());
    if (!priority.ok()) return priority.status();
    step.factor = *priority;
  } else if (what == "stop" && n == 4 && tokens[3] == "all") {
    step.kind = Kind::kAllStop;
  } else if (what == "stop" && n == 4) {
    step.kind = Kind::kJobStop;
    auto id = p.JobId(tokens[3]);
    if (!id.ok()) return id.status();
    step.job = *id;
  } else {
    return p.Error(absl::StrCat("unknown or malformed event '", what,
                                "' (job, demand xF, cost ID xF, lose_worker, slow_worker xF, "
                                "priority ID P, stop ID|all)"));
  }
  return step;
}

}  // namespace

absl::StatusOr<Scenario> ParseTrace(absl::string_view text, const std::string& name) {
  Scenario s;
  s.name = name;
  s.measure_from = 0;
  s.duration = 0;
  std::vector<uint64_t> job_ids;
  std::set<uint64_t> left;                     // jobs whose trainers left
  std::map<uint64_t, double> need;             // each job's, in workers, after the events so far
  std::set<std::string> directives;            // each may be given once
  absl::ConsumePrefix(&text, "\xEF\xBB\xBF");  // a UTF-8 byte order mark
  if (text.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": holds a NUL byte (not a text file)"));
  }
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string> tokens =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (tokens.empty()) continue;
    LineParser p(name, line_number);
    const std::string& head = tokens[0];
    if (head == "at") {
      if (tokens.size() < 3) return p.Error("'at T' needs an event");
      auto at = p.Number(tokens[1], "the time");
      if (!at.ok()) return at.status();
      if (*at < 0) return p.Error("the time must be >= 0");
      if (!s.steps.empty() && *at < s.steps.back().at) {
        return p.Error("events must be in time order");
      }
      auto step = ParseStep(p, tokens, *at);
      if (!step.ok()) return step.status();
      if (step->kind == Kind::kAddJob) {
        if (std::find(job_ids.begin(), job_ids.end(), step->job) != job_ids.end()) {
          return p.Error(absl::StrCat("job ", step->job, " arrives twice"));
        }
        job_ids.push_back(step->job);
      }
      if (step->kind == Kind::kCostTimes || step->kind == Kind::kJobStop ||
          step->kind == Kind::kPriority) {
        if (std::find(job_ids.begin(), job_ids.end(), step->job) == job_ids.end()) {
          return p.Error(absl::StrCat("job ", step->job, " has not arrived"));
        }
        if (left.contains(step->job)) {
          return p.Error(absl::StrCat("job ", step->job, " has left"));
        }
      }
      switch (step->kind) {
        case Kind::kAddJob:
          need[step->job] = step->job_spec.consumers *
                            static_cast<double>(step->job_spec.batch_size) /
                            step->job_spec.step_seconds * step->job_spec.cost;
          break;
        case Kind::kDemandTimes:
          for (auto& [id, n] : need) n *= step->factor;
          break;
        case Kind::kCostTimes:
          need[step->job] *= step->factor;
          break;
        case Kind::kJobStop:
          left.insert(step->job);
          break;
        case Kind::kAllStop:
          left.insert(job_ids.begin(), job_ids.end());
          break;
        default:
          break;
      }
      // What the simulator derives must stay finite and within what it models
      // (NaN fails the test too).
      for (const auto& [id, n] : need) {
        if (!left.contains(id) && !(n <= kMostWorkers)) {
          return p.Error(absl::StrCat("job ", id, " would need ", n,
                                      " workers; the simulator models at most ", kMostWorkers));
        }
      }
      if (step->kind == Kind::kAddJob && *at == 0) {
        // Jobs at 0 exist before the first event, so an event at 0 before
        // one would act on it against the file's order.
        if (!s.steps.empty()) {
          return p.Error(absl::StrCat("job ", step->job,
                                      " arrives at 0 after an event at 0: list the jobs that "
                                      "arrive at 0 first"));
        }
        s.jobs.push_back(step->job_spec);
      } else {
        s.steps.push_back(*step);
      }
      continue;
    }
    if (tokens.size() != 2) {
      return p.Error(absl::StrCat("'", head, "' takes one value"));
    }
    const bool known = head == "duration" || head == "max_workers" || head == "initial_workers" ||
                       head == "measure_from";
    if (known && !directives.insert(head).second) {
      return p.Error(absl::StrCat("'", head, "' is given twice"));
    }
    auto v = p.Number(tokens[1], head);
    if (!v.ok()) return v.status();
    if (head == "duration") {
      if (*v <= 0) return p.Error("duration must be positive");
      if (*v > kMostSeconds) {
        return p.Error(absl::StrCat("duration must be at most 1000000 s, got ", tokens[1]));
      }
      s.duration = *v;
    } else if (head == "max_workers") {
      auto n = p.Integer(tokens[1], head, 1, kMostPool);
      if (!n.ok()) return n.status();
      s.max_workers = *n;
    } else if (head == "initial_workers") {
      auto n = p.Integer(tokens[1], head, 0, kMostPool);
      if (!n.ok()) return n.status();
      s.initial_workers = *n;
    } else if (head == "measure_from") {
      if (*v < 0) return p.Error("measure_from must be >= 0");
      s.measure_from = *v;
    } else {
      return p.Error(absl::StrCat("unknown directive '", head,
                                  "' (duration, max_workers, initial_workers, measure_from, at)"));
    }
  }
  if (s.duration <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": 'duration D' is required"));
  }
  if (!s.steps.empty() && s.steps.back().at >= s.duration) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": an event at ", s.steps.back().at,
                                                   " s is not before duration ", s.duration));
  }
  if (s.measure_from >= s.duration) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": measure_from ", s.measure_from,
                                                   " is not before duration ", s.duration));
  }
  const int pool = s.max_workers > 0 ? s.max_workers : WorldOptions{}.max_workers;
  if (s.initial_workers > pool) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": initial_workers ", s.initial_workers,
                                                   " is more than max_workers ", pool));
  }
  return s;
}

absl::StatusOr<Scenario> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read trace file ", path, " (--trace)"));
  }
  std::string text(static_cast<size_t>(kMostBytes) + 1, '\0');
  in.read(text.data(), kMostBytes + 1);
  if (in.gcount() > kMostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": more than ", kMostBytes >> 20, " MiB: not a trace (--trace)"));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  return ParseTrace(text, path);
}

}  // namespace sluice::autoscale_sim
