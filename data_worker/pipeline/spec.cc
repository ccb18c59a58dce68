#include "data_worker/pipeline/spec.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "data_worker/ops/op.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace sluice::data_worker::pipeline {
namespace {

absl::string_view Sv(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

bool IsAutotune(const std::string& s) {
  std::string u = s;
  std::transform(u.begin(), u.end(), u.begin(),
                 [](unsigned char c) { return std::toupper(c); });
  return u == "AUTOTUNE";
}

// YAML node → JSON text (numbers, booleans and null only for plain scalars).
void ToJson(const YAML::Node& node, std::string* out) {
  if (node.IsMap()) {
    out->push_back('{');
    bool first = true;
    for (const auto& kv : node) {
      if (!first) out->push_back(',');
      first = false;
      AppendJsonString(kv.first.as<std::string>(), out);
      out->push_back(':');
      ToJson(kv.second, out);
    }
    out->push_back('}');
  } else if (node.IsSequence()) {
    out->push_back('[');
    for (size_t i = 0; i < node.size(); ++i) {
      if (i) out->push_back(',');
      ToJson(node[i], out);
    }
    out->push_back(']');
  } else if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    static const std::regex kNumber(R"([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)");
    if (IsAutotune(s)) {
      out->append("-1");
    } else if (node.Tag() != "!" &&
               (std::regex_match(s, kNumber) || s == "true" || s == "false")) {
      out->append(s[0] == '+' ? s.substr(1) : s);
    } else {
      AppendJsonString(s, out);
    }
  } else {
    out->append("null");
  }
}

absl::Status ParseInto(const YAML::Node& node, google::protobuf::Message* msg,
                       const std::string& where) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a mapping"));
  }
  std::string json;
  ToJson(node, &json);
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(json, msg, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ",
        std::string(status.message().data(), status.message().size())));
  }
  return absl::OkStatus();
}

// The single key of a one-entry mapping such as `{decode: {}}`.
absl::StatusOr<std::pair<std::string, YAML::Node>> OnlyEntry(
    const YAML::Node& node, const std::string& where) {
  if (node.IsScalar()) return std::make_pair(node.Scalar(), YAML::Node());
  if (!node.IsMap() || node.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected a mapping with exactly one key, e.g. {map: {...}}"));
  }
  auto it = node.begin();
  return std::make_pair(it->first.as<std::string>(), it->second);
}

absl::Status ParseMap(const YAML::Node& body, const std::string& name,
                      proto::MapNode* map) {
  if (!body.IsMap())
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected a mapping"));
  YAML::Node rest = YAML::Clone(body);
  YAML::Node ops = body["ops"];
  rest.remove("ops");
  RETURN_IF_ERROR(ParseInto(rest, map, name));
  if (!ops) return absl::OkStatus();
  if (!ops.IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".ops: expected a list of ops"));
  }
  for (size_t j = 0; j < ops.size(); ++j) {
    const std::string where = absl::StrCat(name, ".ops[", j, "]");
    ASSIGN_OR_RETURN(auto entry, OnlyEntry(ops[j], where));
    const auto* field =
        proto::OpSpec::descriptor()->FindFieldByName(entry.first);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown op '", entry.first,
                       "' (ops: decode, resize, center_crop, "
                       "random_resized_crop, random_crop, "
                       "random_horizontal_flip, random_rotation, color_jitter, "
                       "normalize, hwc2chw, cast, "
                       "one_hot, spin, sleep)"));
    }
    YAML::Node wrapped(YAML::NodeType::Map);
    wrapped[entry.first] =
        entry.second.IsNull() ? YAML::Node(YAML::NodeType::Map) : entry.second;
    RETURN_IF_ERROR(ParseInto(wrapped, map->add_ops(), where));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<proto::Pipeline> ParsePipeline(std::string_view text) {
  proto::Pipeline out;
  try {
    YAML::Node root = YAML::Load(std::string(text));
    if (!root.IsMap())
      return absl::InvalidArgumentError(
          "pipeline: expected a mapping at the top");
    int counts[5] = {0, 0, 0, 0, 0};
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (key == "seed") {
        out.set_seed(v.as<uint64_t>());
      } else if (key == "on_error") {
        out.set_on_error(v.as<std::string>());
      } else if (key == "source") {
        RETURN_IF_ERROR(ParseInto(v, out.mutable_source(), "source"));
      } else if (key == "nodes") {
        if (!v.IsSequence())
          return absl::InvalidArgumentError("nodes: expected a list");
        for (size_t i = 0; i < v.size(); ++i) {
          ASSIGN_OR_RETURN(auto entry,
                           OnlyEntry(v[i], absl::StrCat("nodes[", i, "]")));
          const std::string& kind = entry.first;
          proto::PipelineNode* node = out.add_nodes();
          if (kind == "map") {
            RETURN_IF_ERROR(ParseMap(entry.second,
                                     absl::StrCat("map[", counts[1]++, "]"),
                                     node->mutable_map()));
          } else if (kind == "shuffle") {
            RETURN_IF_ERROR(
                ParseInto(entry.second, node->mutable_shuffle(),
                          absl::StrCat("shuffle[", counts[0]++, "]")));
          } else if (kind == "filter") {
            RETURN_IF_ERROR(
                ParseInto(entry.second, node->mutable_filter(),
                          absl::StrCat("filter[", counts[2]++, "]")));
          } else if (kind == "batch") {
            RETURN_IF_ERROR(
                ParseInto(entry.second, node->mutable_batch(), "batch"));
          } else if (kind == "prefetch") {
            RETURN_IF_ERROR(
                ParseInto(entry.second, node->mutable_prefetch(), "prefetch"));
          } else {
            return absl::InvalidArgumentError(absl::StrCat(
                "nodes[", i, "]: unknown node '", kind,
                "' (expected shuffle, map, filter, batch or prefetch)"));
          }
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("pipeline: unknown field '", key,
                         "' (expected source, nodes, seed, on_error)"));
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: cannot parse YAML/JSON: ", e.what()));
  }
  return out;
}

absl::StatusOr<proto::Pipeline> LoadPipelineFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(
        absl::StrCat("pipeline spec '", path, "' does not exist"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto p = ParsePipeline(ss.str());
  if (!p.ok()) {
    return absl::Status(p.status().code(),
                        absl::StrCat(path, ": ", p.status().message()));
  }
  return p;
}

namespace {

// What validation knows about a column: dtype and shape, -1 for unknown
// dimensions.
struct ColType {
  DType dtype = DType::kBytes;
  std::vector<int64_t> shape;
  int64_t min_side =
      -1;  // known lower bound of min(H, W) for images, -1 if unknown
};

std::string TypeString(const ColType& t) {
  if (!record::IsNumeric(t.dtype)) return std::string(DTypeToString(t.dtype));
  return absl::StrCat(Sv(DTypeToString(t.dtype)), ShapeToString(t.shape));
}

bool IsImage(const ColType& t) {
  return Tensor::CvDepth(t.dtype) >= 0 &&
         (t.shape.size() == 3 || t.shape.size() == 2);
}

void CropSize(int size, int h, int w, int64_t* oh, int64_t* ow) {
  *oh = size > 0 ? size : h;
  *ow = size > 0 ? size : w;
}

// Infers the output type of one op; `where` is "map[1].ops[2] (Resize)".
absl::Status InferOp(const proto::OpSpec& op, const std::string& where,
                     const std::vector<int64_t>& source_image_shape,
                     ColType* t) {
  auto wrong = [&](std::string_view expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected ", Sv(expected), ", the column is ",
                     TypeString(*t)));
  };
  auto need_image = [&]() -> absl::Status {
    if (!IsImage(*t))
      return wrong("an image (H×W×C of uint8/int32/float16/float32)");
    return absl::OkStatus();
  };
  auto crop_check = [&](int64_t h, int64_t w) -> absl::Status {
    const int64_t H = t->shape[0], W = t->shape[1];
    if ((H >= 0 && h > H) || (W >= 0 && w > W) ||
        (t->min_side >= 0 && std::min(h, w) > t->min_side)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": crop ", h, "x", w, " is larger than the image (",
          H >= 0 ? absl::StrCat(H, "x", W)
                 : absl::StrCat("shorter side ", t->min_side),
          ")"));
    }
    return absl::OkStatus();
  };
  auto set_hw = [&](int64_t h, int64_t w) {
    t->shape[0] = h;
    t->shape[1] = w;
    t->min_side = (h >= 0 && w >= 0) ? std::min(h, w) : -1;
  };
  switch (op.op_case()) {
    case proto::OpSpec::kDecode:
      if (t->dtype != DType::kBytes) return wrong("encoded image bytes");
      t->dtype = DType::kUint8;
      t->shape = source_image_shape;
      t->min_side = (t->shape[0] >= 0 && t->shape[1] >= 0)
                        ? std::min(t->shape[0], t->shape[1])
                        : -1;
      return absl::OkStatus();
    case proto::OpSpec::kResize: {
      RETURN_IF_ERROR(need_image());
      const auto& r = op.resize();
      if (r.size() > 0) {
        const int64_t H = t->shape[0], W = t->shape[1];
        if (H >= 0 && W >= 0) {
          if (H <= W) {
            set_hw(r.size(), W * r.size() / H);
          } else {
            set_hw(H * r.size() / W, r.size());
          }
        } else {
          set_hw(-1, -1);
          t->min_side = r.size();
        }
      } else {
        set_hw(r.height(), r.width());
      }
      return absl::OkStatus();
    }
    case proto::OpSpec::kCenterCrop: {
      RETURN_IF_ERROR(need_image());
      int64_t h, w;
      const auto& c = op.center_crop();
      CropSize(c.size(), c.height(), c.width(), &h, &w);
      RETURN_IF_ERROR(crop_check(h, w));
      set_hw(h, w);
      return absl::OkStatus();
    }
    case proto::OpSpec::kRandomCrop: {
      RETURN_IF_ERROR(need_image());
      int64_t h, w;
      const auto& c = op.random_crop();
      CropSize(c.size(), c.height(), c.width(), &h, &w);
      if (c.padding() == 0 && !c.pad_if_needed())
        RETURN_IF_ERROR(crop_check(h, w));
      set_hw(h, w);
      return absl::OkStatus();
    }
    case proto::OpSpec::kRandomResizedCrop: {
      RETURN_IF_ERROR(need_image());
      int64_t h, w;
      const auto& c = op.random_resized_crop();
      CropSize(c.size(), c.height(), c.width(), &h, &w);
      set_hw(h, w);
      return absl::OkStatus();
    }
    case proto::OpSpec::kRandomHorizontalFlip:
    case proto::OpSpec::kRandomRotation:
      return need_image();
    case proto::OpSpec::kColorJitter:
      if (t->dtype != DType::kUint8 || t->shape.size() != 3 ||
          t->shape[2] != 3) {
        return wrong("a uint8 RGB image H×W×3");
      }
      return absl::OkStatus();
    case proto::OpSpec::kNormalize:
      if ((t->dtype != DType::kUint8 && t->dtype != DType::kFloat32) ||
          t->shape.empty()) {
        return wrong("a uint8 or float32 image");
      }
      t->dtype = DType::kFloat32;
      return absl::OkStatus();
    case proto::OpSpec::kHwc2Chw:
      if (!record::IsNumeric(t->dtype) || t->shape.size() != 3)
        return wrong("an H×W×C tensor");
      t->shape = {t->shape[2], t->shape[0], t->shape[1]};
      t->min_side = -1;
      return absl::OkStatus();
    case proto::OpSpec::kCast: {
      if (!record::IsNumeric(t->dtype)) return wrong("a numeric tensor");
      auto d = DTypeFromString(op.cast().dtype());
      if (!d.ok())
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", d.status().message()));
      t->dtype = *d;
      return absl::OkStatus();
    }
    case proto::OpSpec::kOneHot:
      if ((t->dtype != DType::kInt32 && t->dtype != DType::kInt64) ||
          !t->shape.empty()) {
        return wrong("an int32/int64 scalar label");
      }
      t->dtype = DType::kFloat32;
      t->shape = {op.one_hot().num_classes()};
      return absl::OkStatus();
    case proto::OpSpec::kSpin:
    case proto::OpSpec::kSleep:
      return absl::OkStatus();
    case proto::OpSpec::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": no op set"));
}

// "op 7 (Resize): size must be > 0" → "map[1].ops[2] (Resize): size must be >
// 0".
std::string Rename(std::string_view message, const std::string& node_op) {
  const size_t colon = message.find("): ");
  if (message.substr(0, 3) == "op " && colon != std::string_view::npos) {
    const size_t open = message.find(" (");
    return absl::StrCat(node_op, Sv(message.substr(open, colon + 1 - open)),
                        Sv(message.substr(colon + 1)));
  }
  return absl::StrCat(node_op, ": ", Sv(message));
}

int Parallelism(int v) { return v <= 0 ? kAutotune : v; }

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
    return absl::InvalidArgumentError(absl::StrCat(
        "on_error: '", spec.on_error(), "' is not one of fail, skip"));
  }
  if (spec.source().num_parallel_workers() < -1) {
    return absl::InvalidArgumentError(
        "source: num_parallel_workers must be > 0 or AUTOTUNE");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Source> source, OpenSource(spec.source()));
  lp.source = std::move(source);
  lp.source_parallelism = Parallelism(spec.source().num_parallel_workers());
  const record::Schema& schema = lp.source->schema();

  std::vector<ColType> types;
  if (spec.source().columns().empty()) {
    for (size_t c = 0; c < schema.columns.size(); ++c)
      lp.source_columns.push_back(c);
  } else {
    for (const std::string& name : spec.source().columns()) {
      const int c = schema.ColumnIndex(name);
      if (c < 0) {
        std::vector<std::string> names;
        for (const auto& col : schema.columns) names.push_back(col.name);
        return absl::InvalidArgumentError(absl::StrCat(
            "source.columns: unknown column '", name, "' (the source has ",
            absl::StrJoin(names, ", "), ")"));
      }
      lp.source_columns.push_back(c);
    }
  }
  std::vector<bool> written;
  for (int c : lp.source_columns) {
    const auto& col = schema.columns[c];
    lp.column_names.push_back(col.name);
    types.push_back(ColType{col.dtype, col.shape});
    written.push_back(false);
  }
  auto slot_of = [&](const std::string& name) {
    for (size_t i = 0; i < lp.column_names.size(); ++i) {
      if (lp.column_names[i] == name) return static_cast<int>(i);
    }
    return -1;
  };
  auto unknown_column = [&](const std::string& where, const std::string& name) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": unknown column '", name,
        "' (columns: ", absl::StrJoin(lp.column_names, ", "), ")"));
  };

  int maps = 0, filters = 0, position = 0;
  bool seen_batch = false, seen_prefetch = false;
  for (int i = 0; i < spec.nodes_size(); ++i) {
    const proto::PipelineNode& node = spec.nodes(i);
    if (seen_prefetch) {
      return absl::InvalidArgumentError(
          absl::StrCat("nodes[", i, "]: prefetch must be the last node"));
    }
    switch (node.kind_case()) {
      case proto::PipelineNode::kShuffle:
        if (i != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "nodes[", i, "] (shuffle): shuffle must be the first node"));
        }
        lp.shuffle = true;
        lp.shuffle_seed = node.shuffle().seed();
        break;
      case proto::PipelineNode::kMap: {
        const proto::MapNode& m = node.map();
        LogicalMap lm;
        lm.name = absl::StrCat("map[", maps++, "]");
        if (seen_batch) {
          return absl::InvalidArgumentError(
              absl::StrCat(lm.name, ": map after batch is not supported"));
        }
        if (m.num_parallel_workers() < -1) {
          return absl::InvalidArgumentError(absl::StrCat(
              lm.name, ".num_parallel_workers: must be > 0 or AUTOTUNE"));
        }
        lm.parallelism = Parallelism(m.num_parallel_workers());
        if (m.input_columns().empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(lm.name, ".input_columns: must not be empty"));
        }
        if (!m.output_columns().empty() &&
            m.output_columns_size() != m.input_columns_size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              lm.name,
              ".output_columns: must have as many names as input_columns"));
        }
        for (const std::string& name : m.input_columns()) {
          const int s = slot_of(name);
          if (s < 0)
            return unknown_column(absl::StrCat(lm.name, ".input_columns"),
                                  name);
          if (std::find(lm.slots.begin(), lm.slots.end(), s) !=
              lm.slots.end()) {
            return absl::InvalidArgumentError(absl::StrCat(
                lm.name, ".input_columns: column '", name, "' listed twice"));
          }
          lm.slots.push_back(s);
        }
        if (m.ops().empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(lm.name, ".ops: must not be empty"));
        }
        for (int j = 0; j < m.ops_size(); ++j) {
          const proto::OpSpec& op = m.ops(j);
          const std::string where = absl::StrCat(lm.name, ".ops[", j, "]");
          auto built = BuildOps({op}, position + j, /*fuse=*/false);
          if (!built.ok()) {
            return absl::Status(
                built.status().code(),
                Rename(std::string(built.status().message()), where));
          }
          const std::string where_op =
              absl::StrCat(where, " (", Sv((*built)[0]->name()), ")");
          for (int s : lm.slots) {
            RETURN_IF_ERROR(
                InferOp(op, where_op, lp.source->image_shape(), &types[s]));
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
              return absl::InvalidArgumentError(
                  absl::StrCat(lm.name, ".output_columns: '", out,
                               "' already names another column"));
            }
            lp.column_names[lm.slots[k]] = out;
          }
        }
        lp.nodes.push_back(LogicalNode{std::move(lm), std::nullopt});
        break;
      }
      case proto::PipelineNode::kFilter: {
        const std::string name = absl::StrCat("filter[", filters++, "]");
        if (seen_batch) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, ": filter after batch is not supported"));
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
        const int s = slot_of(column);
        if (column.empty() || s < 0) {
          if (column.empty()) {
            return absl::InvalidArgumentError(absl::StrCat(
                name, ".predicate: expected '<column> <op> <value>', got '",
                pred, "'"));
          }
          return unknown_column(absl::StrCat(name, ".predicate"), column);
        }
        const ColType& t = types[s];
        if ((t.dtype != DType::kInt64 && t.dtype != DType::kInt32) ||
            !t.shape.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              name, ".predicate: column '", column, "' is ", TypeString(t),
              ", filters need an int32/int64 scalar column"));
        }
        record::Schema fs;
        fs.columns.push_back(
            record::ColumnSpec{column, DType::kInt64, {}, /*indexed=*/true});
        auto f = record::Filter::Parse(pred, fs);
        if (!f.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, ".predicate: ", f.status().message()));
        }
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
        if (seen_batch)
          return absl::InvalidArgumentError(
              "batch: only one batch node is supported");
        seen_batch = true;
        const proto::BatchNode& b = node.batch();
        if (b.size() <= 0)
          return absl::InvalidArgumentError("batch.size: must be > 0");
        if (b.num_parallel_workers() < -1) {
          return absl::InvalidArgumentError(
              "batch.num_parallel_workers: must be > 0 or AUTOTUNE");
        }
        for (size_t s = 0; s < types.size(); ++s) {
          if (!record::IsNumeric(types[s].dtype)) {
            return absl::InvalidArgumentError(
                absl::StrCat("batch: column '", lp.column_names[s], "' is ",
                             TypeString(types[s]),
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
        if (n < -1)
          return absl::InvalidArgumentError(
              "prefetch.buffer_size: must be > 0 or AUTOTUNE");
        lp.prefetch = n <= 0 ? kAutotune : n;
        break;
      }
      case proto::PipelineNode::KIND_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrCat("nodes[", i, "]: empty node"));
    }
  }
  return lp;
}

}  // namespace sluice::data_worker::pipeline
