// kernel_ceiling_bench: the ceilings `sluice pipeline run` is measured against
// (bench/compare_pytorch.sh), on images already in memory, with no reads, no
// queues, no ordering and no scheduling:
//
//   kernel_ceiling_bench --spec bench/pipelines/imagenet_train.yaml --data DS
//       [--threads N] [--epochs E] [--chain plan|fast|both|strict|all]
//       [--dct-rule engine|pow2|eighth|cost] [--dump FILE --dump-count K]
//       [--dump-boxes FILE --dump-count K]
//
// Three definitions on N threads or processes, worker t taking images t, t+N,
// ...:
//
//   plan  The physical plan the optimizer makes of the spec, without its
//         Read step: per element the batch stage's map ops (e.g.
//         Decode+RandomResizedCrop), then the element written into its slot
//         of the batch buffer as the plan says: through the batch write
//         fusion's op (RandomHorizontalFlip + Normalize+HWC2CHW into a float32
//         batch, Op::ApplyInto), or copied into a uint8 batch that the
//         vectorized ops (Normalize+HWC2CHW) then run on (`--disable-write`:
//         the plan without batch write fusion). What the engine would reach if
//         reading, queueing, ordering and thread hand-offs were free.
//   fast  The fastest chain written by hand for the same transforms at the
//         same fidelity: the same region decode (libjpeg-turbo ROI + DCT
//         scaling + one resize), then flip, center crop (eval),
//         normalize and HWC→CHW fused into one AVX2 pass written straight
//         into the element's slot of the float32 batch buffer. Supports the
//         two specs of bench/pipelines (train: decode, random_resized_crop,
//         random_horizontal_flip, normalize, hwc2chw; eval: decode,
//         resize, center_crop, normalize, hwc2chw).
//   strict The fast chain with everything else taken away: N processes
//         (forked once the JPEGs are in memory, one per core), each a single
//         persistent thread that decodes straight from the in-memory JPEG
//         (no per-element copy) at the DCT scale the engine would choose, and
//         writes flip+normalize+HWC→CHW into one batch buffer it reuses for
//         every batch. Strictly less work than the engine does.
//
// Each chain takes one untimed epoch, then E timed epochs, and prints
// `<chain>: <N> images/s`; `ceiling:` is the fastest of those run. Labels are
// batched too (int64), as the engine does. --dump writes the first K outputs of
// the plan chain in dataset order, float32 [K,3,H,W] raw, for
// bench/fidelity.py. --dump-boxes writes, for the first K images of epoch 0
// in dataset order, the crop box and flip the train spec draws (one line per
// image: `index I top left height width flip`), for bench/fidelity.py's
// torchvision comparison; then `size H W` of image 0 and --box-draws D
// boxes drawn on that size (`draw top left height width`) for its
// distribution test.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/random.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "common/tensor_kernels/normalize_kernel.h"
#include "data_worker/ops/decode.h"
#include "data_worker/ops/geometry.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"
#include "data_worker/pipeline/allocator.h"
#include "data_worker/pipeline/plan.h"
#include "data_worker/pipeline/spec.h"

namespace dw = sluice::data_worker;
namespace pl = sluice::data_worker::pipeline;

namespace {

struct Record {
  std::string jpeg;
  int64_t label = 0;
};

// One output: (global index, image tensor) → written into batch slot `slot`.
using ElementFn =
    std::function<bool(uint64_t global, uint64_t epoch, int64_t slot, dw::Tensor* batch)>;
using BatchFn = std::function<bool(dw::Tensor* batch)>;

// Runs one epoch of a chain on `threads` threads, each filling its own
// batches of `batch_size` (a new buffer per batch, as a pipeline hands each
// batch on).
bool RunEpoch(const std::vector<Record>& records, int threads, int batch_size, uint64_t epoch,
              dw::DType dtype, std::vector<int64_t> elem_shape, const ElementFn& element,
              const BatchFn& finish) {
  std::atomic<bool> failed{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<int64_t> shape = {batch_size};
      shape.insert(shape.end(), elem_shape.begin(), elem_shape.end());
      dw::Tensor batch;
      dw::Tensor labels;
      int64_t filled = 0;
      for (size_t i = t; i < records.size() && !failed; i += threads) {
        if (filled == 0) {
          batch = dw::Tensor::Allocate(dtype, shape);
          labels = dw::Tensor::Allocate(dw::DType::kInt64, {batch_size});
        }
        if (!element(i, epoch, filled, &batch)) {
          failed = true;
          return;
        }
        labels.data_as<int64_t>()[filled] = records[i].label;
        if (++filled == batch_size) {
          if (!finish(&batch)) failed = true;
          filled = 0;
        }
      }
      if (filled > 0 && !finish(&batch)) failed = true;
    });
  }
  for (auto& th : pool) th.join();
  return !failed;
}

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Images/s over `epochs` timed epochs after one warm-up; *cpu_us gets the
// process CPU time per image (robust to other jobs sharing the machine).
double Time(const std::function<bool(uint64_t)>& epoch_fn, int epochs, size_t images,
            double* cpu_us) {
  if (epochs <= 0) return 0;
  if (!epoch_fn(0)) return -1;  // warm-up
  const absl::Time start = absl::Now();
  const double cpu0 = CpuSeconds();
  for (int e = 1; e <= epochs; ++e) {
    if (!epoch_fn(e)) return -1;
  }
  *cpu_us = 1e6 * (CpuSeconds() - cpu0) / (double(images) * epochs);
  return images * epochs / absl::ToDoubleSeconds(absl::Now() - start);
}

// The strict chain: `processes` forked workers, worker p taking images p,
// p+P, ... with one batch buffer of `elem_shape` × batch_size reused for every
// batch. Each runs one untimed epoch, waits until all have, then runs `epochs`
// timed epochs and reports its CPU seconds for them. Returns images/s from the
// common start to the last worker's end (-1 if a worker failed); *cpu_us gets
// the workers' CPU time per image.
double RunStrict(const std::vector<Record>& records, int processes, int batch_size, int epochs,
                 std::vector<int64_t> elem_shape, const ElementFn& element, double* cpu_us) {
  int ready[2], go[2], done[2];
  if (pipe(ready) != 0 || pipe(go) != 0 || pipe(done) != 0) return -1;
  std::vector<pid_t> pids;
  for (int p = 0; p < processes; ++p) {
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid > 0) {
      pids.push_back(pid);
      continue;
    }
    close(ready[0]);
    close(go[1]);
    close(done[0]);
    std::vector<int64_t> shape = {batch_size};
    shape.insert(shape.end(), elem_shape.begin(), elem_shape.end());
    dw::Tensor batch = dw::Tensor::Allocate(dw::DType::kFloat32, shape);
    std::vector<int64_t> labels(batch_size);
    auto epoch = [&](uint64_t e) {
      int64_t filled = 0;
      for (size_t i = p; i < records.size(); i += processes) {
        if (!element(i, e, filled, &batch)) return false;
        labels[filled] = records[i].label;
        if (++filled == batch_size) filled = 0;
      }
      return true;
    };
    bool ok = epoch(0);
    char byte = 1;
    ok = write(ready[1], &byte, 1) == 1 && ok;
    ok = read(go[0], &byte, 1) == 1 && ok;
    const double cpu0 = CpuSeconds();
    for (int e = 1; ok && e <= epochs; ++e) ok = epoch(e);
    const double cpu = ok ? CpuSeconds() - cpu0 : -1;
    const bool sent = write(done[1], &cpu, sizeof cpu) == sizeof cpu;
    _exit(ok && sent ? 0 : 1);
  }
  close(ready[1]);
  close(go[0]);
  close(done[1]);
  bool ok = true;
  char byte;
  for (int p = 0; p < processes && ok; ++p) ok = read(ready[0], &byte, 1) == 1;
  const absl::Time start = absl::Now();
  for (int p = 0; p < processes && ok; ++p) ok = write(go[1], "g", 1) == 1;
  close(go[1]);  // a worker still waiting reads EOF if we failed
  double cpu_total = 0;
  for (int p = 0; p < processes && ok; ++p) {
    double cpu = -1;
    ok = read(done[0], &cpu, sizeof cpu) == sizeof cpu && cpu >= 0;
    cpu_total += cpu;
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  close(ready[0]);
  close(done[0]);
  for (pid_t pid : pids) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ok = false;
    }
  }
  if (!ok || epochs <= 0) return -1;
  *cpu_us = 1e6 * cpu_total / (double(records.size()) * epochs);
  return records.size() * epochs / secs;
}

// The full height and width of an encoded image, read from its header (the
// decode stops at the plan callback).
bool ImageSize(const std::string& encoded, int* height, int* width) {
  *height = *width = 0;
  (void)dw::DecodeImageRegion(encoded, [&](int h, int w) -> absl::StatusOr<dw::DecodePlan> {
    *height = h;
    *width = w;
    return absl::CancelledError("size only");
  });
  return *height > 0 && *width > 0;
}

// --dump-boxes: the crop box and flip the train spec draws for images
// 0..count-1 in epoch 0 (ops at positions 1 and 2, as the fast chain), then
// `draws` boxes drawn for elements 0..draws-1 on image 0's size.
bool DumpBoxes(const std::string& path, const std::vector<Record>& records, int count, int draws,
               uint64_t seed, const dw::RandomResizedCropSpec& rrc, float flip_p) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || records.empty()) return false;
  bool ok = true;
  for (size_t g = 0; g < records.size() && g < size_t(count); ++g) {
    int h, w;
    ok = ok && ImageSize(records[g].jpeg, &h, &w);
    const dw::ElementContext ctx{seed, 0, g};
    sluice::Rng crop_rng = ctx.RngFor(1);
    const dw::CropBox b = dw::RandomResizedCropBox(rrc, h, w, crop_rng);
    sluice::Rng flip_rng = ctx.RngFor(2);
    std::fprintf(f, "index %zu %d %d %d %d %d\n", g, b.top, b.left, b.height, b.width,
                 flip_rng.Bernoulli(flip_p) ? 1 : 0);
  }
  int h0, w0;
  ok = ok && ImageSize(records[0].jpeg, &h0, &w0);
  std::fprintf(f, "size %d %d\n", h0, w0);
  for (int d = 0; d < draws; ++d) {
    const dw::ElementContext ctx{seed, 0, uint64_t(d)};
    sluice::Rng rng = ctx.RngFor(1);
    const dw::CropBox b = dw::RandomResizedCropBox(rrc, h0, w0, rng);
    std::fprintf(f, "draw %d %d %d %d\n", b.top, b.left, b.height, b.width);
  }
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Kernel ceilings of a pipeline spec on N threads"};
  std::string spec_path, data, chain = "all", dct_rule = "engine", dump;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int epochs = 2, dump_count = 64;
  app.add_option("--spec", spec_path, "Pipeline spec")->required();
  app.add_option("--data", data, "Unirecord dataset folder")->required();
  app.add_option("--threads", threads, "Threads")->capture_default_str();
  app.add_option("--epochs", epochs, "Timed epochs")->capture_default_str();
  app.add_option("--chain", chain, "plan | fast | both | strict | all")->capture_default_str();
  app.add_option("--dct-rule", dct_rule,
                 "DCT scales of the fast and strict chains: engine (the "
                 "engine's default) | pow2 | eighth | cost")
      ->capture_default_str();
  std::string dump_boxes;
  int box_draws = 0;
  app.add_option("--dump-boxes", dump_boxes,
                 "Write the train spec's crop boxes and flips of the first "
                 "--dump-count images here");
  app.add_option("--box-draws", box_draws,
                 "Also write this many crop boxes drawn on image 0's size")
      ->capture_default_str();
  app.add_option("--dump", dump, "Write the plan chain's first outputs here");
  app.add_option("--dump-count", dump_count, "Outputs to --dump")->capture_default_str();
  bool disable_write = false;
  app.add_flag("--disable-write", disable_write,
               "The plan chain without batch write fusion (as `sluice pipeline run "
               "--disable batch_write_fusion`)");
  bool micro = false;
  app.add_flag("--micro", micro,
               "Also time the normalize pass alone: the old per-channel "
               "tables vs the AVX2 kernel, on one 64x224x224x3 batch");
  CLI11_PARSE(app, argc, argv);
  pl::ConfigureAllocatorForPipelines();  // as the CLI does

  auto spec = sluice::pipeline_spec::LoadPipelineSpecFile(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  spec->mutable_source()->mutable_dataset()->set_path(data);
  auto lp = pl::Validate(*spec);
  if (!lp.ok()) {
    std::fprintf(stderr, "%s\n", std::string(lp.status().message()).c_str());
    return 1;
  }
  pl::OptimizerOptions optimizer;
  optimizer.batch_write_fusion = !disable_write;
  auto plan = pl::Optimize(*lp, optimizer);
  if (!plan.ok() || !lp->batch) {
    std::fprintf(stderr, "the spec must validate and have a batch node\n");
    return 1;
  }
  const int batch_size = lp->batch->size;
  const sluice::record::Dataset& ds = *lp->source->dataset();
  const int image_col = ds.schema().ColumnIndex("image");
  const int label_col = ds.schema().ColumnIndex("label");
  std::vector<Record> records;
  for (uint64_t i = 0; i < ds.size(); ++i) {
    auto rec = ds.Read(i);
    if (!rec.ok()) return 1;
    Record r;
    r.jpeg = rec->columns[image_col].data;
    std::memcpy(&r.label, rec->columns[label_col].data.data(), sizeof r.label);
    records.push_back(std::move(r));
  }

  // --- plan: the optimizer's map steps per element, vectorized per batch.
  std::vector<std::shared_ptr<const dw::Op>> element_ops;
  int image_slot = 0;
  for (const auto& stage : plan->stages) {
    for (const auto& step : stage.steps) {
      if (step.kind != pl::Step::kMap) continue;
      element_ops.insert(element_ops.end(), step.map.ops.begin(), step.map.ops.end());
      image_slot = step.map.slots[0];
    }
  }
  std::vector<std::shared_ptr<const dw::Op>> batch_ops;
  for (const auto& [slot, ops] : plan->stages.back().vectorized) {
    if (slot == image_slot) batch_ops = ops;
  }
  // The element type entering the batch: from the first record.
  dw::Tensor probe = dw::Tensor::FromBytes(records[0].jpeg);
  for (const auto& op : element_ops) {
    auto r = op->Apply(std::move(probe), dw::ElementContext{lp->seed, 0, 0});
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    probe = std::move(*r);
  }
  // Batch write fusion: the image column is written through the plan's op.
  const pl::StagePlan::SlotWrite* slot_write = nullptr;
  for (const auto& w : plan->stages.back().writes) {
    if (w.slot == image_slot) slot_write = &w;
  }
  dw::DType batch_dtype = probe.dtype();
  std::vector<int64_t> batch_shape = probe.shape();
  if (slot_write != nullptr) {
    auto type = slot_write->op->OutputType(probe);
    if (!type.ok()) {
      std::fprintf(stderr, "%s\n", std::string(type.status().message()).c_str());
      return 1;
    }
    batch_dtype = type->dtype;
    batch_shape = type->shape;
  }
  std::printf("plan: %s\n", plan->Describe().c_str());
  std::printf("records: %zu in memory, %d threads, batch %d, avx2 %d\n", records.size(), threads,
              batch_size, sluice::kernels::NormalizeKernelUsesAvx2() ? 1 : 0);

  std::vector<char> dumped;
  std::atomic<int64_t> dump_elements{0};
  const ElementFn plan_element = [&](uint64_t g, uint64_t epoch, int64_t slot, dw::Tensor* batch) {
    dw::Tensor x = dw::Tensor::FromBytes(records[g].jpeg);
    const dw::ElementContext ctx{lp->seed, epoch, g};
    for (const auto& op : element_ops) {
      auto r = op->Apply(std::move(x), ctx);
      if (!r.ok()) return false;
      x = std::move(*r);
    }
    const int64_t bytes = batch->num_bytes() / batch->dim(0);
    if (slot_write != nullptr) {
      bool mirror = slot_write->mirror != nullptr && slot_write->mirror->Mirrors(ctx);
      if (mirror && !slot_write->op->MirrorsInto(x)) {
        auto r = slot_write->mirror->Apply(std::move(x), ctx);
        if (!r.ok()) return false;
        x = std::move(*r);
        mirror = false;
      }
      auto type = slot_write->op->OutputType(x);
      if (!type.ok() || type->shape != batch_shape) return false;
      slot_write->op->ApplyInto(x, mirror, batch->data() + slot * bytes);
      return true;
    }
    if (static_cast<int64_t>(x.num_bytes()) != bytes) return false;
    std::memcpy(batch->data() + slot * x.num_bytes(), x.data(), x.num_bytes());
    return true;
  };
  const BatchFn plan_finish = [&](dw::Tensor* batch) {
    for (const auto& op : batch_ops) {
      auto r = op->ApplyBatch(std::move(*batch));
      if (!r.ok()) return false;
      *batch = std::move(*r);
    }
    return true;
  };
  if (!dump.empty()) {
    // Dataset order, one thread: element i of batch 0, 1, ... in order.
    std::vector<Record> first(records.begin(),
                              records.begin() + std::min<size_t>(dump_count, records.size()));
    std::ofstream out(dump, std::ios::binary);
    const BatchFn write = [&](dw::Tensor* batch) {
      if (!plan_finish(batch)) return false;
      out.write(reinterpret_cast<const char*>(batch->data()), batch->num_bytes());
      return true;
    };
    if (!RunEpoch(first, 1, 1, 0, batch_dtype, batch_shape, plan_element, write)) {
      return 1;
    }
    std::printf("dumped %zu outputs to %s\n", first.size(), dump.c_str());
  }

  if (micro) {
    const int64_t n = 64, plane = 224 * 224;
    std::vector<uint8_t> in(n * plane * 3);
    for (size_t i = 0; i < in.size(); ++i) in[i] = (i * 131 + 7) & 255;
    std::vector<float> out(n * plane * 3);
    const float scale[3] = {1 / (255 * 0.229f), 1 / (255 * 0.224f), 1 / (255 * 0.225f)};
    const float bias[3] = {-0.485f / 0.229f, -0.456f / 0.224f, -0.406f / 0.225f};
    std::vector<float> lut(3 * 256);
    for (int c = 0; c < 3; ++c) {
      for (int v = 0; v < 256; ++v) {
        lut[c * 256 + v] = static_cast<float>(v) * scale[c] + bias[c];
      }
    }
    auto time_ms = [&](const std::function<void()>& fn) {
      fn();
      const absl::Time t0 = absl::Now();
      for (int r = 0; r < 10; ++r) fn();
      return absl::ToDoubleMilliseconds(absl::Now() - t0) / 10;
    };
    const double lut_ms = time_ms([&] {
      for (int64_t i = 0; i < n; ++i) {  // the previous kernel, verbatim
        const uint8_t* src = in.data() + i * plane * 3;
        float* d0 = out.data() + i * plane * 3;
        float *d1 = d0 + plane, *d2 = d0 + 2 * plane;
        for (int64_t p = 0; p < plane; ++p, src += 3) {
          d0[p] = lut[src[0]];
          d1[p] = lut[256 + src[1]];
          d2[p] = lut[512 + src[2]];
        }
      }
    });
    const double kernel_ms = time_ms([&] {
      for (int64_t i = 0; i < n; ++i) {
        sluice::kernels::NormalizeHwc3ToChw(in.data() + i * plane * 3, 1, plane, plane * 3, false,
                                            scale, bias, out.data() + i * plane * 3);
      }
    });
    std::printf("normalize: tables %.2f ms/batch, kernel %.2f ms/batch\n", lut_ms, kernel_ms);
  }

  double plan_rate = 0, fast_rate = 0, plan_cpu = 0, fast_cpu = 0;
  if (chain != "plan" && chain != "fast" && chain != "both" && chain != "strict" &&
      chain != "all") {
    std::fprintf(stderr, "--chain: unknown chain '%s'\n", chain.c_str());
    return 1;
  }
  if (chain == "plan" || chain == "both" || chain == "all") {
    plan_rate = Time(
        [&](uint64_t e) {
          return RunEpoch(records, threads, batch_size, e, batch_dtype, batch_shape, plan_element,
                          plan_finish);
        },
        epochs, records.size(), &plan_cpu);
    std::printf("plan: %.1f images/s, %.0f us CPU/image\n", plan_rate, plan_cpu);
  }

  double strict_rate = 0, strict_cpu = 0;
  if (chain != "plan" || !dump_boxes.empty()) {
    // Recognize the two shipped specs from their ops.
    std::vector<sluice::proto::OpSpec> ops;
    for (const auto& n : spec->nodes()) {
      if (n.has_map()) ops.insert(ops.end(), n.map().ops().begin(), n.map().ops().end());
    }
    const bool train =
        ops.size() == 5 && ops[1].has_random_resized_crop() && ops[2].has_random_horizontal_flip();
    const bool eval = ops.size() == 5 && ops[1].has_resize() && ops[2].has_center_crop();
    if (!(train || eval) || !ops[0].has_decode() || !ops[3].has_normalize() ||
        !ops[4].has_hwc2chw()) {
      std::fprintf(stderr, "fast chain: unsupported spec\n");
      return 1;
    }
    const dw::DctScaleRule rule = dct_rule == "eighth" ? dw::DctScaleRule::kSmallestEighth
                                  : dct_rule == "pow2" ? dw::DctScaleRule::kPowerOfTwo
                                  : dct_rule == "cost"
                                      ? dw::DctScaleRule::kCostModel
                                      : dw::DctScaleRuleOf(ops[0].decode().dct_scale());
    if (dct_rule != "engine" && dct_rule != "eighth" && dct_rule != "pow2" && dct_rule != "cost") {
      std::fprintf(stderr, "--dct-rule: unknown rule '%s'\n", dct_rule.c_str());
      return 1;
    }
    float scale[3], bias[3];
    const auto& norm = ops[3].normalize();
    for (int c = 0; c < 3; ++c) {
      const double mean = norm.mean(norm.mean_size() == 1 ? 0 : c);
      const double std = norm.std(norm.std_size() == 1 ? 0 : c);
      scale[c] = static_cast<float>(1.0 / (255.0 * std));
      bias[c] = static_cast<float>(-mean / std);
    }
    dw::RandomResizedCropSpec rrc;
    dw::ResizeSpec resize;
    dw::CenterCropSpec crop;
    int out_h = 0, out_w = 0;
    const dw::OpLabel label;
    if (train) {
      rrc = *dw::ParseRandomResizedCrop(ops[1].random_resized_crop(), label);
      out_h = rrc.height;
      out_w = rrc.width;
    } else {
      resize = *dw::ParseResize(ops[1].resize(), label);
      crop = *dw::ParseCenterCrop(ops[2].center_crop(), label);
      out_h = crop.height;
      out_w = crop.width;
    }
    const float flip_p = ops.size() > 2 && ops[2].has_random_horizontal_flip() &&
                                 ops[2].random_horizontal_flip().has_p()
                             ? ops[2].random_horizontal_flip().p()
                             : 0.5f;
    const ElementFn fast_element = [&](uint64_t g, uint64_t epoch, int64_t slot,
                                       dw::Tensor* batch) {
      const dw::ElementContext ctx{lp->seed, epoch, g};
      const dw::PlanFn plan_fn = [&](int h, int w) -> absl::StatusOr<dw::DecodePlan> {
        dw::DecodePlan p;
        if (train) {
          sluice::Rng rng = ctx.RngFor(1);
          p.box = dw::RandomResizedCropBox(rrc, h, w, rng);
          p.out_height = out_h;
          p.out_width = out_w;
        } else {
          p.box = dw::CropBox{0, 0, h, w};
          dw::ResizeOutputSize(resize, h, w, &p.out_height, &p.out_width);
        }
        p.interpolation = train ? rrc.interpolation : resize.interpolation;
        p.allow_dct_scaling = true;
        p.dct_rule = rule;
        p.idct = ops[0].decode().idct();  // the spec's JPEG settings, as the engine
        p.fast_upsampling = ops[0].decode().fast_upsampling();
        return p;
      };
      auto img = dw::DecodeImageRegion(records[g].jpeg, plan_fn);
      if (!img.ok()) return false;
      const int64_t h = img->dim(0), w = img->dim(1);
      int64_t top = 0, left = 0;
      bool flip = false;
      if (train) {
        sluice::Rng rng = ctx.RngFor(2);
        flip = rng.Bernoulli(flip_p);
      } else {
        auto box = dw::CenterCropBox(crop, static_cast<int>(h), static_cast<int>(w), dw::OpLabel{});
        if (!box.ok()) return false;
        top = box->top;
        left = box->left;
      }
      const int64_t plane = int64_t{out_h} * out_w;
      sluice::kernels::NormalizeHwc3ToChw(img->data() + (top * w + left) * 3, out_h, out_w, w * 3,
                                          flip, scale, bias,
                                          batch->data_as<float>() + slot * 3 * plane);
      return true;
    };
    if (!dump_boxes.empty()) {
      if (!train) {
        std::fprintf(stderr, "--dump-boxes needs the train spec\n");
        return 1;
      }
      if (!DumpBoxes(dump_boxes, records, dump_count, box_draws, lp->seed, rrc, flip_p)) {
        std::fprintf(stderr, "--dump-boxes: cannot write %s\n", dump_boxes.c_str());
        return 1;
      }
      std::printf("dumped boxes to %s\n", dump_boxes.c_str());
    }
    const BatchFn fast_finish = [](dw::Tensor*) { return true; };
    if (chain == "fast" || chain == "both" || chain == "all") {
      fast_rate = Time(
          [&](uint64_t e) {
            return RunEpoch(records, threads, batch_size, e, dw::DType::kFloat32, {3, out_h, out_w},
                            fast_element, fast_finish);
          },
          epochs, records.size(), &fast_cpu);
      std::printf("fast: %.1f images/s, %.0f us CPU/image (dct rule %s)\n", fast_rate, fast_cpu,
                  dct_rule.c_str());
    }
    if (chain == "strict" || chain == "all") {
      strict_rate = RunStrict(records, threads, batch_size, epochs, {3, out_h, out_w}, fast_element,
                              &strict_cpu);
      std::printf(
          "strict: %.1f images/s, %.0f us CPU/image (%d processes, "
          "dct rule %s)\n",
          strict_rate, strict_cpu, threads, dct_rule.c_str());
    }
  }
  std::printf("ceiling: %.1f images/s\n", std::max({plan_rate, fast_rate, strict_rate}));
  return plan_rate < 0 || fast_rate < 0 || strict_rate < 0 ? 1 : 0;
}
