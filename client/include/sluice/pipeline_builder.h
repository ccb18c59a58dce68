// PipelineBuilder: writes a sluice.proto.Pipeline (proto/pipeline.proto) from
// C++, the same message the YAML/JSON specs produce. Header-only; validation
// happens where the pipeline is run (the worker or `sluice pipeline run`), with
// errors naming the node: "map[0].ops[1] (...)".
//
//   using namespace sluice;
//   proto::Pipeline p =
//       PipelineBuilder()
//           .Dataset("/data/imagenet-train")
//           .Columns({"image", "label"})
//           .Shuffle(/*seed=*/0)
//           .Map({"image"}, {Decode(), RandomResizedCrop(224),
//                            RandomHorizontalFlip(),
//                            Normalize(kImageNetMean, kImageNetStd),
//                            HWC2CHW()})
//           .Batch(64)
//           .Prefetch(kAutotune)
//           .Build();
#ifndef SLUICE_CLIENT_INCLUDE_SLUICE_PIPELINE_BUILDER_H_
#define SLUICE_CLIENT_INCLUDE_SLUICE_PIPELINE_BUILDER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "proto/ops.pb.h"
#include "proto/pipeline.pb.h"

namespace sluice {

// num_parallel_workers / buffer_size: let the autotuner decide.
inline constexpr int kAutotune = -1;

inline const std::vector<float> kImageNetMean = {0.485f, 0.456f, 0.406f};
inline const std::vector<float> kImageNetStd = {0.229f, 0.224f, 0.225f};

// --- Ops (proto/ops.proto documents each; unset fields take torchvision's
// defaults) ---
inline proto::OpSpec Decode() {
  proto::OpSpec op;
  op.mutable_decode();
  return op;
}
inline proto::OpSpec Resize(int size) {
  proto::OpSpec op;
  op.mutable_resize()->set_size(size);
  return op;
}
inline proto::OpSpec Resize(int height, int width) {
  proto::OpSpec op;
  op.mutable_resize()->set_height(height);
  op.mutable_resize()->set_width(width);
  return op;
}
inline proto::OpSpec CenterCrop(int size) {
  proto::OpSpec op;
  op.mutable_center_crop()->set_size(size);
  return op;
}
inline proto::OpSpec RandomResizedCrop(int size) {
  proto::OpSpec op;
  op.mutable_random_resized_crop()->set_size(size);
  return op;
}
inline proto::OpSpec RandomResizedCrop(int size, float scale_min, float scale_max) {
  proto::OpSpec op = RandomResizedCrop(size);
  op.mutable_random_resized_crop()->set_scale_min(scale_min);
  op.mutable_random_resized_crop()->set_scale_max(scale_max);
  return op;
}
inline proto::OpSpec RandomCrop(int size, int padding = 0) {
  proto::OpSpec op;
  op.mutable_random_crop()->set_size(size);
  op.mutable_random_crop()->set_padding(padding);
  return op;
}
inline proto::OpSpec RandomHorizontalFlip() {
  proto::OpSpec op;
  op.mutable_random_horizontal_flip();
  return op;
}
inline proto::OpSpec RandomHorizontalFlip(float p) {
  proto::OpSpec op;
  op.mutable_random_horizontal_flip()->set_p(p);
  return op;
}
inline proto::OpSpec RandomRotation(float degrees) {
  proto::OpSpec op;
  op.mutable_random_rotation()->set_degrees(degrees);
  return op;
}
inline proto::OpSpec ColorJitter(float brightness, float contrast, float saturation, float hue) {
  proto::OpSpec op;
  auto* c = op.mutable_color_jitter();
  c->set_brightness(brightness);
  c->set_contrast(contrast);
  c->set_saturation(saturation);
  c->set_hue(hue);
  return op;
}
inline proto::OpSpec Normalize(const std::vector<float>& mean, const std::vector<float>& std) {
  proto::OpSpec op;
  for (float m : mean) op.mutable_normalize()->add_mean(m);
  for (float s : std) op.mutable_normalize()->add_std(s);
  return op;
}
inline proto::OpSpec HWC2CHW() {
  proto::OpSpec op;
  op.mutable_hwc2chw();
  return op;
}
inline proto::OpSpec Cast(const std::string& dtype, bool scale = false) {
  proto::OpSpec op;
  op.mutable_cast()->set_dtype(dtype);
  op.mutable_cast()->set_scale(scale);
  return op;
}
inline proto::OpSpec OneHot(int num_classes) {
  proto::OpSpec op;
  op.mutable_one_hot()->set_num_classes(num_classes);
  return op;
}
inline proto::OpSpec Spin(int64_t cpu_micros) {
  proto::OpSpec op;
  op.mutable_spin()->set_cpu_micros(cpu_micros);
  return op;
}
inline proto::OpSpec Sleep(int64_t micros) {
  proto::OpSpec op;
  op.mutable_sleep()->set_micros(micros);
  return op;
}
// module.function(*columns, rng=numpy.random.Generator) in the worker's Python
// processes, on all of the map's input columns (docs/python.md, "Python
// transforms"). `output_dtypes`: one per column, "" or none = the input's.
// `group`: elements per request to a Python process (0: 8; 1: one at a time).
// Only the names travel: the module must be importable on the worker.
inline proto::OpSpec Python(const std::string& module, const std::string& function,
                            const std::vector<std::string>& output_dtypes = {}, int group = 0) {
  proto::OpSpec op;
  op.mutable_python()->set_module(module);
  op.mutable_python()->set_function(function);
  if (group != 0) op.mutable_python()->set_group(group);
  for (const std::string& d : output_dtypes) {
    op.mutable_python()->add_output_dtypes(d);
  }
  return op;
}

// Builds a Pipeline node by node, in the order written. Not thread-safe; cheap
// to copy.
class PipelineBuilder {
 public:
  // --- Source (one of) ---
  PipelineBuilder& Dataset(const std::string& path) {
    p_.mutable_source()->mutable_dataset()->set_path(path);
    return *this;
  }
  PipelineBuilder& ImageFolder(const std::string& path) {
    p_.mutable_source()->mutable_image_folder()->set_path(path);
    return *this;
  }
  PipelineBuilder& Synthetic(int64_t num_records, int height = 256, int width = 256,
                             int num_classes = 10) {
    auto* s = p_.mutable_source()->mutable_synthetic();
    s->set_num_records(num_records);
    s->set_height(height);
    s->set_width(width);
    s->set_num_classes(num_classes);
    return *this;
  }
  // Source columns to emit (default: all).
  PipelineBuilder& Columns(const std::vector<std::string>& columns) {
    for (const auto& c : columns) p_.mutable_source()->add_columns(c);
    return *this;
  }
  PipelineBuilder& SourceWorkers(int n) {
    p_.mutable_source()->set_num_parallel_workers(n);
    return *this;
  }
  // Job seed of the random ops.
  PipelineBuilder& Seed(uint64_t seed) {
    p_.set_seed(seed);
    return *this;
  }
  // "fail" (default) or "skip".
  PipelineBuilder& OnError(const std::string& policy) {
    p_.set_on_error(policy);
    return *this;
  }

  // Where normalize [, hwc2chw] [, cast to float32] before the batch runs when
  // served: "auto" (default), "worker" or "client" (proto/pipeline.proto).
  PipelineBuilder& Finish(const std::string& where) {
    p_.set_finish(where);
    return *this;
  }

  // --- Nodes ---
  PipelineBuilder& Shuffle(uint64_t seed) {
    p_.add_nodes()->mutable_shuffle()->set_seed(seed);
    return *this;
  }
  PipelineBuilder& Map(const std::vector<std::string>& input_columns,
                       const std::vector<proto::OpSpec>& ops,
                       int num_parallel_workers = kAutotune) {
    return Map(input_columns, {}, ops, num_parallel_workers);
  }
  PipelineBuilder& Map(const std::vector<std::string>& input_columns,
                       const std::vector<std::string>& output_columns,
                       const std::vector<proto::OpSpec>& ops,
                       int num_parallel_workers = kAutotune) {
    proto::MapNode* m = p_.add_nodes()->mutable_map();
    for (const auto& c : input_columns) m->add_input_columns(c);
    for (const auto& c : output_columns) m->add_output_columns(c);
    for (const auto& op : ops) *m->add_ops() = op;
    m->set_num_parallel_workers(num_parallel_workers);
    return *this;
  }
  // `predicate`: e.g. "label in [1, 4]" (common/record/filter.h grammar).
  PipelineBuilder& Filter(const std::string& predicate) {
    p_.add_nodes()->mutable_filter()->set_predicate(predicate);
    return *this;
  }
  PipelineBuilder& Batch(int size, bool drop_remainder = false) {
    proto::BatchNode* b = p_.add_nodes()->mutable_batch();
    b->set_size(size);
    b->set_drop_remainder(drop_remainder);
    return *this;
  }
  PipelineBuilder& Prefetch(int buffer_size) {
    p_.add_nodes()->mutable_prefetch()->set_buffer_size(buffer_size);
    return *this;
  }
  // A cache node (docs/cache.md): the first epoch writes the elements reaching it, later epochs
  // and jobs with the same prefix read them. Before Batch; nothing random before it.
  PipelineBuilder& Cache(const std::string& name) {
    p_.add_nodes()->mutable_cache()->set_name(name);
    return *this;
  }

  proto::Pipeline Build() const { return p_; }

 private:
  proto::Pipeline p_;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_INCLUDE_SLUICE_PIPELINE_BUILDER_H_
