#include "data_worker/pipeline/spec.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/base/status_macros.h"
#include "common/pipeline_spec/location.h"
#include "common/pipeline_spec/parse.h"
#include "common/tensor_kernels/finish.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"
#include "data_worker/ops/registry.h"
#include "data_worker/python/python_op.h"

namespace sluice::data_worker::pipeline {

using pipeline_spec::SpecError;
using pipeline_spec::SpecLocation;

namespace {

int Parallelism(int v) { return v <= 0 ? kAutotune : v; }

// The most threads a spec may ask one stage for: each is a real thread of the worker, so
// 2^31-1 would end the process when the thread cannot be created.
constexpr int kMaxParallelWorkers = 256;
constexpr std::string_view kParallelismRule = "must be > 0 or AUTOTUNE, and at most 256";

SpecLocation Node(std::string kind, int index = -1, std::string field = "") {
  SpecLocation loc;
  loc.node = std::move(kind);
  loc.node_index = index;
  loc.field = std::move(field);
  return loc;
}

}  // namespace

namespace {

// Validate()'s walk over the spec: the pipeline options, the source, then one
// node at a time, each checked against the columns and types the nodes before
// it leave. One object per Validate() call.
class Validator {
 public:
  explicit Validator(const proto::Pipeline& spec) : spec_(spec) {
    lp_.spec = spec;
    lp_.seed = spec.seed();
  }

  absl::StatusOr<LogicalPipeline> Run() && {
    RETURN_IF_ERROR(CheckOptions());
    RETURN_IF_ERROR(BindSource());
    for (int i = 0; i < spec_.nodes_size(); ++i) {
      if (seen_prefetch_) {
        return SpecError(Node("nodes", i), "prefetch must be the last node");
      }
      RETURN_IF_ERROR(AddNode(i, spec_.nodes(i)));
    }
    lp_.column_types = std::move(types_);
    return std::move(lp_);
  }

 private:
  // on_error, finish and the source's parallelism.
  absl::Status CheckOptions() {
    if (spec_.on_error().empty() || spec_.on_error() == "fail") {
      lp_.skip_errors = false;
    } else if (spec_.on_error() == "skip") {
      lp_.skip_errors = true;
    } else {
      return SpecError(Node("on_error"), absl::StrCat("'", spec_.on_error(),
                                                      "' is not one of fail, "
                                                      "skip"));
    }
    if (absl::StatusOr<kernels::FinishMode> finish = kernels::ParseFinishMode(spec_.finish());
        !finish.ok()) {
      return SpecError(Node("finish"),
                       absl::StrCat("'", spec_.finish(), "' is not one of auto, worker, client"));
    }
    if (spec_.source().num_parallel_workers() < -1 ||
        spec_.source().num_parallel_workers() > kMaxParallelWorkers) {
      // "source: num_parallel_workers must be ...", as the message always read.
      return SpecError(Node("source"), absl::StrCat("num_parallel_workers ", Sv(kParallelismRule)));
    }
    return absl::OkStatus();
  }

  // Opens the source and makes its (selected) columns the element's slots.
  absl::Status BindSource() {
    ASSIGN_OR_RETURN(std::unique_ptr<Source> source, OpenSource(spec_.source()));
    lp_.source = std::move(source);
    lp_.source_parallelism = Parallelism(spec_.source().num_parallel_workers());
    const record::Schema& schema = lp_.source->schema();
    if (spec_.source().columns().empty()) {
      for (size_t c = 0; c < schema.columns.size(); ++c) {
        lp_.source_columns.push_back(c);
      }
    } else {
      for (const std::string& name : spec_.source().columns()) {
        const int c = schema.ColumnIndex(name);
        if (c < 0) {
          std::vector<std::string> names;
          for (const auto& col : schema.columns) names.push_back(col.name);
          return SpecError(Node("source", -1, "columns"),
                           absl::StrCat("unknown column '", name, "' (the source has ",
                                        absl::StrJoin(names, ", "), ")"));
        }
        lp_.source_columns.push_back(c);
      }
    }
    for (int c : lp_.source_columns) {
      const auto& col = schema.columns[c];
      lp_.column_names.push_back(col.name);
      types_.push_back(ColumnType{col.dtype, col.shape});
      written_.push_back(false);
    }
    infer_ctx_.source_image_shape = lp_.source->image_shape();
    return absl::OkStatus();
  }

  absl::Status AddNode(int i, const proto::PipelineNode& node) {
    switch (node.kind_case()) {
      case proto::PipelineNode::kShuffle:
        if (i != 0) {
          // "nodes[2] (shuffle): ...": the node is named by its list index.
          absl::Status s = absl::InvalidArgumentError(
              absl::StrCat("nodes[", i, "] (shuffle): shuffle must be the first node"));
          pipeline_spec::SetSpecLocation(Node("nodes", i), &s);
          return s;
        }
        lp_.shuffle = true;
        lp_.shuffle_seed = node.shuffle().seed();
        return absl::OkStatus();
      case proto::PipelineNode::kMap:
        return AddMap(node.map());
      case proto::PipelineNode::kFilter:
        return AddFilter(node.filter());
      case proto::PipelineNode::kBatch:
        return AddBatch(node.batch());
      case proto::PipelineNode::kPrefetch:
        return AddPrefetch(node.prefetch());
      case proto::PipelineNode::kCache:
        return AddCache(node.cache());
      case proto::PipelineNode::KIND_NOT_SET:
        break;
    }
    return SpecError(Node("nodes", i), "empty node");
  }

  // Checks the map's columns, builds each op alone (its factory validates the
  // fields) and infers each input column's type through the ops.
  absl::Status AddMap(const proto::MapNode& m) {
    const int index = maps_++;
    auto where = [&](std::string field = "") { return Node("map", index, std::move(field)); };
    LogicalMap lm;
    lm.name = absl::StrCat("map[", index, "]");
    if (seen_batch_) {
      return SpecError(where(), "map after batch is not supported");
    }
    if (m.num_parallel_workers() < -1 || m.num_parallel_workers() > kMaxParallelWorkers) {
      return SpecError(where("num_parallel_workers"), kParallelismRule);
    }
    lm.parallelism = Parallelism(m.num_parallel_workers());
    if (m.input_columns().empty()) {
      return SpecError(where("input_columns"), "must not be empty");
    }
    if (!m.output_columns().empty() && m.output_columns_size() != m.input_columns_size()) {
      return SpecError(where("output_columns"), "must have as many names as input_columns");
    }
    for (const std::string& name : m.input_columns()) {
      const int s = SlotOf(name);
      if (s < 0) return UnknownColumn(where("input_columns"), name);
      if (std::find(lm.slots.begin(), lm.slots.end(), s) != lm.slots.end()) {
        return SpecError(where("input_columns"), absl::StrCat("column '", name, "' listed twice"));
      }
      lm.slots.push_back(s);
    }
    if (m.ops().empty()) {
      return SpecError(where("ops"), "must not be empty");
    }
    for (int j = 0; j < m.ops_size(); ++j) {
      const proto::OpSpec& op = m.ops(j);
      SpecLocation at = where();
      at.op_index = j;
      lm.labels.push_back(OpLabel{position_ + j, std::string(OpTypeName(op.op_case())), at});
      const OpLabel& label = lm.labels.back();
      // The op's parameters. For a python op only the spec's own fields: whether this
      // process runs python ops is the executor's check (plan.cc builds the op), so a
      // consumer validates a spec that only its workers can run.
      RETURN_IF_ERROR(op.has_python() ? CheckPython(op.python(), label)
                                      : BuildOps({op}, {label}, /*fuse=*/false).status());
      if (op.has_python() &&
          static_cast<size_t>(op.python().output_dtypes_size()) > lm.slots.size()) {
        return label.FieldError(
            "output_dtypes",
            absl::StrCat("has ", op.python().output_dtypes_size(), " entries for the map's ",
                         lm.slots.size(), " columns: one per column, in order"));
      }
      for (size_t k = 0; k < lm.slots.size(); ++k) {
        infer_ctx_.column = static_cast<int>(k);
        RETURN_IF_ERROR(InferOpType(op, label, infer_ctx_, &types_[lm.slots[k]]));
      }
    }
    lm.ops.assign(m.ops().begin(), m.ops().end());
    position_ += m.ops_size();
    for (int s : lm.slots) written_[s] = true;
    for (int k = 0; k < m.output_columns_size(); ++k) {
      const std::string& out = m.output_columns(k);
      const int existing = SlotOf(out);
      if (existing >= 0 && existing != lm.slots[k]) {
        return SpecError(where("output_columns"),
                         absl::StrCat("'", out, "' already names another column"));
      }
      lp_.column_names[lm.slots[k]] = out;
    }
    for (int j = 0; j < m.ops_size() && !first_random_op_; ++j) {
      if (DrawsPerEpochRandomness(m.ops(j).op_case())) {
        first_random_op_ =
            absl::StrCat(lm.name, ".ops[", j, "] (", Sv(OpTypeName(m.ops(j).op_case())), ")");
      }
    }
    lp_.nodes.push_back(LogicalNode{std::move(lm), std::nullopt, std::nullopt});
    return absl::OkStatus();
  }

  // Parses the predicate over its column and decides whether it can run on
  // the shard index (pushdown): an indexed int64 column of a dataset source
  // that no map wrote or renamed.
  absl::Status AddFilter(const proto::FilterNode& node) {
    const int index = filters_++;
    const std::string name = absl::StrCat("filter[", index, "]");
    const SpecLocation pred_at = Node("filter", index, "predicate");
    if (seen_batch_) {
      return SpecError(Node("filter", index), "filter after batch is not supported");
    }
    const std::string& pred = node.predicate();
    // The column is the predicate's first word.
    size_t end = 0;
    while (end < pred.size() && (std::isalnum(static_cast<unsigned char>(pred[end])) ||
                                 pred[end] == '_' || pred[end] == '/' || pred[end] == '.')) {
      ++end;
    }
    const std::string column = pred.substr(0, end);
    if (column.empty()) {
      return SpecError(pred_at, absl::StrCat("expected '<column> <op> "
                                             "<value>', got '",
                                             pred, "'"));
    }
    const int s = SlotOf(column);
    if (s < 0) return UnknownColumn(pred_at, column);
    const ColumnType& t = types_[s];
    if ((t.dtype != DType::kInt64 && t.dtype != DType::kInt32) || !t.shape.empty()) {
      return SpecError(pred_at, absl::StrCat("column '", column, "' is ", t.ToString(),
                                             ", filters need an int32/int64 scalar "
                                             "column"));
    }
    record::Schema fs;
    fs.columns.push_back(record::ColumnSpec{column, DType::kInt64, {}, /*indexed=*/true});
    auto f = record::Filter::Parse(pred, fs);
    if (!f.ok()) return SpecError(pred_at, std::string(f.status().message()));
    LogicalFilter lf{name, pred, s, *f, false};
    const record::Schema& schema = lp_.source->schema();
    // After a cache node the filter must see the cached elements: pushed down, it would also
    // thin out what the cache's files hold, which other jobs with the same prefix read.
    if (!lp_.cache.has_value() && lp_.source->dataset() != nullptr && !written_[s] &&
        lp_.column_names[s] == schema.columns[lp_.source_columns[s]].name) {
      const auto& col = schema.columns[lp_.source_columns[s]];
      lf.pushable = col.indexed && col.dtype == DType::kInt64;
      if (lf.pushable) {
        auto real = record::Filter::Parse(pred, schema);
        if (real.ok()) {
          lf.filter = *real;
        } else {
          lf.pushable = false;
        }
      }
    }
    lp_.nodes.push_back(LogicalNode{std::nullopt, std::move(lf), std::nullopt});
    return absl::OkStatus();
  }

  // One batch node, after which every column must be numeric (stackable).
  absl::Status AddBatch(const proto::BatchNode& b) {
    if (seen_batch_) {
      return SpecError(Node("batch"), "only one batch node is supported");
    }
    seen_batch_ = true;
    if (b.size() <= 0) {
      return SpecError(Node("batch", -1, "size"), "must be > 0");
    }
    if (b.num_parallel_workers() < -1 || b.num_parallel_workers() > kMaxParallelWorkers) {
      return SpecError(Node("batch", -1, "num_parallel_workers"), kParallelismRule);
    }
    for (size_t s = 0; s < types_.size(); ++s) {
      if (!record::IsNumeric(types_[s].dtype)) {
        return SpecError(
            Node("batch"),
            absl::StrCat("column '", lp_.column_names[s], "' is ", types_[s].ToString(),
                         " and cannot be stacked; decode it or leave it "
                         "out with source.columns"));
      }
    }
    lp_.batch = LogicalBatch{b.size(), b.drop_remainder(), Parallelism(b.num_parallel_workers())};
    return absl::OkStatus();
  }

  // The cache node: named, at most one, before the batch, and nothing upstream may draw new
  // randomness each epoch (a cached copy would repeat epoch 1's augmentation).
  absl::Status AddCache(const proto::CacheNode& c) {
    const SpecLocation at = Node("cache", -1, "name");
    if (lp_.cache.has_value()) {
      return SpecError(Node("cache"), "only one cache node is supported");
    }
    if (seen_batch_) {
      return SpecError(Node("cache"),
                       "cache after batch is not supported: place it before the batch node");
    }
    if (c.name().empty()) return SpecError(at, "must not be empty");
    for (char ch : c.name()) {
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-' && ch != '.') {
        return SpecError(
            at, absl::StrCat("'", c.name(), "' may hold only letters, digits, '_', '-' and '.'"));
      }
    }
    if (first_random_op_.has_value()) {
      return SpecError(
          Node("cache"),
          absl::StrCat("cache '", c.name(), "' comes after ", *first_random_op_,
                       ", which draws new randomness each epoch, so a cached copy would repeat "
                       "epoch 1's augmentation; move the cache before that op"));
    }
    LogicalCache lc{c.name(), types_};
    lp_.cache = lc;
    lp_.nodes.push_back(LogicalNode{std::nullopt, std::nullopt, std::move(lc)});
    return absl::OkStatus();
  }

  absl::Status AddPrefetch(const proto::PrefetchNode& p) {
    seen_prefetch_ = true;
    const int n = p.buffer_size();
    if (n < -1) {
      return SpecError(Node("prefetch", -1, "buffer_size"), "must be > 0 or AUTOTUNE");
    }
    lp_.prefetch = n <= 0 ? kAutotune : n;
    return absl::OkStatus();
  }

  // The element slot named `name` now, or -1.
  int SlotOf(const std::string& name) const {
    for (size_t i = 0; i < lp_.column_names.size(); ++i) {
      if (lp_.column_names[i] == name) return static_cast<int>(i);
    }
    return -1;
  }

  absl::Status UnknownColumn(const SpecLocation& where, const std::string& name) const {
    return SpecError(where, absl::StrCat("unknown column '", name, "' (columns: ",
                                         absl::StrJoin(lp_.column_names, ", "), ")"));
  }

  const proto::Pipeline& spec_;
  LogicalPipeline lp_;
  std::vector<ColumnType> types_;  // each slot's type after the nodes so far
  std::vector<bool> written_;      // a map wrote the slot
  InferContext infer_ctx_;
  int maps_ = 0;
  int filters_ = 0;
  int position_ = 0;  // pipeline-wide index of the next map op
  bool seen_batch_ = false;
  bool seen_prefetch_ = false;
  // "map[1].ops[0] (RandomResizedCrop)": the first op so far that draws per-epoch randomness.
  std::optional<std::string> first_random_op_;
};

}  // namespace

absl::StatusOr<LogicalPipeline> Validate(const proto::Pipeline& spec) {
  return Validator(spec).Run();
}

absl::Status CheckOutputType(const LogicalPipeline& lp, const std::vector<Tensor>& columns,
                             bool batched) {
  if (columns.size() != lp.column_types.size()) {
    return absl::InternalError(absl::StrCat("output has ", columns.size(),
                                            " columns, the spec says ", lp.column_types.size()));
  }
  for (size_t c = 0; c < columns.size(); ++c) {
    const Tensor& t = columns[c];
    const ColumnType& want = lp.column_types[c];
    std::vector<int64_t> shape = want.shape;
    if (batched) shape.insert(shape.begin(), -1);
    bool ok = t.dtype() == want.dtype;
    if (ok && record::IsNumeric(want.dtype)) {
      ok = t.rank() == static_cast<int>(shape.size());
      for (size_t d = 0; ok && d < shape.size(); ++d) {
        ok = shape[d] < 0 || shape[d] == t.dim(d);
      }
    }
    if (!ok) {
      std::string said = record::IsNumeric(want.dtype)
                             ? absl::StrCat(record::DTypeName(want.dtype), ShapeToString(shape))
                             : std::string(record::DTypeName(want.dtype));
      if (batched) said = absl::StrReplaceAll(said, {{"[-1", "[N"}});
      return absl::InternalError(
          absl::StrCat("output column '", lp.column_names[c], "' is ", record::DTypeName(t.dtype()),
                       ShapeToString(t.shape()), ", the spec says ", said, " (-1: any size)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::data_worker::pipeline
