#include "data_worker/ops/tensor_ops.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tensor_kernels/normalize_kernel.h"
#include "opencv2/core.hpp"

namespace sluice::data_worker {
namespace {

// Per-channel x * scale + bias, with 256-entry tables for uint8 input (one
// home: common/tensor_kernels, shared with the client's finishing).
using Normalizer = kernels::NormalizeCoefficients;

template <typename Out>
Out FromFloat(float v) {
  if constexpr (std::is_same_v<Out, float>) {
    return v;
  } else {
    return Out(v);
  }
}

// Normalizes `blocks` runs of `inner` elements; run b has channel b % channels.
// Channels-last data is inner = 1, channels = C.
template <typename Out>
void NormalizeRuns(const Normalizer& norm, const Tensor& in, Out* out, int64_t blocks,
                   int64_t inner, int channels) {
  if constexpr (std::is_same_v<Out, float>) {
    if (inner == 1) {  // channels-last: the shared kernel
      const int64_t pixels = blocks / channels;
      if (in.dtype() == DType::kUint8) {
        kernels::NormalizeImage(norm, in.data(), pixels, channels,
                                /*chw=*/false, out);
      } else {
        kernels::NormalizeImage(norm, in.data_as<float>(), pixels, channels,
                                /*chw=*/false, out);
      }
      return;
    }
  }
  if (in.dtype() == DType::kUint8) {
    const uint8_t* src = in.data();
    if (inner == 1) {
      const int64_t pixels = blocks / channels;
      if (channels == 3) {
        const float *l0 = norm.lut(0), *l1 = norm.lut(1), *l2 = norm.lut(2);
        for (int64_t i = 0; i < pixels; ++i, src += 3, out += 3) {
          out[0] = FromFloat<Out>(l0[src[0]]);
          out[1] = FromFloat<Out>(l1[src[1]]);
          out[2] = FromFloat<Out>(l2[src[2]]);
        }
        return;
      }
      for (int64_t i = 0; i < pixels; ++i) {
        for (int c = 0; c < channels; ++c) {
          *out++ = FromFloat<Out>(norm.lut(c)[*src++]);
        }
      }
      return;
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const float* l = norm.lut(static_cast<int>(b % channels));
      for (int64_t j = 0; j < inner; ++j) *out++ = FromFloat<Out>(l[*src++]);
    }
    return;
  }
  const float* src = in.data_as<float>();
  if (inner == 1) {
    const int64_t pixels = blocks / channels;
    for (int64_t i = 0; i < pixels; ++i) {
      for (int c = 0; c < channels; ++c) {
        *out++ = FromFloat<Out>(*src++ * norm.scale(c) + norm.bias(c));
      }
    }
    return;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const int c = static_cast<int>(b % channels);
    const float s = norm.scale(c), bias = norm.bias(c);
    for (int64_t j = 0; j < inner; ++j) *out++ = FromFloat<Out>(*src++ * s + bias);
  }
}

class NormalizeOpImpl final : public Op {
 public:
  NormalizeOpImpl(OpLabel label, NormalizeSpec spec)
      : label_(std::move(label)), spec_(std::move(spec)), norm_(spec_.mean, spec_.std) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    return Run(input);
  }
  bool has_batched_kernel() const override { return true; }
  absl::StatusOr<Tensor> ApplyBatch(Tensor batch) const override { return Run(batch); }

 private:
  absl::StatusOr<Tensor> Run(const Tensor& in) const {
    const char* expectation = spec_.channels_first
                                  ? "uint8 or float32 C×H×W (or N×C×H×W) with C matching mean/std"
                                  : "uint8 or float32 H×W×C (or N×H×W×C) with C matching mean/std";
    const int min_rank = spec_.channels_first ? 3 : 1;
    if ((in.dtype() != DType::kUint8 && in.dtype() != DType::kFloat32) || in.rank() < min_rank) {
      return label_.InputError(expectation, in);
    }
    const int64_t c = spec_.channels_first ? in.dim(in.rank() - 3) : in.dim(in.rank() - 1);
    if (!norm_.Accepts(c)) return label_.InputError(expectation, in);
    Tensor out = Tensor::Allocate(DType::kFloat32, in.shape());
    const int64_t n = in.num_elements();
    if (n == 0) return out;
    if (spec_.channels_first) {
      const int64_t inner = in.dim(in.rank() - 1) * in.dim(in.rank() - 2);
      NormalizeRuns(norm_, in, out.data_as<float>(), n / inner, inner, static_cast<int>(c));
    } else {
      NormalizeRuns(norm_, in, out.data_as<float>(), n, 1, static_cast<int>(c));
    }
    return out;
  }

  OpLabel label_;
  NormalizeSpec spec_;
  Normalizer norm_;
};

// One H×W×C image at `src` → C×H×W at `dst`.
void HwcToChw(const uint8_t* src, uint8_t* dst, int64_t h, int64_t w, int64_t c, DType dtype) {
  const size_t es = record::DTypeSize(dtype);
  const int depth = Tensor::CvDepth(dtype);
  const int64_t plane = h * w;
  if (depth >= 0 && c <= CV_CN_MAX && h <= INT32_MAX && w <= INT32_MAX) {
    const cv::Mat in(static_cast<int>(h), static_cast<int>(w),
                     CV_MAKETYPE(depth, static_cast<int>(c)), const_cast<uint8_t*>(src));
    std::vector<cv::Mat> planes;
    for (int64_t k = 0; k < c; ++k) {
      planes.emplace_back(static_cast<int>(h), static_cast<int>(w), depth, dst + k * plane * es);
    }
    cv::split(in, planes);
    bool in_place = true;
    for (int64_t k = 0; k < c; ++k) {
      in_place &= planes[k].data == dst + k * plane * es;
    }
    if (in_place) return;
  }
  for (int64_t p = 0; p < plane; ++p) {
    for (int64_t k = 0; k < c; ++k) {
      std::memcpy(dst + (k * plane + p) * es, src + (p * c + k) * es, es);
    }
  }
}

class Hwc2ChwOpImpl final : public Op {
 public:
  explicit Hwc2ChwOpImpl(OpLabel label) : label_(std::move(label)) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    if (input.rank() != 3 || record::DTypeSize(input.dtype()) == 0) {
      return label_.InputError("a numeric H×W×C tensor", input);
    }
    return Run(input, 1);
  }
  bool has_batched_kernel() const override { return true; }
  absl::StatusOr<Tensor> ApplyBatch(Tensor batch) const override {
    if (batch.rank() != 4 || record::DTypeSize(batch.dtype()) == 0) {
      return label_.InputError("a numeric N×H×W×C batch", batch);
    }
    return Run(batch, batch.dim(0));
  }

 private:
  absl::StatusOr<Tensor> Run(const Tensor& in, int64_t n) const {
    const int r = in.rank();
    const int64_t h = in.dim(r - 3), w = in.dim(r - 2), c = in.dim(r - 1);
    std::vector<int64_t> shape(in.shape().begin(), in.shape().end() - 3);
    shape.insert(shape.end(), {c, h, w});
    Tensor out = Tensor::Allocate(in.dtype(), std::move(shape));
    const size_t each = record::DTypeSize(in.dtype()) * h * w * c;
    if (each == 0) return out;
    return CatchCv(label_, [&]() -> absl::StatusOr<Tensor> {
      for (int64_t i = 0; i < n; ++i) {
        HwcToChw(in.data() + i * each, out.data() + i * each, h, w, c, in.dtype());
      }
      return std::move(out);
    });
  }
  OpLabel label_;
};

template <typename D, typename S>
D ConvertValue(S v) {
  if constexpr (std::is_same_v<S, cv::float16_t>) {
    return ConvertValue<D>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, cv::float16_t>) {
    return cv::float16_t(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, S>) {
    return v;
  } else {
    return cv::saturate_cast<D>(v);
  }
}

template <typename D, typename S>
void ConvertLoop(const S* src, D* dst, int64_t n, bool scale) {
  if constexpr (std::is_same_v<S, uint8_t> &&
                (std::is_same_v<D, float> || std::is_same_v<D, cv::float16_t>)) {
    if (scale) {
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = ConvertValue<D>(static_cast<float>(src[i]) / 255.0f);
      }
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = ConvertValue<D>(src[i]);
}

template <typename F>
void DispatchType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kUint8:
      return f(uint8_t{});
    case DType::kInt32:
      return f(int32_t{});
    case DType::kInt64:
      return f(int64_t{});
    case DType::kFloat16:
      return f(cv::float16_t{});
    case DType::kFloat32:
      return f(float{});
    default:
      return;
  }
}

class CastOpImpl final : public Op {
 public:
  CastOpImpl(OpLabel label, CastSpec spec) : label_(std::move(label)), spec_(spec) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    return Run(std::move(input));
  }
  bool has_batched_kernel() const override { return true; }
  absl::StatusOr<Tensor> ApplyBatch(Tensor batch) const override { return Run(std::move(batch)); }

 private:
  absl::StatusOr<Tensor> Run(Tensor in) const {
    if (record::DTypeSize(in.dtype()) == 0) {
      return label_.InputError("a numeric tensor (decode bytes first)", in);
    }
    if (in.dtype() == spec_.dtype) return in;
    Tensor out = Tensor::Allocate(spec_.dtype, in.shape());
    const int64_t n = in.num_elements();
    DispatchType(in.dtype(), [&](auto s) {
      using S = decltype(s);
      DispatchType(spec_.dtype, [&](auto d) {
        using D = decltype(d);
        ConvertLoop<D, S>(in.data_as<S>(), out.data_as<D>(), n, spec_.scale);
      });
    });
    return out;
  }
  OpLabel label_;
  CastSpec spec_;
};

class NormalizeHwc2ChwOpImpl final : public Op {
 public:
  NormalizeHwc2ChwOpImpl(OpLabel normalize, NormalizeSpec spec, DType out_dtype, std::string name)
      : label_(std::move(normalize)),
        spec_(std::move(spec)),
        norm_(spec_.mean, spec_.std),
        out_dtype_(out_dtype),
        name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    return Run(input, 3);
  }
  bool has_batched_kernel() const override { return true; }
  absl::StatusOr<Tensor> ApplyBatch(Tensor batch) const override { return Run(batch, 4); }
  bool writes_into() const override { return true; }
  absl::StatusOr<TensorType> OutputType(const Tensor& in) const override {
    RETURN_IF_ERROR(CheckInput(in, 3));
    return TensorType{out_dtype_, {in.dim(2), in.dim(0), in.dim(1)}};
  }
  bool MirrorsInto(const Tensor& in) const override {
    return in.dtype() == DType::kUint8 && in.rank() == 3 && in.dim(2) == 3 &&
           out_dtype_ == DType::kFloat32 && norm_.Accepts(3);
  }
  // One element of ApplyBatch: the same kernel on the same pixels, so the same
  // bits (mirrored: the AVX2 kernel reads each row right to left; the
  // arithmetic per pixel is unchanged).
  void ApplyInto(const Tensor& in, bool mirror, uint8_t* dst) const override {
    const int64_t h = in.dim(0), w = in.dim(1), c = in.dim(2);
    if (mirror) {
      const float scale[3] = {norm_.scale8(0), norm_.scale8(1), norm_.scale8(2)};
      const float bias[3] = {norm_.bias(0), norm_.bias(1), norm_.bias(2)};
      kernels::NormalizeHwc3ToChw(in.data(), h, w, /*src_stride=*/w * 3, /*flip=*/true, scale, bias,
                                  reinterpret_cast<float*>(dst));
    } else if (out_dtype_ == DType::kFloat16) {
      Fill(in, reinterpret_cast<cv::float16_t*>(dst), 1, h * w, static_cast<int>(c));
    } else {
      Fill(in, reinterpret_cast<float*>(dst), 1, h * w, static_cast<int>(c));
    }
  }

 private:
  absl::Status CheckInput(const Tensor& in, int rank) const {
    if ((in.dtype() != DType::kUint8 && in.dtype() != DType::kFloat32) || in.rank() != rank ||
        !norm_.Accepts(in.dim(rank - 1))) {
      return label_.InputError(rank == 3 ? "uint8 or float32 H×W×C with C matching mean/std"
                                         : "uint8 or float32 N×H×W×C with C matching mean/std",
                               in);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Run(const Tensor& in, int rank) const {
    RETURN_IF_ERROR(CheckInput(in, rank));
    const int64_t n = rank == 4 ? in.dim(0) : 1;
    const int64_t h = in.dim(rank - 3), w = in.dim(rank - 2), c = in.dim(rank - 1);
    std::vector<int64_t> shape;
    if (rank == 4) shape.push_back(n);
    shape.insert(shape.end(), {c, h, w});
    Tensor out = Tensor::Allocate(out_dtype_, std::move(shape));
    if (out_dtype_ == DType::kFloat16) {
      Fill(in, out.data_as<cv::float16_t>(), n, h * w, static_cast<int>(c));
    } else {
      Fill(in, out.data_as<float>(), n, h * w, static_cast<int>(c));
    }
    return out;
  }

  template <typename Out>
  void Fill(const Tensor& in, Out* out, int64_t n, int64_t plane, int channels) const {
    if constexpr (std::is_same_v<Out, float>) {
      // float32 output: the shared kernel (the client's finishing runs it too).
      for (int64_t i = 0; i < n; ++i) {
        float* dst = out + i * plane * channels;
        if (in.dtype() == DType::kUint8) {
          kernels::NormalizeImage(norm_, in.data() + i * plane * channels, plane, channels,
                                  /*chw=*/true, dst);
        } else {
          kernels::NormalizeImage(norm_, in.data_as<float>() + i * plane * channels, plane,
                                  channels, /*chw=*/true, dst);
        }
      }
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      Out* dst = out + i * plane * channels;
      if (in.dtype() == DType::kUint8) {
        const uint8_t* src = in.data() + i * plane * channels;
        if (channels == 3) {
          const float *l0 = norm_.lut(0), *l1 = norm_.lut(1), *l2 = norm_.lut(2);
          Out *d0 = dst, *d1 = dst + plane, *d2 = dst + 2 * plane;
          for (int64_t p = 0; p < plane; ++p, src += 3) {
            d0[p] = FromFloat<Out>(l0[src[0]]);
            d1[p] = FromFloat<Out>(l1[src[1]]);
            d2[p] = FromFloat<Out>(l2[src[2]]);
          }
          continue;
        }
        for (int c = 0; c < channels; ++c) {
          const float* l = norm_.lut(c);
          Out* d = dst + c * plane;
          for (int64_t p = 0; p < plane; ++p) d[p] = FromFloat<Out>(l[src[p * channels + c]]);
        }
      } else {
        const float* src = in.data_as<float>() + i * plane * channels;
        for (int c = 0; c < channels; ++c) {
          const float s = norm_.scale(c), b = norm_.bias(c);
          Out* d = dst + c * plane;
          for (int64_t p = 0; p < plane; ++p) {
            d[p] = FromFloat<Out>(src[p * channels + c] * s + b);
          }
        }
      }
    }
  }

  OpLabel label_;
  NormalizeSpec spec_;
  Normalizer norm_;
  DType out_dtype_;
  std::string name_;
};

}  // namespace

absl::StatusOr<NormalizeSpec> ParseNormalize(const proto::NormalizeOp& spec, const OpLabel& label) {
  NormalizeSpec out;
  out.mean.assign(spec.mean().begin(), spec.mean().end());
  out.std.assign(spec.std().begin(), spec.std().end());
  out.channels_first = spec.channels_first();
  if (out.mean.empty()) return label.FieldError("mean", "must not be empty");
  if (out.std.empty()) return label.FieldError("std", "must not be empty");
  if (out.mean.size() != out.std.size() && out.mean.size() != 1 && out.std.size() != 1) {
    return label.FieldError(
        "mean", absl::StrCat("has ", out.mean.size(), " values but std has ", out.std.size()));
  }
  for (float s : out.std) {
    if (!(s != 0) || !std::isfinite(s)) {
      return label.FieldError("std", absl::StrCat("must be non-zero, got ", s));
    }
  }
  for (float m : out.mean) {
    if (!std::isfinite(m)) return label.FieldError("mean", "must be finite");
  }
  return out;
}

absl::StatusOr<CastSpec> ParseCast(const proto::CastOp& spec, const OpLabel& label) {
  CastSpec out;
  absl::StatusOr<DType> dtype = record::ParseDType(spec.dtype());
  if (!dtype.ok() || record::DTypeSize(*dtype) == 0) {
    return label.FieldError(
        "dtype", absl::StrCat("must be one of uint8, int32, int64, float16, float32, got \"",
                              spec.dtype(), "\""));
  }
  out.dtype = *dtype;
  out.scale = spec.scale();
  return out;
}

absl::StatusOr<std::unique_ptr<Op>> MakeNormalize(const proto::NormalizeOp& spec, OpLabel label) {
  ASSIGN_OR_RETURN(NormalizeSpec parsed, ParseNormalize(spec, label));
  return std::make_unique<NormalizeOpImpl>(std::move(label), std::move(parsed));
}

absl::StatusOr<std::unique_ptr<Op>> MakeHwc2Chw(const proto::HWC2CHWOp&, OpLabel label) {
  return std::make_unique<Hwc2ChwOpImpl>(std::move(label));
}

absl::StatusOr<std::unique_ptr<Op>> MakeCast(const proto::CastOp& spec, OpLabel label) {
  ASSIGN_OR_RETURN(CastSpec parsed, ParseCast(spec, label));
  return std::make_unique<CastOpImpl>(std::move(label), parsed);
}

std::unique_ptr<Op> MakeNormalizeHwc2Chw(OpLabel normalize, OpLabel, NormalizeSpec spec,
                                         DType out_dtype, std::string name) {
  return std::make_unique<NormalizeHwc2ChwOpImpl>(std::move(normalize), std::move(spec), out_dtype,
                                                  std::move(name));
}

}  // namespace sluice::data_worker
