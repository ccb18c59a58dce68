// Source: where a pipeline's records come from, read by global index.
//
// Three kinds (proto::SourceNode): a Unirecord dataset, an ImageFolder tree
// (numbered like the imagefolder converter numbers it: classes in sorted order,
// files in sorted relative-path order, so global index i is the same image in
// the folder and in the converted dataset), and synthetic JPEGs. All expose
// ImageClassificationSchema() columns image/label/key (a dataset: its own
// schema). Thread-safe: stage threads call Read concurrently.
#ifndef SLUICE_DATA_WORKER_PIPELINE_SOURCE_H_
#define SLUICE_DATA_WORKER_PIPELINE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/record/dataset.h"
#include "common/record/schema.h"
#include "data_worker/ops/tensor.h"
#include "proto/pipeline.pb.h"

namespace sluice::data_worker::pipeline {

class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  virtual const record::Schema& schema() const = 0;
  // Shape of a decoded image if every image has the same one, else {-1, -1, 3}.
  virtual std::vector<int64_t> image_shape() const { return {-1, -1, 3}; }
  // The values of schema columns `columns` of record `global`. DataLoss names
  // the file.
  virtual absl::StatusOr<std::vector<Tensor>> Read(uint64_t global,
                                                   const std::vector<int>& columns) const = 0;
  // As Read, into `out` (resized to `columns`): a source that can reuses the
  // storage of the tensors already there (Tensor::Reallocate), so a recycled
  // element (ElementPool) is read without allocating. Errors as Read; on an
  // error `out` holds unspecified tensors.
  virtual absl::Status ReadInto(uint64_t global, const std::vector<int>& columns,
                                std::vector<Tensor>* out) const {
    absl::StatusOr<std::vector<Tensor>> read = Read(global, columns);
    if (!read.ok()) return read.status();
    *out = std::move(*read);
    return absl::OkStatus();
  }
  // Where record `global` lives, for error messages: a shard or image file
  // path.
  virtual std::string Describe(uint64_t global) const = 0;
  // The dataset behind a Unirecord source (for filter pushdown), else null.
  virtual const record::Dataset* dataset() const { return nullptr; }
};

// NotFound "source: path '/x' does not exist"; InvalidArgument for an empty or
// unset source.
absl::StatusOr<std::unique_ptr<Source>> OpenSource(const proto::SourceNode& node);

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_SOURCE_H_
