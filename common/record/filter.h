// Filters over indexed scalar columns, evaluated on the shard index alone (no
// data reads), like MindRecord's retrieval. Grammar, one predicate:
//   <column> (== | != | < | <= | > | >=) <number>
//   <column> in [<number>, <number>, ...]       set membership, as in Python
// Example: `label == 3`, `label in [1, 4]` (labels 1 and 4).
#ifndef SLUICE_COMMON_RECORD_FILTER_H_
#define SLUICE_COMMON_RECORD_FILTER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/record/dataset.h"

namespace sluice::record {

class Filter {
 public:
  // InvalidArgument for a syntax error or a column that is not indexed in
  // `schema`.
  static absl::StatusOr<Filter> Parse(const std::string& expression, const Schema& schema);

  // True if a record whose indexed column has raw index value `key` passes.
  bool Matches(int64_t key) const;
  const std::string& column() const { return column_; }

  // Global indices of the dataset's matching records, ascending.
  std::vector<uint64_t> Select(const Dataset& dataset) const;

 private:
  enum class Op { kEq, kNe, kLt, kLe, kGt, kGe, kIn };
  Filter() = default;
  bool Test(double value) const;

  std::string column_;
  bool is_float_ = false;
  Op op_ = Op::kEq;
  std::vector<double> operands_;
};

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_FILTER_H_
