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

namespace sluice::data_worker::pipeline {

using pipeline_spec::SpecError;
using pipeline_spec::SpecLocation;

absl::StatusOr<proto::Pipeline> ParsePipeline(std::string_view text) {
  return pipeline_spec::ParsePipelineSpec(text);
}

absl::StatusOr<proto::Pipeline> LoadPipelineFile(const std::string& path) {
  return pipeline_spec::LoadPipelineSpecFile(path);
}

namespace {

int Parallelism(int v) { return v <= 0 ? kAutotune : v; }

SpecLocation Node(std::string kind, int index = -1, std::string field = "") {
  SpecLocation loc;
  loc.node = std::move(kind);
  loc.node_index = index;
  loc.field = std::move(field);
  return loc;
}

}  // namespace

absl::StatusOr<LogicalPipeline> Validate(const proto::Pipeline& spec) {
  LogicalPipeline lp;
  lp.spec = spec;
  lp.seed = spec.seed();
  if (spec.on_error().empty() || spec.on_error() == "fail") {
    lp.skip_errors = false;
  } else if (spec.on_error() == "skip") {
    lp.skip_errors = true;
  } else {
    return SpecError(Node("on_error"), absl::StrCat("'", spec.on_error(),
                                                    "' is not one of fail, "
                                                    "skip"));
  }
  if (absl::StatusOr<kernels::FinishMode> finish =
          kernels::ParseFinishMode(spec.finish());
      !finish.ok()) {
    return SpecError(Node("finish"),
                     absl::StrCat("'", spec.finish(),
                                  "' is not one of auto, worker, client"));
  }
  if (spec.source().num_parallel_workers() < -1) {
    // "source: num_parallel_workers must be ...", as the message always read.
    return SpecError(Node("source"),
                     "num_parallel_workers must be > 0 or AUTOTUNE");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Source> source, OpenSource(spec.source()));
  lp.source = std::move(source);
  lp.source_parallelism = Parallelism(spec.source().num_parallel_workers());
  const record::Schema& schema = lp.source->schema();

  std::vector<ColumnType> types;
  if (spec.source().columns().empty()) {
    for (size_t c = 0; c < schema.columns.size(); ++c) {
      lp.source_columns.push_back(c);
    }
  } else {
    for (const std::string& name : spec.source().columns()) {
      const int c = schema.ColumnIndex(name);
      if (c < 0) {
        std::vector<std::string> names;
        for (const auto& col : schema.columns) names.push_back(col.name);
        return SpecError(
            Node("source", -1, "columns"),
            absl::StrCat("unknown column '", name, "' (the source has ",
                         absl::StrJoin(names, ", "), ")"));
      }
      lp.source_columns.push_back(c);
    }
  }
  std::vector<bool> written;
  for (int c : lp.source_columns) {
    const auto& col = schema.columns[c];
    lp.column_names.push_back(col.name);
    types.push_back(ColumnType{col.dtype, col.shape});
    written.push_back(false);
  }
  auto slot_of = [&](const std::string& name) {
    for (size_t i = 0; i < lp.column_names.size(); ++i) {
      if (lp.column_names[i] == name) return static_cast<int>(i);
    }
    return -1;
  };
  auto unknown_column = [&](const SpecLocation& where,
                            const std::string& name) {
    return SpecError(where,
                     absl::StrCat("unknown column '", name, "' (columns: ",
                                  absl::StrJoin(lp.column_names, ", "), ")"));
  };
  InferContext infer_ctx;
  infer_ctx.source_image_shape = lp.source->image_shape();

  int maps = 0, filters = 0, position = 0;
  bool seen_batch = false, seen_prefetch = false;
  for (int i = 0; i < spec.nodes_size(); ++i) {
    const proto::PipelineNode& node = spec.nodes(i);
    if (seen_prefetch) {
      return SpecError(Node("nodes", i), "prefetch must be the last node");
    }
    switch (node.kind_case()) {
      case proto::PipelineNode::kShuffle:
        if (i != 0) {
          // "nodes[2] (shuffle): ...": the node is named by its list index.
          absl::Status s = absl::InvalidArgumentError(absl::StrCat(
              "nodes[", i, "] (shuffle): shuffle must be the first node"));
          pipeline_spec::SetSpecLocation(Node("nodes", i), &s);
          return s;
        }
        lp.shuffle = true;
        lp.shuffle_seed = node.shuffle().seed();
        break;
      case proto::PipelineNode::kMap: {
        const proto::MapNode& m = node.map();
        const int index = maps++;
        auto where = [&](std::string field = "") {
          return Node("map", index, std::move(field));
        };
        LogicalMap lm;
        lm.name = absl::StrCat("map[", index, "]");
        if (seen_batch) {
          return SpecError(where(), "map after batch is not supported");
        }
        if (m.num_parallel_workers() < -1) {
          return SpecError(where("num_parallel_workers"),
                           "must be > 0 or AUTOTUNE");
        }
        lm.parallelism = Parallelism(m.num_parallel_workers());
        if (m.input_columns().empty()) {
          return SpecError(where("input_columns"), "must not be empty");
        }
        if (!m.output_columns().empty() &&
            m.output_columns_size() != m.input_columns_size()) {
          return SpecError(where("output_columns"),
                           "must have as many names as input_columns");
        }
        for (const std::string& name : m.input_columns()) {
          const int s = slot_of(name);
          if (s < 0) return unknown_column(where("input_columns"), name);
          if (std::find(lm.slots.begin(), lm.slots.end(), s) !=
              lm.slots.end()) {
            return SpecError(where("input_columns"),
                             absl::StrCat("column '", name, "' listed twice"));
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
          const OpLabel label{position + j,
                              std::string(OpTypeName(op.op_case())), at};
          // Builds the op alone: its factory validates the fields.
          RETURN_IF_ERROR(BuildOps({op}, {label}, /*fuse=*/false).status());
          for (size_t k = 0; k < lm.slots.size(); ++k) {
            infer_ctx.column = static_cast<int>(k);
            RETURN_IF_ERROR(
                InferOpType(op, label, infer_ctx, &types[lm.slots[k]]));
          }
        }
        lm.ops.assign(m.ops().begin(), m.ops().end());
        lm.first_position = position;
        position += m.ops_size();
        for (int s : lm.slots) written[s] = true;
        if (!m.output_columns().empty()) {
          for (int k = 0; k < m.output_columns_size(); ++k) {
            const std::string& out = m.output_columns(k);
            const int existing = slot_of(out);
            if (existing >= 0 && existing != lm.slots[k]) {
              return SpecError(
                  where("output_columns"),
                  absl::StrCat("'", out, "' already names another column"));
            }
            lp.column_names[lm.slots[k]] = out;
          }
        }
        lp.nodes.push_back(LogicalNode{std::move(lm), std::nullopt});
        break;
      }
      case proto::PipelineNode::kFilter: {
        const int index = filters++;
        const std::string name = absl::StrCat("filter[", index, "]");
        const SpecLocation pred_at = Node("filter", index, "predicate");
        if (seen_batch) {
          return SpecError(Node("filter", index),
                           "filter after batch is not supported");
        }
        const std::string& pred = node.filter().predicate();
        // The column is the predicate's first word.
        size_t end = 0;
        while (end < pred.size() &&
               (std::isalnum(static_cast<unsigned char>(pred[end])) ||
                pred[end] == '_' || pred[end] == '/' || pred[end] == '.')) {
          ++end;
        }
        const std::string column = pred.substr(0, end);
        if (column.empty()) {
          return SpecError(pred_at, absl::StrCat("expected '<column> <op> "
                                                 "<value>', got '",
                                                 pred, "'"));
        }
        const int s = slot_of(column);
        if (s < 0) return unknown_column(pred_at, column);
        const ColumnType& t = types[s];
        if ((t.dtype != DType::kInt64 && t.dtype != DType::kInt32) ||
            !t.shape.empty()) {
          return SpecError(
              pred_at, absl::StrCat("column '", column, "' is ", t.ToString(),
                                    ", filters need an int32/int64 scalar "
                                    "column"));
        }
        record::Schema fs;
        fs.columns.push_back(
            record::ColumnSpec{column, DType::kInt64, {}, /*indexed=*/true});
        auto f = record::Filter::Parse(pred, fs);
        if (!f.ok())
          return SpecError(pred_at, std::string(f.status().message()));
        LogicalFilter lf{name, pred, s, *f, false};
        if (lp.source->dataset() != nullptr && !written[s] &&
            lp.column_names[s] == schema.columns[lp.source_columns[s]].name) {
          const auto& col = schema.columns[lp.source_columns[s]];
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
        lp.nodes.push_back(LogicalNode{std::nullopt, std::move(lf)});
        break;
      }
      case proto::PipelineNode::kBatch: {
        if (seen_batch) {
          return SpecError(Node("batch"), "only one batch node is supported");
        }
        seen_batch = true;
        const proto::BatchNode& b = node.batch();
        if (b.size() <= 0) {
          return SpecError(Node("batch", -1, "size"), "must be > 0");
        }
        if (b.num_parallel_workers() < -1) {
          return SpecError(Node("batch", -1, "num_parallel_workers"),
                           "must be > 0 or AUTOTUNE");
        }
        for (size_t s = 0; s < types.size(); ++s) {
          if (!record::IsNumeric(types[s].dtype)) {
            return SpecError(
                Node("batch"),
                absl::StrCat("column '", lp.column_names[s], "' is ",
                             types[s].ToString(),
                             " and cannot be stacked; decode it or leave it "
                             "out with source.columns"));
          }
        }
        lp.batch = LogicalBatch{b.size(), b.drop_remainder(),
                                Parallelism(b.num_parallel_workers())};
        break;
      }
      case proto::PipelineNode::kPrefetch: {
        seen_prefetch = true;
        const int n = node.prefetch().buffer_size();
        if (n < -1) {
          return SpecError(Node("prefetch", -1, "buffer_size"),
                           "must be > 0 or AUTOTUNE");
        }
        lp.prefetch = n <= 0 ? kAutotune : n;
        break;
      }
      case proto::PipelineNode::KIND_NOT_SET:
        return SpecError(Node("nodes", i), "empty node");
    }
  }
  lp.column_types = std::move(types);
  return lp;
}

absl::Status CheckOutputType(const LogicalPipeline& lp,
                             const std::vector<Tensor>& columns, bool batched) {
  if (columns.size() != lp.column_types.size()) {
    return absl::InternalError(absl::StrCat("output has ", columns.size(),
                                            " columns, the spec says ",
                                            lp.column_types.size()));
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
                             ? absl::StrCat(record::DTypeName(want.dtype),
                                            ShapeToString(shape))
                             : std::string(record::DTypeName(want.dtype));
      if (batched) said = absl::StrReplaceAll(said, {{"[-1", "[N"}});
      return absl::InternalError(
          absl::StrCat("output column '", lp.column_names[c], "' is ",
                       record::DTypeName(t.dtype()), ShapeToString(t.shape()),
                       ", the spec says ", said, " (-1: any size)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::data_worker::pipeline
