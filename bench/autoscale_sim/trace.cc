#include "bench/autoscale_sim/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice::autoscale_sim {
namespace {

using Kind = LoadStep::Kind;

class LineParser {
 public:
  LineParser(const std::string& name, int line) : name_(name), line_(line) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ":", line_, ": ", what));
  }

  absl::StatusOr<double> Number(absl::string_view token, absl::string_view what) const {
    double x = 0;
    if (!absl::SimpleAtod(token, &x) || !std::isfinite(x)) {
      return Error(absl::StrCat(what, " must be a number, got '", token, "'"));
    }
    return x;
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
  for (size_t i = 4; i < tokens.size(); ++i) {
    std::vector<std::string> parts = absl::StrSplit(tokens[i], '=');
    if (parts.size() != 2) {
      return p.Error(absl::StrCat("expected key=value, got '", tokens[i], "'"));
    }
    auto v = p.Number(parts[1], parts[0]);
    if (!v.ok()) return v.status();
    kv[parts[0]] = *v;
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
    const bool integer = key == "consumers" || key == "batch" || key == "priority" ||
                         key == "min_workers" || key == "buffer";
    if (integer && value != std::floor(value)) {
      return p.Error(absl::StrCat(key, " must be an integer"));
    }
    if (key == "consumers" || key == "batch" || key == "buffer") {
      if (value < 1) return p.Error(absl::StrCat(key, " must be >= 1"));
    } else if (key == "step" || key == "rate" || key == "cost") {
      if (value <= 0) return p.Error(absl::StrCat(key, " must be positive"));
    } else if (key == "work" || key == "min_workers") {
      if (value < 0) return p.Error(absl::StrCat(key, " must be >= 0"));
    } else if (key != "priority") {
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
    auto priority = p.Number(tokens[4], "the priority");
    if (!priority.ok()) return priority.status();
    if (*priority != std::floor(*priority)) return p.Error("the priority must be an integer");
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
      if ((step->kind == Kind::kCostTimes || step->kind == Kind::kJobStop ||
           step->kind == Kind::kPriority) &&
          std::find(job_ids.begin(), job_ids.end(), step->job) == job_ids.end()) {
        return p.Error(absl::StrCat("job ", step->job, " has not arrived"));
      }
      if (step->kind == Kind::kAddJob && *at == 0) {
        s.jobs.push_back(step->job_spec);
      } else {
        s.steps.push_back(*step);
      }
      continue;
    }
    if (tokens.size() != 2) {
      return p.Error(absl::StrCat("'", head, "' takes one value"));
    }
    auto v = p.Number(tokens[1], head);
    if (!v.ok()) return v.status();
    if (head == "duration") {
      if (*v <= 0) return p.Error("duration must be positive");
      s.duration = *v;
    } else if (head == "max_workers") {
      if (*v < 1) return p.Error("max_workers must be >= 1");
      s.max_workers = static_cast<int>(*v);
    } else if (head == "initial_workers") {
      if (*v < 0) return p.Error("initial_workers must be >= 0");
      s.initial_workers = static_cast<int>(*v);
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
                                                   " s is past duration ", s.duration));
  }
  return s;
}

absl::StatusOr<Scenario> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read trace file ", path, " (--trace)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseTrace(text.str(), path);
}

}  // namespace sluice::autoscale_sim
