#include "data_worker/ops/decode.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <utility>
#include <vector>

// jpeglib.h needs size_t/FILE declared first.
#include <jerror.h>
#include <jpeglib.h>
#include <webp/decode.h>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/image/imgcodecs.h"
#include "opencv2/core.hpp"
#include "opencv2/imgcodecs.hpp"  // constants only: the codecs load through common/image
#include "opencv2/imgproc.hpp"

namespace sluice::data_worker {
namespace {

absl::Status DecodeError(std::string_view reason) {
  return absl::DataLossError(absl::StrCat("cannot decode image: ", Sv(reason)));
}

// libjpeg reports errors through error_exit, which must not return: we longjmp
// back to the Guard() that started the libjpeg call. No C++ object with a
// destructor lives in the frames that longjmp skips (Guard's callers keep all
// such state outside the guarded lambdas).
struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void OnJpegError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (level -1) about recoverable corruption are ignored like OpenCV
// does, except a premature end of file: libjpeg would pad the image with gray,
// a silently wrong result.
void OnJpegMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) OnJpegError(cinfo);
}

struct JpegDecoder {
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  bool created = false;

  JpegDecoder() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = OnJpegError;
    err.pub.emit_message = OnJpegMessage;
    err.message[0] = '\0';
  }
  ~JpegDecoder() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// Runs `fn` (libjpeg calls only); false if libjpeg raised an error (message in
// dec.err.message).
template <typename F>
bool Guard(JpegDecoder& dec, F&& fn) {
  if (setjmp(dec.err.jump)) return false;
  fn();
  return true;
}

bool IsJpeg(std::string_view data) {
  return data.size() >= 3 && static_cast<uint8_t>(data[0]) == 0xFF &&
         static_cast<uint8_t>(data[1]) == 0xD8 && static_cast<uint8_t>(data[2]) == 0xFF;
}

// Dimensions are at most 2^32 - 1 (PNG) or 2^16 - 1 (JPEG).
absl::Status CheckImageSize(uint32_t height, uint32_t width) {
  if (uint64_t{height} * width <= kMaxImagePixels) return absl::OkStatus();
  return DecodeError(absl::StrCat("the header declares ", height, "x", width,
                                  " pixels, more than the decoder's limit of ", kMaxImagePixels));
}

uint32_t BigEndian32(const char* p) {
  const auto* u = reinterpret_cast<const uint8_t*>(p);
  return uint32_t{u[0]} << 24 | uint32_t{u[1]} << 16 | uint32_t{u[2]} << 8 | uint32_t{u[3]};
}

constexpr std::string_view kPngSignature("\x89PNG\r\n\x1a\n", 8);

bool IsPng(std::string_view data) { return data.substr(0, kPngSignature.size()) == kPngSignature; }

// Walks a PNG's chunks up to IEND: each one (length, type, data, CRC) must lie
// inside `data`, and IHDR's size within kMaxImagePixels. libpng trusts a
// chunk's declared length and allocates it before reading.
absl::Status CheckPngChunks(std::string_view data) {
  size_t at = kPngSignature.size();
  bool first = true;
  while (true) {
    if (data.size() - at < 12) {
      return DecodeError(absl::StrCat("PNG ends at byte ", data.size(), " before its IEND chunk"));
    }
    const uint32_t length = BigEndian32(data.data() + at);
    const std::string_view type = data.substr(at + 4, 4);
    if (length > data.size() - at - 12) {
      return DecodeError(
          absl::StrCat("PNG chunk '", absl::CHexEscape(Sv(type)), "' at byte ", at, " declares ",
                       length, " data bytes, past the end of the data (", data.size(), " bytes)"));
    }
    if (first) {
      if (type != "IHDR" || length != 13) {
        return DecodeError("PNG does not start with a 13-byte IHDR chunk");
      }
      RETURN_IF_ERROR(
          CheckImageSize(BigEndian32(data.data() + at + 12), BigEndian32(data.data() + at + 8)));
      first = false;
    }
    if (type == "IEND") return absl::OkStatus();
    at += size_t{length} + 12;
  }
}

// PNG and BMP go to cv::imdecode, which picks a decoder by probing every
// codec's signature in turn: BMP's and PNG's are probed before any other
// codec could claim the data. OpenCV also reads DICOM, JPEG 2000, TIFF,
// OpenEXR, PNM, ..., whose libraries assert or allocate what a corrupt header
// says, so nothing else reaches imdecode (training datasets hold JPEG, PNG,
// BMP and WebP). WebP is decoded by libwebp directly: OpenCV probes WebP with
// libwebp's header check, and a corrupt WebP that fails it fell through to the
// DICOM codec (the decode fuzzer aborted in gdcm on one).
bool IsBmp(std::string_view data) { return data.substr(0, 2) == "BM"; }
bool IsWebp(std::string_view data) {
  return data.size() >= 12 && data.substr(0, 4) == "RIFF" && data.substr(8, 4) == "WEBP";
}

// A BMP's size from its info header (width and height are little-endian int32
// at bytes 18 and 22; a negative height means top-down rows).
absl::Status CheckBmpSize(std::string_view data) {
  if (data.size() < 26) return DecodeError("BMP header is truncated");
  auto le32 = [&](size_t at) {
    const auto* u = reinterpret_cast<const uint8_t*>(data.data() + at);
    return static_cast<int32_t>(uint32_t{u[0]} | uint32_t{u[1]} << 8 | uint32_t{u[2]} << 16 |
                                uint32_t{u[3]} << 24);
  };
  const int64_t width = le32(18);
  const int64_t height = le32(22);
  return CheckImageSize(
      static_cast<uint32_t>(std::min<int64_t>(height < 0 ? -height : height, UINT32_MAX)),
      static_cast<uint32_t>(std::min<int64_t>(width < 0 ? -width : width, UINT32_MAX)));
}

// WebP through libwebp, straight into the RGB tensor. Its dimensions are at
// most 16383 x 16383 < kMaxImagePixels.
absl::StatusOr<Tensor> DecodeWebp(std::string_view encoded) {
  const auto* data = reinterpret_cast<const uint8_t*>(encoded.data());
  int width = 0;
  int height = 0;
  if (!WebPGetInfo(data, encoded.size(), &width, &height)) {
    return DecodeError("corrupt WebP header");
  }
  RETURN_IF_ERROR(CheckImageSize(height, width));
  Tensor out = Tensor::Allocate(DType::kUint8, {height, width, 3});
  const size_t size = size_t{3} * width * height;
  if (WebPDecodeRGBInto(data, encoded.size(), out.data(), size, 3 * width) == nullptr) {
    return DecodeError("corrupt WebP data");
  }
  return out;
}

// Full decode of PNG, BMP and WebP: 8-bit RGB.
absl::StatusOr<Tensor> DecodeFull(std::string_view encoded) {
  if (IsWebp(encoded)) return DecodeWebp(encoded);
  if (IsPng(encoded)) {
    RETURN_IF_ERROR(CheckPngChunks(encoded));
  } else if (IsBmp(encoded)) {
    RETURN_IF_ERROR(CheckBmpSize(encoded));
  } else {
    return DecodeError(absl::StrCat("unsupported image format (first bytes '",
                                    absl::CHexEscape(Sv(encoded.substr(0, 4))),
                                    "'); sluice decodes JPEG, PNG, BMP and WebP"));
  }
  absl::StatusOr<cv::Mat> decoded =
      image::Imdecode(encoded, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  if (!decoded.ok()) {
    if (absl::IsDataLoss(decoded.status())) {
      return DecodeError(std::string(decoded.status().message()));
    }
    return decoded.status();  // FailedPrecondition: the library is missing
  }
  const cv::Mat& bgr = *decoded;
  if (bgr.empty() || bgr.type() != CV_8UC3) {
    return DecodeError("corrupt data");
  }
  Tensor out = Tensor::Allocate(DType::kUint8, {bgr.rows, bgr.cols, 3});
  cv::Mat rgb = out.AsMat();
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return out;
}

// Adobe (inverted) CMYK → RGB, the formula OpenCV's JPEG reader uses.
void CmykToRgb(const uint8_t* cmyk, uint8_t* rgb, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int k = cmyk[3];
    rgb[0] = static_cast<uint8_t>(k - (((255 - cmyk[0]) * k) >> 8));
    rgb[1] = static_cast<uint8_t>(k - (((255 - cmyk[1]) * k) >> 8));
    rgb[2] = static_cast<uint8_t>(k - (((255 - cmyk[2]) * k) >> 8));
  }
}

// The cost model of DctScaleRule::kCostModel, in CPU nanoseconds per source
// pixel of the box: decoding at scale n/8 costs kDctDecodeCost*[n - 1] (the
// time to decode a whole image at n/8 over its full-size pixel count; entropy
// decoding is the same at every scale, so only the differences matter) plus
// kResizeCost per decoded pixel, (n/8)² per source pixel, for the resize that
// follows. Measured by bench/kernels/dct_scale_cost_bench on photo-like
// 800-1,200 px JPEGs (bench/make_photos.py), 2026-11-25, docs/BENCHMARKS.md
// ("The strict ceiling"); with chroma subsampled (4:2:0) and at full
// resolution (4:4:4). The odd-size IDCTs cost more than the next power of two
// up, and 5/8-7/8 about as much as or more than a full-size decode.
constexpr double kDctDecodeCostSubsampled[8] = {2.44, 3.08, 3.68, 3.46, 5.03, 5.69, 7.12, 4.61};
constexpr double kDctDecodeCostFull[8] = {3.13, 3.91, 4.29, 4.66, 5.94, 6.55, 8.75, 5.54};
constexpr double kResizeCost = 0.92;

// [lo, hi) = box edges scaled by n/8, rounded, clamped into [0, limit),
// non-empty.
void ScaleSpan(int start, int length, int n, int limit, int* lo, int* hi) {
  *lo = std::clamp(static_cast<int>((int64_t{start} * n * 2 + 8) / 16), 0, limit - 1);
  *hi = std::clamp(static_cast<int>((int64_t{start + length} * n * 2 + 8) / 16), *lo + 1, limit);
}

absl::StatusOr<Tensor> DecodeJpegRegion(std::string_view encoded, const PlanFn& plan) {
  JpegDecoder dec;
  if (!Guard(dec, [&] {
        jpeg_create_decompress(&dec.cinfo);
        dec.created = true;
        jpeg_mem_src(&dec.cinfo, reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size());
        jpeg_read_header(&dec.cinfo, TRUE);
      })) {
    return DecodeError(dec.err.message);
  }
  jpeg_decompress_struct& cinfo = dec.cinfo;
  const int full_h = static_cast<int>(cinfo.image_height);
  const int full_w = static_cast<int>(cinfo.image_width);
  RETURN_IF_ERROR(CheckImageSize(cinfo.image_height, cinfo.image_width));
  ASSIGN_OR_RETURN(const DecodePlan p, plan(full_h, full_w));

  const int n = p.allow_dct_scaling
                    ? ChooseDctScale(p.dct_rule, p.box.height, p.box.width, p.out_height,
                                     p.out_width, cinfo.max_h_samp_factor, cinfo.max_v_samp_factor)
                    : 8;
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  if (!Guard(dec, [&] {
        cinfo.scale_num = n;
        cinfo.scale_denom = 8;
        cinfo.dct_method = p.idct == proto::DecodeOp::IDCT_FAST    ? JDCT_IFAST
                           : p.idct == proto::DecodeOp::IDCT_FLOAT ? JDCT_FLOAT
                                                                   : JDCT_ISLOW;
        cinfo.do_fancy_upsampling = p.fast_upsampling ? FALSE : TRUE;
        cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
        jpeg_start_decompress(&cinfo);
      })) {
    return DecodeError(dec.err.message);
  }
  const int comps = cinfo.output_components;
  if (comps != (cmyk ? 4 : 3)) {
    return DecodeError(absl::StrCat("unsupported JPEG with ", comps, " components"));
  }
  int sx0, sx1, sy0, sy1;
  ScaleSpan(p.box.left, p.box.width, n, static_cast<int>(cinfo.output_width), &sx0, &sx1);
  ScaleSpan(p.box.top, p.box.height, n, static_cast<int>(cinfo.output_height), &sy0, &sy1);
  // Fancy upsampling treats the edges of a cropped scanline like image edges,
  // so widen the crop by one iMCU column on each side (jpeg_crop_scanline also
  // aligns it to iMCU boundaries).
  const int imcu_cols = cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size;
  const int want_x0 = std::max(0, sx0 - imcu_cols);
  const int want_x1 = std::min(static_cast<int>(cinfo.output_width), sx1 + imcu_cols);
  JDIMENSION xoff = want_x0, crop_w = want_x1 - want_x0;
  const int rows = sy1 - sy0;
  // The crop may widen to iMCU boundaries, so the buffer is sized after
  // jpeg_crop_scanline.
  if (!Guard(dec, [&] {
        if (crop_w < cinfo.output_width) {
          jpeg_crop_scanline(&cinfo, &xoff, &crop_w);
        } else {
          xoff = 0;
        }
      })) {
    return DecodeError(dec.err.message);
  }
  const int buf_w = static_cast<int>(cinfo.output_width);
  Tensor rgb_buf = Tensor::Allocate(DType::kUint8, {rows, buf_w, 3});
  std::vector<uint8_t> cmyk_buf;
  uint8_t* base = rgb_buf.data();
  if (cmyk) {
    cmyk_buf.resize(size_t{4} * rows * buf_w);
    base = cmyk_buf.data();
  }
  std::vector<JSAMPROW> row_ptrs(rows);
  for (int r = 0; r < rows; ++r) {
    row_ptrs[r] = base + static_cast<size_t>(comps) * buf_w * r;
  }
  if (!Guard(dec, [&] {
        // Skipping whole iMCU rows loses the context rows fancy upsampling
        // reads, so skip only to one iMCU row above the region and decode (and
        // drop) the rows in between.
        const int imcu_rows = cinfo.max_v_samp_factor * cinfo.min_DCT_scaled_size;
        int skip = std::max(0, (sy0 / imcu_rows - 1) * imcu_rows);
        if (skip > 0) skip = static_cast<int>(jpeg_skip_scanlines(&cinfo, skip));
        for (int r = skip; r < sy0; ++r) {
          JSAMPROW scratch = row_ptrs[0];
          jpeg_read_scanlines(&cinfo, &scratch, 1);
        }
        JDIMENSION done = 0;
        while (done < static_cast<JDIMENSION>(rows)) {
          const JDIMENSION got = jpeg_read_scanlines(&cinfo, row_ptrs.data() + done, rows - done);
          if (got == 0) ERREXIT(&cinfo, JERR_INPUT_EOF);
          done += got;
        }
      })) {
    return DecodeError(dec.err.message);
  }
  if (cmyk) CmykToRgb(cmyk_buf.data(), rgb_buf.data(), static_cast<size_t>(rows) * buf_w);

  const CropBox region{0, sx0 - static_cast<int>(xoff), rows, sx1 - sx0};
  if (region.left == 0 && region.width == buf_w && rows == p.out_height &&
      region.width == p.out_width) {
    return rgb_buf;  // already exactly the output: no copy
  }
  int interp = p.interpolation;
  if (p.allow_dct_scaling && interp == cv::INTER_LINEAR &&
      (region.width >= 2 * p.out_width || region.height >= 2 * p.out_height)) {
    interp = cv::INTER_AREA;  // only reached at scale 1/8
  }
  try {
    return CropAndResize(rgb_buf, region, p.out_height, p.out_width, interp);
  } catch (const cv::Exception& e) {
    return absl::InternalError(absl::StrCat("resize after decode: ", e.what()));
  }
}

absl::StatusOr<Tensor> DecodeImageRegionImpl(std::string_view encoded, const PlanFn& plan) {
  if (encoded.empty()) return DecodeError("empty input");
  if (IsJpeg(encoded)) return DecodeJpegRegion(encoded, plan);
  ASSIGN_OR_RETURN(Tensor full, DecodeFull(encoded));
  ASSIGN_OR_RETURN(const DecodePlan p,
                   plan(static_cast<int>(full.dim(0)), static_cast<int>(full.dim(1))));
  if (p.box.top == 0 && p.box.left == 0 && p.box.height == full.dim(0) &&
      p.box.width == full.dim(1) && p.out_height == p.box.height && p.out_width == p.box.width) {
    return full;
  }
  try {
    return CropAndResize(full, p.box, p.out_height, p.out_width, p.interpolation);
  } catch (const cv::Exception& e) {
    return absl::InternalError(absl::StrCat("resize after decode: ", e.what()));
  }
}

absl::Status CheckEncoded(const OpLabel& label, const Tensor& input) {
  if (input.dtype() == DType::kBytes || input.dtype() == DType::kString ||
      (input.dtype() == DType::kUint8 && input.rank() == 1)) {
    return absl::OkStatus();
  }
  return label.InputError("encoded image bytes (bytes, string or uint8[n])", input);
}

// `plan` with the JPEG settings of `spec`.
DecodePlan WithSettings(DecodePlan plan, const proto::DecodeOp& spec) {
  plan.idct = spec.idct();
  plan.fast_upsampling = spec.fast_upsampling();
  plan.dct_rule = DctScaleRuleOf(spec.dct_scale());
  return plan;
}

class DecodeOpImpl final : public Op {
 public:
  DecodeOpImpl(OpLabel label, proto::DecodeOp spec)
      : label_(std::move(label)), spec_(std::move(spec)) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    RETURN_IF_ERROR(CheckEncoded(label_, input));
    return DecodeImageRegion(input.bytes(), [&](int h, int w) -> absl::StatusOr<DecodePlan> {
      DecodePlan p;
      p.box = CropBox{0, 0, h, w};
      p.out_height = h;
      p.out_width = w;
      return WithSettings(p, spec_);
    });
  }

 private:
  OpLabel label_;
  proto::DecodeOp spec_;
};

// Decode followed by an op that becomes a DecodePlan; name "Decode+<second>".
class FusedDecodeOp final : public Op {
 public:
  using MakePlan =
      std::function<absl::StatusOr<DecodePlan>(int height, int width, const ElementContext& ctx)>;
  FusedDecodeOp(OpLabel decode, proto::DecodeOp decode_spec, OpLabel second, MakePlan make_plan)
      : decode_(std::move(decode)),
        decode_spec_(std::move(decode_spec)),
        second_(std::move(second)),
        name_(absl::StrCat(decode_.name, "+", second_.name)),
        make_plan_(std::move(make_plan)) {}
  std::string_view name() const override { return name_; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext& ctx) const override {
    RETURN_IF_ERROR(CheckEncoded(decode_, input));
    return DecodeImageRegion(input.bytes(), [&](int h, int w) -> absl::StatusOr<DecodePlan> {
      ASSIGN_OR_RETURN(DecodePlan p, make_plan_(h, w, ctx));
      return WithSettings(p, decode_spec_);
    });
  }

 private:
  OpLabel decode_;
  proto::DecodeOp decode_spec_;
  OpLabel second_;
  std::string name_;
  MakePlan make_plan_;
};

bool DctScalingAllowed(int interpolation) {
  return interpolation == cv::INTER_LINEAR || interpolation == cv::INTER_AREA;
}

}  // namespace

int ChooseDctScale(DctScaleRule rule, int box_height, int box_width, int out_height, int out_width,
                   int max_h_samp, int max_v_samp) {
  // The fidelity bound: the decoded box covers the output on both axes.
  auto keeps = [&](int n) {
    return int64_t{box_width} * n >= int64_t{out_width} * 8 &&
           int64_t{box_height} * n >= int64_t{out_height} * 8;
  };
  switch (rule) {
    case DctScaleRule::kPowerOfTwo:
      for (int n = 1; n < 8; n *= 2) {
        if (keeps(n)) return n;
      }
      return 8;
    case DctScaleRule::kSmallestEighth:
      for (int n = 1; n < 8; ++n) {
        if (keeps(n)) return n;
      }
      return 8;
    case DctScaleRule::kCostModel:
      break;
  }
  const double* decode =
      max_h_samp > 1 || max_v_samp > 1 ? kDctDecodeCostSubsampled : kDctDecodeCostFull;
  auto cost = [&](int n) { return decode[n - 1] + kResizeCost * n * n / 64; };
  int best = 8;
  for (int n = 7; n >= 1; --n) {
    if (keeps(n) && cost(n) < cost(best)) best = n;
  }
  return best;
}

DctScaleRule DctScaleRuleOf(proto::DecodeOp::DctScale setting) {
  switch (setting) {
    case proto::DecodeOp::DCT_SCALE_POWER_OF_TWO:
      return DctScaleRule::kPowerOfTwo;
    case proto::DecodeOp::DCT_SCALE_EIGHTH:
      return DctScaleRule::kSmallestEighth;
    default:
      return DctScaleRule::kCostModel;
  }
}

absl::StatusOr<Tensor> DecodeImage(std::string_view encoded) {
  return DecodeImageRegion(encoded, [](int h, int w) -> absl::StatusOr<DecodePlan> {
    DecodePlan p;
    p.box = CropBox{0, 0, h, w};
    p.out_height = h;
    p.out_width = w;
    return p;
  });
}

absl::StatusOr<Tensor> DecodeImageRegion(std::string_view encoded, const PlanFn& plan) {
  return DecodeImageRegionImpl(encoded, plan);
}

absl::StatusOr<std::unique_ptr<Op>> MakeDecode(const proto::DecodeOp& spec, OpLabel label) {
  return std::make_unique<DecodeOpImpl>(std::move(label), spec);
}

std::unique_ptr<Op> MakeDecodeResize(OpLabel decode, const proto::DecodeOp& decode_spec,
                                     OpLabel resize, ResizeSpec spec) {
  return std::make_unique<FusedDecodeOp>(
      std::move(decode), decode_spec, resize,
      [spec, resize](int h, int w, const ElementContext&) -> absl::StatusOr<DecodePlan> {
        DecodePlan p;
        p.box = CropBox{0, 0, h, w};
        ResizeOutputSize(spec, h, w, &p.out_height, &p.out_width);
        RETURN_IF_ERROR(CheckOutputSize(resize, p.out_height, p.out_width));
        p.interpolation = spec.interpolation;
        p.allow_dct_scaling = DctScalingAllowed(spec.interpolation);
        return p;
      });
}

std::unique_ptr<Op> MakeDecodeCenterCrop(OpLabel decode, const proto::DecodeOp& decode_spec,
                                         OpLabel crop, CenterCropSpec spec) {
  return std::make_unique<FusedDecodeOp>(
      std::move(decode), decode_spec, crop,
      [spec, crop](int h, int w, const ElementContext&) -> absl::StatusOr<DecodePlan> {
        DecodePlan p;
        ASSIGN_OR_RETURN(p.box, CenterCropBox(spec, h, w, crop));
        p.out_height = p.box.height;
        p.out_width = p.box.width;
        return p;
      });
}

std::unique_ptr<Op> MakeDecodeRandomResizedCrop(OpLabel decode, const proto::DecodeOp& decode_spec,
                                                OpLabel crop, RandomResizedCropSpec spec) {
  const int position = crop.position;
  return std::make_unique<FusedDecodeOp>(
      std::move(decode), decode_spec, std::move(crop),
      [spec, position](int h, int w, const ElementContext& ctx) -> absl::StatusOr<DecodePlan> {
        Rng rng = ctx.RngFor(position);
        DecodePlan p;
        p.box = RandomResizedCropBox(spec, h, w, rng);
        p.out_height = spec.height;
        p.out_width = spec.width;
        p.interpolation = spec.interpolation;
        p.allow_dct_scaling = DctScalingAllowed(spec.interpolation);
        return p;
      });
}

}  // namespace sluice::data_worker
