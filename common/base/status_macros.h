// RETURN_IF_ERROR and ASSIGN_OR_RETURN: the one pair of status-propagation
// macros in sluice.
//
//   RETURN_IF_ERROR(file.Sync());
//   ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader,
//                    ShardReader::Open(path));
#ifndef SLUICE_COMMON_BASE_STATUS_MACROS_H_
#define SLUICE_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SLUICE_STATUS_CONCAT_INNER_(a, b) a##b
#define SLUICE_STATUS_CONCAT_(a, b) SLUICE_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                     \
    if (absl::Status sluice_status_ = (expr); !sluice_status_.ok()) return sluice_status_; \
  } while (false)

#define SLUICE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_STATUS_CONCAT_(sluice_statusor_, __LINE__), lhs, expr)

#endif  // SLUICE_COMMON_BASE_STATUS_MACROS_H_
