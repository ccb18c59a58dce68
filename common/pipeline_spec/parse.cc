#include "common/pipeline_spec/parse.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/pipeline_spec/location.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace sluice::pipeline_spec {
namespace {

using Json = nlohmann::ordered_json;

bool IsAutotune(std::string_view s) {
  if (s.size() != 8) return false;
  std::string u(s);
  std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return std::toupper(c); });
  return u == "AUTOTUNE";
}

// A plain YAML scalar that looks like a number → a JSON number. One that no double holds
// (1e999) stays a string, so the field it is given to reports it as not a number.
Json NumberJson(const std::string& s) {
  const std::string t = s[0] == '+' ? s.substr(1) : s;
  try {
    return Json::parse(t);
  } catch (const Json::exception&) {
    // "5." or ".5": valid YAML numbers, not JSON ones.
    double value = 0;
    if (absl::SimpleAtod(t, &value) && std::isfinite(value)) return Json(value);
    return Json(s);
  }
}

// Bounds of a spec's tree, so that no text can exhaust the parser: a number longer than
// kMaxNumberChars is not a number (std::regex recurses per character), nesting deeper than
// kMaxDepth and more than kMaxNodes values after alias expansion (a "billion laughs" alias
// bomb) are refused.
constexpr size_t kMaxNumberChars = 64;
constexpr int kMaxDepth = 64;
constexpr int64_t kMaxNodes = 1 << 20;

struct TreeBudget {
  int64_t nodes = 0;
  std::string error;  // set once a bound is passed
};

Json ToJson(const YAML::Node& node, TreeBudget& budget, int depth = 0) {
  if (!budget.error.empty()) return Json(nullptr);
  if (++budget.nodes > kMaxNodes) {
    budget.error = absl::StrCat("more than ", kMaxNodes, " values (after expanding aliases)");
    return Json(nullptr);
  }
  if (depth > kMaxDepth) {
    budget.error = absl::StrCat("nested deeper than ", kMaxDepth, " levels");
    return Json(nullptr);
  }
  if (node.IsMap()) {
    Json out = Json::object();
    for (const auto& kv : node) {
      out[kv.first.as<std::string>()] = ToJson(kv.second, budget, depth + 1);
    }
    return out;
  }
  if (node.IsSequence()) {
    Json out = Json::array();
    for (size_t i = 0; i < node.size(); ++i) out.push_back(ToJson(node[i], budget, depth + 1));
    return out;
  }
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    static const std::regex kNumber(R"([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)");
    if (IsAutotune(s)) return Json(-1);
    if (node.Tag() != "!") {
      if (s.size() <= kMaxNumberChars && std::regex_match(s, kNumber)) return NumberJson(s);
      if (s == "true") return Json(true);
      if (s == "false") return Json(false);
    }
    return Json(s);
  }
  return Json(nullptr);
}

// JSON input: AUTOTUNE strings become -1 as in YAML.
void ReplaceAutotune(Json* j) {
  if (j->is_string()) {
    if (IsAutotune(j->get_ref<const std::string&>())) *j = -1;
  } else if (j->is_structured()) {
    for (auto& v : *j) ReplaceAutotune(&v);
  }
}

absl::Status ParseInto(const Json& node, google::protobuf::Message* msg,
                       const SpecLocation& where) {
  if (node.is_null()) return absl::OkStatus();
  if (!node.is_object()) return SpecError(where, "expected a mapping");
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(node.dump(), msg, options);
  if (!status.ok()) {
    return SpecError(where, std::string(status.message().data(), status.message().size()));
  }
  return absl::OkStatus();
}

// The single key of a one-entry mapping such as `{decode: {}}`, or a bare
// name (`decode`).
absl::StatusOr<std::pair<std::string, Json>> OnlyEntry(const Json& node,
                                                       const SpecLocation& where) {
  if (node.is_string()) {
    return std::make_pair(node.get<std::string>(), Json(nullptr));
  }
  if (!node.is_object() || node.size() != 1) {
    return SpecError(where,
                     "expected a mapping with exactly one key, e.g. {map: "
                     "{...}}");
  }
  return std::make_pair(node.begin().key(), node.begin().value());
}

absl::Status ParseMap(const Json& body, int index, proto::MapNode* map) {
  const SpecLocation where{"map", index};
  if (!body.is_object()) return SpecError(where, "expected a mapping");
  Json rest = body;
  rest.erase("ops");
  if (absl::Status s = ParseInto(rest, map, where); !s.ok()) return s;
  const auto ops = body.find("ops");
  if (ops == body.end() || ops->is_null()) return absl::OkStatus();
  if (!ops->is_array()) {
    return SpecError(SpecLocation{"map", index, -1, "", "ops"}, "expected a list of ops");
  }
  for (size_t j = 0; j < ops->size(); ++j) {
    const SpecLocation op_where{"map", index, static_cast<int>(j)};
    auto entry = OnlyEntry((*ops)[j], op_where);
    if (!entry.ok()) return entry.status();
    const auto* field = proto::OpSpec::descriptor()->FindFieldByName(entry->first);
    if (field == nullptr || field->containing_oneof() == nullptr) {
      return SpecError(op_where, absl::StrCat("unknown op '", entry->first, "' (ops: ",
                                              absl::StrJoin(KnownOpNames(), ", "), ")"));
    }
    Json wrapped = Json::object();
    wrapped[entry->first] = entry->second.is_null() ? Json::object() : entry->second;
    if (absl::Status s = ParseInto(wrapped, map->add_ops(), op_where); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::Pipeline> ParseJson(const Json& root) {
  proto::Pipeline out;
  const SpecLocation top{"pipeline"};
  if (!root.is_object()) return SpecError(top, "expected a mapping at the top");
  int maps = 0, shuffles = 0, filters = 0;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    const Json& v = it.value();
    if (key == "seed") {
      if (v.is_number_unsigned()) {
        out.set_seed(v.get<uint64_t>());
      } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
        out.set_seed(static_cast<uint64_t>(v.get<int64_t>()));
      } else {
        return SpecError(SpecLocation{"seed"}, "expected a non-negative integer");
      }
    } else if (key == "on_error") {
      out.set_on_error(v.is_string() ? v.get<std::string>() : v.dump());
    } else if (key == "finish") {
      out.set_finish(v.is_string() ? v.get<std::string>() : v.dump());
    } else if (key == "source") {
      if (absl::Status s = ParseInto(v, out.mutable_source(), SpecLocation{"source"}); !s.ok()) {
        return s;
      }
    } else if (key == "nodes") {
      if (!v.is_array()) return SpecError(SpecLocation{"nodes"}, "expected a list");
      for (size_t i = 0; i < v.size(); ++i) {
        const SpecLocation node_where{"nodes", static_cast<int>(i)};
        auto entry = OnlyEntry(v[i], node_where);
        if (!entry.ok()) return entry.status();
        const std::string& kind = entry->first;
        const Json& body = entry->second;
        proto::PipelineNode* node = out.add_nodes();
        absl::Status s;
        if (kind == "map") {
          s = ParseMap(body, maps++, node->mutable_map());
        } else if (kind == "shuffle") {
          s = ParseInto(body, node->mutable_shuffle(), SpecLocation{"shuffle", shuffles++});
        } else if (kind == "filter") {
          s = ParseInto(body, node->mutable_filter(), SpecLocation{"filter", filters++});
        } else if (kind == "batch") {
          s = ParseInto(body, node->mutable_batch(), SpecLocation{"batch"});
        } else if (kind == "prefetch") {
          s = ParseInto(body, node->mutable_prefetch(), SpecLocation{"prefetch"});
        } else if (kind == "cache") {
          s = ParseInto(body, node->mutable_cache(), SpecLocation{"cache"});
        } else {
          return SpecError(node_where,
                           absl::StrCat("unknown node '", kind,
                                        "' (expected shuffle, map, filter, cache, batch "
                                        "or prefetch)"));
        }
        if (!s.ok()) return s;
      }
    } else {
      return SpecError(top, absl::StrCat("unknown field '", key,
                                         "' (expected source, nodes, seed, "
                                         "on_error, finish)"));
    }
  }
  return out;
}

// Strict JSON if the text looks like it and parses as it.
bool TryJson(std::string_view text, Json* out) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || text[first] != '{') return false;
  try {
    *out = Json::parse(text.begin(), text.end());
  } catch (const Json::exception&) {
    return false;
  }
  ReplaceAutotune(out);
  return true;
}

absl::StatusOr<Json> YamlToJsonTree(std::string_view text) {
  try {
    TreeBudget budget;
    Json tree = ToJson(YAML::Load(std::string(text)), budget);
    if (!budget.error.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline: the spec is ", budget.error));
    }
    return tree;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline: cannot parse YAML/JSON: ", e.what()));
  }
}

}  // namespace

std::vector<std::string> KnownOpNames() {
  std::vector<std::string> names;
  const auto* oneof = proto::OpSpec::descriptor()->FindOneofByName("op");
  for (int i = 0; i < oneof->field_count(); ++i) {
    names.push_back(std::string(oneof->field(i)->name()));
  }
  return names;
}

absl::StatusOr<std::string> YamlToJson(std::string_view yaml) {
  absl::StatusOr<Json> j = YamlToJsonTree(yaml);
  if (!j.ok()) return j.status();
  return j->dump();
}

absl::StatusOr<proto::Pipeline> ParsePipelineSpec(std::string_view text) {
  Json root;
  if (!TryJson(text, &root)) {
    absl::StatusOr<Json> j = YamlToJsonTree(text);
    if (!j.ok()) return j.status();
    root = std::move(*j);
  }
  // nlohmann throws on what it cannot serialize back (e.g. a string that is not UTF-8): the
  // caller gets InvalidArgument, never an exception.
  try {
    return ParseJson(root);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline spec: ", e.what(), " (is the spec UTF-8 text?)"));
  }
}

absl::StatusOr<proto::Pipeline> LoadPipelineSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("pipeline spec '", path, "' does not exist"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<proto::Pipeline> p = ParsePipelineSpec(ss.str());
  if (!p.ok()) {
    absl::Status s(p.status().code(), absl::StrCat(path, ": ", p.status().message()));
    if (auto loc = GetSpecLocation(p.status())) SetSpecLocation(*loc, &s);
    return s;
  }
  return p;
}

}  // namespace sluice::pipeline_spec
