// SpecLocation: where in a pipeline spec (proto/pipeline.proto) an error is,
// carried by the error itself so that callers never parse message text.
//
// Nodes are named by kind and index among the nodes of that kind, ops by
// their index in the map's op list:
//
//   nodes:
//     - shuffle: {seed: 1}          shuffle[0]
//     - map:                        map[0]
//         ops:
//           - decode: {}            map[0].ops[0] (Decode)
//           - resize: {size: 0}     map[0].ops[1] (Resize)   <- "size must be > 0"
//     - filter: {...}               filter[0]
//     - batch: {size: 0}            batch.size               <- "must be > 0"
//
// The message users see is ToString() + ": " + the message, exactly as
// before the location was structured:
//   map[0].ops[1] (Resize): size must be > 0
//   batch.size: must be > 0
// An op error keeps its field in the message text (the op's factory writes
// "size must be > 0"); a node error puts the field in the path.
//
// SpecError() attaches the location as a Status payload; GetSpecLocation()
// reads it back (e.g. the CLI or a UI pointing at the YAML line).
#ifndef SLUICE_COMMON_PIPELINE_SPEC_LOCATION_H_
#define SLUICE_COMMON_PIPELINE_SPEC_LOCATION_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace sluice::pipeline_spec {

struct SpecLocation {
  // "map", "filter", "shuffle", "batch", "prefetch", "source", "nodes" (a
  // node whose kind is unknown), "on_error", "finish", "pipeline" (top
  // level), or ""
  // for an op built outside a pipeline (then ToString is "op <op_index>").
  std::string node;
  int node_index = -1;  // index among nodes of that kind; -1 = not indexed
  int op_index = -1;    // index in the map's ops (pipeline-wide position when
                        // node is empty); -1 = not an op
  std::string op_type;  // "RandomResizedCrop"; "" if unknown
  std::string field;    // "size", "input_columns"; "" = the whole node/op

  // "map[1].ops[2] (Resize)", "batch.size", "op 7 (Resize)", "nodes[3]".
  std::string ToString() const;
  bool operator==(const SpecLocation& o) const;
};

// InvalidArgument (or `code`) "<location>: <message>" with the location as
// payload.
absl::Status SpecError(const SpecLocation& location, std::string_view message,
                       absl::StatusCode code = absl::StatusCode::kInvalidArgument);
// Adds `location` as payload to `status` (message unchanged).
void SetSpecLocation(const SpecLocation& location, absl::Status* status);
// The location attached by SpecError, if any.
std::optional<SpecLocation> GetSpecLocation(const absl::Status& status);

}  // namespace sluice::pipeline_spec

#endif  // SLUICE_COMMON_PIPELINE_SPEC_LOCATION_H_
