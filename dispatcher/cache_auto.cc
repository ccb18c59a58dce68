#include "dispatcher/cache_auto.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/pipeline_spec/cache_key.h"

namespace sluice::dispatcher {
namespace {

// "map[1].ops[0] (case 12)": where the first per-epoch random op is, for the reason text.
std::optional<std::string> FirstRandomOp(const proto::Pipeline& p, int* node) {
  for (int i = 0; i < p.nodes_size(); ++i) {
    if (!p.nodes(i).has_map()) continue;
    const proto::MapNode& m = p.nodes(i).map();
    for (int j = 0; j < m.ops_size(); ++j) {
      if (pipeline_spec::DrawsPerEpochRandomness(m.ops(j).op_case())) {
        *node = i;
        return absl::StrCat("nodes[", i, "].ops[", j, "]");
      }
    }
  }
  return std::nullopt;
}

std::string Bytes(double b) {
  if (b >= double{1 << 30}) return absl::StrFormat("%.1f GiB", b / double{1 << 30});
  if (b >= double{1 << 20}) return absl::StrFormat("%.1f MiB", b / double{1 << 20});
  if (b >= double{1 << 10}) return absl::StrFormat("%.1f KiB", b / double{1 << 10});
  return absl::StrFormat("%.0f B", b);
}

}  // namespace

proto::CacheDecision DecideAutoCache(const AutoCacheInput& in) {
  proto::CacheDecision d;
  const proto::Pipeline& p = *in.pipeline;
  std::map<int, proto::NodeCost> by_node;
  uint64_t measured = 0;
  for (const proto::NodeCost& c : in.costs) {
    if (c.node_index() < 0 || c.node_index() >= p.nodes_size()) continue;
    proto::NodeCost& n = by_node[c.node_index()];
    n.set_node_index(c.node_index());
    n.set_records(n.records() + c.records());
    n.set_busy_seconds(n.busy_seconds() + c.busy_seconds());
    n.set_out_bytes(n.out_bytes() + c.out_bytes());
    n.set_out_elements(n.out_elements() + c.out_elements());
  }
  // Every node's records count the same runs: take the first node's.
  if (!by_node.empty()) measured = by_node.begin()->second.records();
  d.set_records_measured(measured);
  if (measured < in.min_records || measured == 0) {
    d.set_reason(absl::StrCat("measuring: ", measured, " of ", in.min_records, " records"));
    return d;
  }
  d.set_decided(true);

  int random_node = p.nodes_size();
  const std::optional<std::string> random_op = FirstRandomOp(p, &random_node);
  int batch_node = p.nodes_size();
  for (int i = 0; i < p.nodes_size(); ++i) {
    if (p.nodes(i).has_cache()) {
      d.set_reason("the pipeline has a cache node already");
      return d;
    }
    if (p.nodes(i).has_batch() && batch_node == p.nodes_size()) batch_node = i;
  }
  const int end = std::min(random_node, batch_node);

  const double records = static_cast<double>(in.records_per_epoch);
  double compute = 0;  // CPU seconds per record of nodes [0, k]
  int best = -1;
  double best_saved = 0, best_bytes = 0, best_compute = 0, last_compute = 0;
  bool over_budget = false, candidate = false;
  for (int k = 0; k < end; ++k) {
    const auto it = by_node.find(k);
    if (it != by_node.end()) compute += it->second.busy_seconds() / static_cast<double>(measured);
    if (!p.nodes(k).has_map() && !p.nodes(k).has_filter()) continue;
    candidate = true;
    if (it == by_node.end()) continue;  // not measured: no estimate of its output
    last_compute = compute * records;
    const double bytes =
        records * static_cast<double>(it->second.out_bytes()) / static_cast<double>(measured);
    const double saved = last_compute - bytes * in.read_seconds_per_byte;
    if (bytes > static_cast<double>(in.free_bytes)) {
      over_budget = true;
      continue;
    }
    if (saved > best_saved) {
      best = k;
      best_saved = saved;
      best_bytes = bytes;
      best_compute = last_compute;
    }
  }
  if (end == 0 || last_compute == 0) {
    d.set_reason(random_op.has_value() && random_node == 0
                     ? absl::StrCat("no deterministic prefix: ", *random_op,
                                    " draws new randomness each epoch")
                 : candidate ? "no candidate node's cost was measured (a map whose tail the client "
                               "runs, or a pipeline run as one stage, is not measured)"
                             : "no map or filter node before the batch to cache after");
    return d;
  }
  if (best < 0 || best_saved < in.min_saved_fraction * last_compute) {
    if (best < 0 && over_budget) {
      d.set_reason(absl::StrCat("every cut's output is over the free cache budget (",
                                Bytes(static_cast<double>(in.free_bytes)), ")"));
    } else {
      d.set_reason(absl::StrFormat(
          "no cut pays: the best saves %.2f of %.2f CPU seconds per epoch (reading back costs "
          "about as much as computing)",
          best_saved, last_compute));
    }
    return d;
  }
  const std::string placeholder = "auto";
  absl::StatusOr<proto::Pipeline> cut = WithCacheAfter(p, best, placeholder);
  const std::optional<pipeline_spec::CacheKey> key =
      cut.ok() ? pipeline_spec::CacheKeyOf(*cut, in.split_size) : std::nullopt;
  if (!key.has_value()) {
    d.set_reason("the cut could not be placed");
    return d;
  }
  d.set_cache(true);
  d.set_after_node(best);
  d.set_fingerprint(key->fingerprint);
  d.set_name(absl::StrCat("auto-", key->fingerprint));
  d.set_estimated_bytes(static_cast<uint64_t>(std::min(best_bytes, 1.8e19)));  // < 2^64
  d.set_cpu_seconds_saved_per_epoch(best_saved);
  d.set_reason(absl::StrFormat(
      "cache after nodes[%d]: recomputing costs %.2f CPU s per epoch, reading %s back saves %.2f",
      best, best_compute, Bytes(best_bytes), best_saved));
  return d;
}

absl::StatusOr<proto::Pipeline> WithCacheAfter(const proto::Pipeline& pipeline, int after_node,
                                               const std::string& name) {
  if (after_node < 0 || after_node >= pipeline.nodes_size()) {
    return absl::InvalidArgumentError(absl::StrCat("cache: after_node ", after_node,
                                                   " is not a node of the pipeline (",
                                                   pipeline.nodes_size(), " nodes)"));
  }
  proto::Pipeline out = pipeline;
  out.clear_nodes();
  for (int i = 0; i < pipeline.nodes_size(); ++i) {
    if (pipeline.nodes(i).has_cache()) {
      return absl::InvalidArgumentError("cache: the pipeline has a cache node already");
    }
    *out.add_nodes() = pipeline.nodes(i);
    if (i == after_node) out.add_nodes()->mutable_cache()->set_name(name);
  }
  return out;
}

}  // namespace sluice::dispatcher
