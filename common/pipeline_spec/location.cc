#include "common/pipeline_spec/location.h"

#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sluice::pipeline_spec {
namespace {

constexpr char kPayloadUrl[] = "type.sluice.dev/sluice.SpecLocation";

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

std::string SpecLocation::ToString() const {
  std::string out;
  if (node.empty()) {
    out = absl::StrCat("op ", op_index);
  } else {
    out = node;
    if (node_index >= 0) absl::StrAppend(&out, "[", node_index, "]");
    if (op_index >= 0) absl::StrAppend(&out, ".ops[", op_index, "]");
  }
  if (op_index >= 0) {
    if (!op_type.empty()) absl::StrAppend(&out, " (", op_type, ")");
  } else if (!field.empty()) {
    absl::StrAppend(&out, ".", field);
  }
  return out;
}

bool SpecLocation::operator==(const SpecLocation& o) const {
  return node == o.node && node_index == o.node_index && op_index == o.op_index &&
         op_type == o.op_type && field == o.field;
}

void SetSpecLocation(const SpecLocation& location, absl::Status* status) {
  // Fields cannot contain '\n' (they are identifiers).
  status->SetPayload(kPayloadUrl, absl::Cord(absl::StrCat(location.node, "\n", location.node_index,
                                                          "\n", location.op_index, "\n",
                                                          location.op_type, "\n", location.field)));
}

absl::Status SpecError(const SpecLocation& location, std::string_view message,
                       absl::StatusCode code) {
  absl::Status s(code, absl::StrCat(location.ToString(), ": ", Sv(message)));
  SetSpecLocation(location, &s);
  return s;
}

std::optional<SpecLocation> GetSpecLocation(const absl::Status& status) {
  auto payload = status.GetPayload(kPayloadUrl);
  if (!payload) return std::nullopt;
  const std::vector<std::string> parts = absl::StrSplit(std::string(*payload), '\n');
  if (parts.size() != 5) return std::nullopt;
  SpecLocation loc;
  loc.node = parts[0];
  if (!absl::SimpleAtoi(parts[1], &loc.node_index) || !absl::SimpleAtoi(parts[2], &loc.op_index)) {
    return std::nullopt;
  }
  loc.op_type = parts[3];
  loc.field = parts[4];
  return loc;
}

}  // namespace sluice::pipeline_spec
