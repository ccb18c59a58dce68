// Runs one split through an Executor the way a data worker does (Open, Submit,
// Next until the run ends) and hands back its outputs: for tests that compare
// a split's output with something else.
#ifndef SLUICE_TESTS_TESTING_EXECUTOR_TESTING_H_
#define SLUICE_TESTS_TESTING_EXECUTOR_TESTING_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "data_worker/pipeline/element.h"
#include "data_worker/pipeline/executor.h"

namespace sluice::testonly {

// Every output of the run over `global_indices` (in this order) of `epoch`,
// or the first error. Stops the executor's stream afterwards.
inline absl::StatusOr<std::vector<data_worker::pipeline::Element>> RunSplit(
    data_worker::pipeline::Executor& executor, std::vector<uint64_t> global_indices,
    uint64_t epoch) {
  std::vector<data_worker::pipeline::Element> outputs;
  absl::Status status = executor.Open();
  if (status.ok()) {
    status = executor.Submit(std::move(global_indices), epoch).status();
  }
  while (status.ok()) {
    absl::StatusOr<std::optional<data_worker::pipeline::Element>> next = executor.Next();
    if (!next.ok()) {
      status = next.status();
    } else if (!next->has_value()) {
      break;
    } else {
      outputs.push_back(std::move(**next));
    }
  }
  executor.Stop();
  if (!status.ok()) return status;
  return outputs;
}

}  // namespace sluice::testonly

#endif  // SLUICE_TESTS_TESTING_EXECUTOR_TESTING_H_
