#include "data_worker/pipeline/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace sluice::data_worker::pipeline {
namespace {

int MergeParallelism(int a, int b) {
  if (a == kAutotune || b == kAutotune) return kAutotune;
  return std::max(a, b);
}

absl::StatusOr<Step> MakeMapStep(const LogicalMap& m, bool op_fusion) {
  Step step;
  step.kind = Step::kMap;
  step.map.name = m.name;
  step.map.slots = m.slots;
  ASSIGN_OR_RETURN(auto ops, BuildOps(m.ops, m.labels, op_fusion));
  for (auto& op : ops) step.map.ops.push_back(std::shared_ptr<const Op>(std::move(op)));
  return step;
}

}  // namespace

std::string PhysicalPlan::Describe() const {
  std::vector<std::string> parts;
  if (!source_filters.empty())
    parts.push_back(absl::StrCat("index-filter x", source_filters.size()));
  for (const StagePlan& s : stages) {
    std::vector<std::string> steps;
    for (const Step& st : s.steps) {
      switch (st.kind) {
        case Step::kRead:
          steps.push_back("Read");
          break;
        case Step::kMap: {
          std::vector<std::string> ops;
          for (const auto& op : st.map.ops) ops.emplace_back(op->name());
          steps.push_back(absl::StrCat(st.map.name, "{", absl::StrJoin(ops, ","), "}"));
          break;
        }
        case Step::kFilter:
          steps.push_back(st.filter.name);
          break;
        case Step::kCache:
          steps.push_back(absl::StrCat("cache(", st.cache_name, ")"));
          break;
      }
    }
    if (s.batch) steps.push_back(absl::StrCat("Batch(", s.batch_size, ")"));
    for (const auto& [slot, ops] : s.vectorized) {
      std::vector<std::string> names;
      for (const auto& op : ops) names.emplace_back(op->name());
      steps.push_back(absl::StrCat("vectorized[", slot, "]{", absl::StrJoin(names, ","), "}"));
    }
    for (const StagePlan::SlotWrite& w : s.writes) {
      std::string ops = w.mirror ? std::string(w.mirror->name()) + "," : "";
      ops += w.op->name();
      steps.push_back(absl::StrCat("write[", w.slot, "]{", ops, "}"));
    }
    parts.push_back(absl::StrCat(s.name, "[", absl::StrJoin(steps, " "), "]"));
  }
  return absl::StrJoin(parts, " -> ");
}

namespace {

// A step with the parallelism its stage will get.
struct PendingStep {
  Step step;
  int parallelism = kAutotune;
};

// Filter pushdown: filters the shard index can answer leave the node list.
std::vector<LogicalNode> PushDownFilters(std::vector<LogicalNode> nodes, PhysicalPlan& plan) {
  std::vector<LogicalNode> kept;
  for (auto& n : nodes) {
    if (n.filter && n.filter->pushable) {
      plan.source_filters.push_back(n.filter->filter);
      plan.rewrites.push_back(absl::StrCat("filter pushdown: ", n.filter->name));
    } else {
      kept.push_back(std::move(n));
    }
  }
  return kept;
}

// Turns nodes into steps, fusing adjacent filters and adjacent maps over the
// same columns, then builds each map step's ops (op fusion).
absl::StatusOr<std::vector<PendingStep>> MakeSteps(const std::vector<LogicalNode>& nodes,
                                                   const OptimizerOptions& options,
                                                   PhysicalPlan& plan) {
  std::vector<PendingStep> steps;
  std::vector<LogicalMap> merged_maps;  // maps after map fusion, pending BuildOps
  std::vector<int> step_map_index;      // for each step: index into merged_maps or -1
  for (const LogicalNode& n : nodes) {
    if (n.cache) {
      PendingStep ps;
      ps.step.kind = Step::kCache;
      ps.step.cache_name = n.cache->name;
      steps.push_back(std::move(ps));
      step_map_index.push_back(-1);
      continue;
    }
    if (n.filter) {
      const bool fuse =
          options.filter_fusion && !steps.empty() && steps.back().step.kind == Step::kFilter;
      if (fuse) {
        steps.back().step.filter.name += "+" + n.filter->name;
        steps.back().step.filter.predicates.emplace_back(n.filter->slot, n.filter->filter);
        plan.rewrites.push_back(absl::StrCat("filter fusion: ", steps.back().step.filter.name));
      } else {
        PendingStep ps;
        ps.step.kind = Step::kFilter;
        ps.step.filter.name = n.filter->name;
        ps.step.filter.predicates.emplace_back(n.filter->slot, n.filter->filter);
        steps.push_back(std::move(ps));
        step_map_index.push_back(-1);
      }
      continue;
    }
    const LogicalMap& m = *n.map;
    const bool fuse = options.map_fusion && !steps.empty() && step_map_index.back() >= 0 &&
                      merged_maps[step_map_index.back()].slots == m.slots;
    if (fuse) {
      LogicalMap& prev = merged_maps[step_map_index.back()];
      prev.name += "+" + m.name;
      prev.ops.insert(prev.ops.end(), m.ops.begin(), m.ops.end());
      prev.labels.insert(prev.labels.end(), m.labels.begin(), m.labels.end());
      steps.back().parallelism = MergeParallelism(steps.back().parallelism, m.parallelism);
      plan.rewrites.push_back(absl::StrCat("map fusion: ", prev.name));
    } else {
      merged_maps.push_back(m);
      PendingStep ps;
      ps.step.kind = Step::kMap;
      ps.parallelism = m.parallelism;
      steps.push_back(std::move(ps));
      step_map_index.push_back(static_cast<int>(merged_maps.size()) - 1);
    }
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (step_map_index[i] < 0) continue;
    ASSIGN_OR_RETURN(steps[i].step, MakeMapStep(merged_maps[step_map_index[i]], options.op_fusion));
  }
  return steps;
}

// Places the read, the steps and the batch into stages: one stage for
// everything (pipeline parallelism), or a stage per step with map+batch and
// source fusion.
void MakeStages(const LogicalPipeline& lp, std::vector<PendingStep> steps,
                const OptimizerOptions& options, PhysicalPlan& plan) {
  Step read;
  read.kind = Step::kRead;
  if (options.pipeline_parallel) {
    StagePlan s;
    s.name = "pipeline";
    s.steps.push_back(read);
    for (auto& ps : steps) s.steps.push_back(std::move(ps.step));
    if (lp.batch) {
      s.batch = true;
      s.batch_size = lp.batch->size;
      s.drop_remainder = lp.batch->drop_remainder;
    }
    plan.stages.push_back(std::move(s));
    plan.rewrites.push_back("pipeline parallelism: one stage");
  } else {
    StagePlan src;
    src.name = "source";
    src.steps.push_back(read);
    src.parallelism = lp.source_parallelism;
    plan.stages.push_back(std::move(src));
    for (auto& ps : steps) {
      if (ps.step.kind == Step::kCache) {
        // No stage of its own: it runs in the threads of the step before it.
        plan.stages.back().steps.push_back(std::move(ps.step));
        continue;
      }
      StagePlan s;
      s.name = ps.step.kind == Step::kMap ? ps.step.map.name : ps.step.filter.name;
      s.parallelism = ps.parallelism;
      s.steps.push_back(std::move(ps.step));
      plan.stages.push_back(std::move(s));
    }
    if (lp.batch) {
      StagePlan b;
      b.name = "batch";
      b.batch = true;
      b.batch_size = lp.batch->size;
      b.drop_remainder = lp.batch->drop_remainder;
      b.parallelism = lp.batch->parallelism;
      if (options.map_batch_fusion && plan.stages.size() > 1 &&
          plan.stages.back().steps.back().kind == Step::kMap) {
        StagePlan last = std::move(plan.stages.back());
        plan.stages.pop_back();
        b.name = last.name + "+batch";
        b.steps = std::move(last.steps);
        if (last.parallelism != kAutotune) b.parallelism = last.parallelism;
        plan.rewrites.push_back(absl::StrCat("map+batch fusion: ", b.name));
      }
      plan.stages.push_back(std::move(b));
    }
    if (options.source_fusion && plan.stages.size() > 1) {
      StagePlan& next = plan.stages[1];
      // The read, and a cache step that may follow it.
      next.steps.insert(next.steps.begin(), plan.stages[0].steps.begin(),
                        plan.stages[0].steps.end());
      if (plan.stages[0].parallelism != kAutotune && next.parallelism != kAutotune) {
        next.parallelism = std::max(next.parallelism, plan.stages[0].parallelism);
      }
      next.name = "source+" + next.name;
      plan.rewrites.push_back(absl::StrCat("source fusion: ", next.name));
      plan.stages.erase(plan.stages.begin());
    }
  }
}

// Vectorization: trailing batched-kernel ops of the map step right before
// batching run once per batch, after it; or, with batch write fusion, are
// written into the batch slots by the batch stage's threads.
void Vectorize(PhysicalPlan& plan, bool batch_write_fusion) {
  StagePlan& b = plan.stages.back();
  Step* last_map = nullptr;
  StagePlan* owner = nullptr;
  if (!b.steps.empty() && b.steps.back().kind == Step::kMap) {
    last_map = &b.steps.back();
    owner = &b;
  } else if (b.steps.empty() && plan.stages.size() > 1) {
    StagePlan& prev = plan.stages[plan.stages.size() - 2];
    if (!prev.steps.empty() && prev.steps.back().kind == Step::kMap) {
      last_map = &prev.steps.back();
      owner = &prev;
    }
  }
  if (last_map != nullptr) {
    auto& ops = last_map->map.ops;
    size_t first = ops.size();
    while (first > 0 && ops[first - 1]->has_batched_kernel()) --first;
    if (batch_write_fusion && owner == &b && first + 1 == ops.size() && ops[first]->writes_into()) {
      const bool mirror = first > 0 && ops[first - 1]->mirrors();
      const size_t begin = mirror ? first - 1 : first;
      for (int slot : last_map->map.slots) {
        b.writes.push_back({slot, mirror ? ops[begin] : nullptr, ops[first]});
      }
      std::vector<std::string> names;
      for (size_t i = begin; i < ops.size(); ++i) names.emplace_back(ops[i]->name());
      plan.rewrites.push_back(absl::StrCat("batch write fusion: ", last_map->map.name, " ",
                                           absl::StrJoin(names, ","), " into the batch slots"));
      ops.erase(ops.begin() + begin, ops.end());
      if (ops.empty()) owner->steps.pop_back();
      return;
    }
    if (first < ops.size()) {
      std::vector<std::shared_ptr<const Op>> moved(ops.begin() + first, ops.end());
      std::vector<std::string> names;
      for (const auto& op : moved) names.emplace_back(op->name());
      for (int slot : last_map->map.slots) b.vectorized.emplace_back(slot, moved);
      plan.rewrites.push_back(absl::StrCat("vectorization: ", last_map->map.name, " ",
                                           absl::StrJoin(names, ","), " after batch"));
      ops.erase(ops.begin() + first, ops.end());
      if (ops.empty()) {
        owner->steps.pop_back();
        if (owner != &b && owner->steps.empty()) {
          plan.stages.erase(plan.stages.end() - 2);
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<PhysicalPlan> Optimize(const LogicalPipeline& lp, const OptimizerOptions& options) {
  PhysicalPlan plan;
  plan.prefetch = lp.prefetch;
  std::vector<LogicalNode> nodes = lp.nodes;
  if (options.filter_pushdown) nodes = PushDownFilters(std::move(nodes), plan);
  ASSIGN_OR_RETURN(std::vector<PendingStep> steps, MakeSteps(nodes, options, plan));
  MakeStages(lp, std::move(steps), options, plan);
  if (options.vectorization && lp.batch) {
    Vectorize(plan, options.batch_write_fusion && options.op_fusion);
  }
  return plan;
}

}  // namespace sluice::data_worker::pipeline
