// Pipeline spec text (YAML or JSON) → proto::Pipeline (proto/pipeline.proto).
//
// This is parsing only: it checks the shape of the text (known node kinds,
// known ops, known fields, field types), not whether the pipeline makes sense
// (columns, dtypes, crop sizes): data_worker/pipeline/spec.h validates. It
// depends on nothing but the protos, yaml-cpp and nlohmann, so the client
// library and the Python binding can parse specs.
//
// The format, one message per node (pipeline.proto documents every field):
//
//   seed: 0
//   on_error: fail                      # or skip
//   source: {dataset: {path: /data/imagenet-train}, columns: [image, label]}
//   nodes:
//     - shuffle: {seed: 0}
//     - map:
//         input_columns: [image]
//         ops: [decode, {random_resized_crop: {size: 224}}, ...]
//         num_parallel_workers: AUTOTUNE
//     - batch: {size: 64}
//     - prefetch: {buffer_size: AUTOTUNE}
//
// An op with default fields may be written as a bare name (`decode`). The
// scalar AUTOTUNE (any case, quoted or not) stands for -1 wherever it appears.
// Text whose first non-blank character is '{' and that parses as strict JSON
// is read as JSON; anything else as YAML (a superset of JSON, so a YAML flow
// mapping `{source: ...}` still works).
//
// Errors are InvalidArgument naming the node, op and field, with a
// SpecLocation payload (location.h): `map[1].ops[2]: unknown op 'blur' (ops:
// decode, resize, ...)`.
#ifndef SLUICE_COMMON_PIPELINE_SPEC_PARSE_H_
#define SLUICE_COMMON_PIPELINE_SPEC_PARSE_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/pipeline.pb.h"

namespace sluice::pipeline_spec {

// YAML or JSON text → Pipeline.
absl::StatusOr<proto::Pipeline> ParsePipelineSpec(std::string_view text);
// Reads and parses a .yaml/.yml/.json file. NotFound if it does not exist;
// parse errors are prefixed with the path.
absl::StatusOr<proto::Pipeline> LoadPipelineSpecFile(const std::string& path);

// YAML text → JSON text (nlohmann's emitter): plain scalars that look like
// numbers or booleans become numbers/booleans, AUTOTUNE becomes -1, anything
// else a string. InvalidArgument if the YAML does not parse.
absl::StatusOr<std::string> YamlToJson(std::string_view yaml);

// The op names a map accepts (the fields of proto::OpSpec's oneof, in
// declaration order): "decode", "resize", ...
std::vector<std::string> KnownOpNames();

}  // namespace sluice::pipeline_spec

#endif  // SLUICE_COMMON_PIPELINE_SPEC_PARSE_H_
