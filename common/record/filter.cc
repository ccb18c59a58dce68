#include "common/record/filter.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice::record {

absl::StatusOr<Filter> Filter::Parse(const std::string& expression, const Schema& schema) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("filter '", expression, "': ", why));
  };
  absl::string_view rest = absl::StripAsciiWhitespace(expression);
  size_t name_end = 0;
  while (name_end < rest.size() &&
         (absl::ascii_isalnum(rest[name_end]) || rest[name_end] == '_' || rest[name_end] == '/')) {
    ++name_end;
  }
  Filter f;
  f.column_ = std::string(rest.substr(0, name_end));
  if (f.column_.empty()) return bad("expected a column name first");
  const int column = schema.ColumnIndex(f.column_);
  if (column < 0) return bad("no column '" + f.column_ + "'");
  if (!schema.columns[column].indexed) {
    return bad("column '" + f.column_ + "' is not indexed; filters read only indexed columns");
  }
  f.is_float_ = schema.columns[column].dtype == DType::kFloat32;
  rest = absl::StripLeadingAsciiWhitespace(rest.substr(name_end));

  static constexpr std::pair<absl::string_view, Op> kOps[] = {
      {"==", Op::kEq}, {"!=", Op::kNe}, {"<=", Op::kLe}, {">=", Op::kGe},
      {"<", Op::kLt},  {">", Op::kGt},  {"in", Op::kIn}};
  bool found = false;
  for (const auto& [text, op] : kOps) {
    if (absl::ConsumePrefix(&rest, text)) {
      f.op_ = op;
      found = true;
      break;
    }
  }
  if (!found) return bad("expected one of == != < <= > >= in after the column");
  rest = absl::StripAsciiWhitespace(rest);

  auto parse_number = [&](absl::string_view text) -> absl::StatusOr<double> {
    text = absl::StripAsciiWhitespace(text);
    double v;
    if (!absl::SimpleAtod(text, &v)) return bad(absl::StrCat("'", text, "' is not a number"));
    return v;
  };
  if (f.op_ == Op::kIn) {
    if (!absl::ConsumePrefix(&rest, "[") || !absl::ConsumeSuffix(&rest, "]")) {
      return bad("'in' takes a list: [1, 4]");
    }
    if (absl::StripAsciiWhitespace(rest).empty()) return bad("the 'in' list is empty");
    for (absl::string_view item : absl::StrSplit(rest, ',')) {
      auto v = parse_number(item);
      if (!v.ok()) return v.status();
      f.operands_.push_back(*v);
    }
  } else {
    auto v = parse_number(rest);
    if (!v.ok()) return v.status();
    f.operands_.push_back(*v);
  }
  return f;
}

bool Filter::Test(double value) const {
  const double x = operands_[0];
  switch (op_) {
    case Op::kEq:
      return value == x;
    case Op::kNe:
      return value != x;
    case Op::kLt:
      return value < x;
    case Op::kLe:
      return value <= x;
    case Op::kGt:
      return value > x;
    case Op::kGe:
      return value >= x;
    case Op::kIn:
      return std::find(operands_.begin(), operands_.end(), value) != operands_.end();
  }
  return false;
}

bool Filter::Matches(int64_t key) const {
  if (is_float_) {
    double d;
    std::memcpy(&d, &key, sizeof d);
    return Test(d);
  }
  return Test(static_cast<double>(key));
}

std::vector<uint64_t> Filter::Select(const Dataset& dataset) const {
  std::vector<uint64_t> out;
  for (size_t s = 0; s < dataset.num_shards(); ++s) {
    const ShardReader& shard = dataset.shard(s);
    const auto& names = shard.indexed_columns();
    const size_t k = std::find(names.begin(), names.end(), column_) - names.begin();
    for (uint64_t i = 0; i < shard.record_count(); ++i) {
      if (Matches(shard.key(i, k))) out.push_back(dataset.shard_starts()[s] + i);
    }
  }
  return out;
}

}  // namespace sluice::record
