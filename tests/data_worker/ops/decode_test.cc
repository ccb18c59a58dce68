#include "data_worker/ops/decode.h"

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data_worker/ops/geometry.h"
#include "data_worker/ops/op.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data_worker/ops/test_images.h"
#include "tests/data_worker/ops/torchvision_reference.h"

namespace sluice::data_worker {
namespace {

using ::sluice::data_worker::testing::Bytes;
using ::sluice::data_worker::testing::Compare;
using ::sluice::data_worker::testing::Diff;
using ::sluice::data_worker::testing::EncodeCmykJpeg;
using ::sluice::data_worker::testing::EncodeJpegRgb;
using ::sluice::data_worker::testing::MakeRgb;
using ::sluice::data_worker::testing::ReferenceDecode;
using ::testing::HasSubstr;

struct Variant {
  std::string name;
  std::string bytes;
};

std::vector<Variant> JpegVariants() {
  const cv::Mat rgb = MakeRgb(375, 500);
  std::vector<Variant> v;
  v.push_back({"420", testing::EncodeJpegSampling(rgb, 2, 2)});
  v.push_back({"422", testing::EncodeJpegSampling(rgb, 2, 1)});
  v.push_back({"444", testing::EncodeJpegSampling(rgb, 1, 1)});
  v.push_back({"440", testing::EncodeJpegSampling(rgb, 1, 2)});
  v.push_back(
      {"420_progressive_odd", testing::EncodeJpegSampling(MakeRgb(251, 333, 9), 2, 2, true)});
  v.push_back({"progressive", EncodeJpegRgb(rgb, {cv::IMWRITE_JPEG_PROGRESSIVE, 1})});
  v.push_back({"restart", EncodeJpegRgb(rgb, {cv::IMWRITE_JPEG_RST_INTERVAL, 3})});
  v.push_back({"exif", testing::WithExif(EncodeJpegRgb(rgb))});
  cv::Mat gray;
  cv::cvtColor(rgb, gray, cv::COLOR_RGB2GRAY);
  v.push_back({"gray", testing::Encode(gray, ".jpg")});
  v.push_back(
      {"gray_progressive", testing::Encode(gray, ".jpg", {cv::IMWRITE_JPEG_PROGRESSIVE, 1})});
  v.push_back({"cmyk", EncodeCmykJpeg(251, 333)});
  v.push_back({"odd_size", EncodeJpegRgb(MakeRgb(251, 333, 3))});
  v.push_back({"tiny_1x1", EncodeJpegRgb(MakeRgb(1, 1, 4))});
  v.push_back({"tiny_7x5", EncodeJpegRgb(MakeRgb(5, 7, 5))});
  v.push_back(
      {"tiny_7x5_progressive", EncodeJpegRgb(MakeRgb(5, 7, 5), {cv::IMWRITE_JPEG_PROGRESSIVE, 1})});
  return v;
}

proto::OpSpec DecodeSpec() {
  proto::OpSpec s;
  s.mutable_decode();
  return s;
}

std::unique_ptr<Op> Build(const std::vector<proto::OpSpec>& specs, bool fuse) {
  auto ops = BuildOps(specs, /*first_position=*/0, fuse);
  EXPECT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->size(), 1u);
  return std::move((*ops)[0]);
}

cv::Mat MatOf(const Tensor& t) { return t.AsMat(); }

TEST(Decode, JpegVariantsMatchOpenCvDecode) {
  auto op = Build({DecodeSpec()}, /*fuse=*/false);
  for (const Variant& v : JpegVariants()) {
    SCOPED_TRACE(v.name);
    absl::StatusOr<Tensor> out = op->Apply(Bytes(v.bytes), ElementContext{});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->dtype(), DType::kUint8);
    ASSERT_EQ(out->rank(), 3);
    EXPECT_EQ(out->dim(2), 3);
    const cv::Mat ref = ReferenceDecode(v.bytes);
    ASSERT_EQ(out->dim(0), ref.rows);
    ASSERT_EQ(out->dim(1), ref.cols);
    const Diff d = Compare(MatOf(*out), ref);
    // Same libjpeg-turbo, same IDCT and upsampling: identical up to rounding in
    // colour conversion.
    EXPECT_LE(d.max, 1) << "mean " << d.mean;
  }
}

TEST(Decode, PngVariantsMatchOpenCvDecode) {
  auto op = Build({DecodeSpec()}, /*fuse=*/false);
  const cv::Mat rgb = MakeRgb(40, 30);
  cv::Mat bgr, bgra, gray, bgr16;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  cv::cvtColor(bgr, bgra, cv::COLOR_BGR2BGRA);
  bgra.forEach<cv::Vec4b>([](cv::Vec4b& px, const int*) { px[3] = 17; });
  cv::cvtColor(bgr, gray, cv::COLOR_BGR2GRAY);
  bgr.convertTo(bgr16, CV_16U, 257.0);
  for (const auto& [name, mat] : std::vector<std::pair<std::string, cv::Mat>>{
           {"rgb", bgr}, {"rgba", bgra}, {"gray", gray}, {"16bit", bgr16}}) {
    SCOPED_TRACE(name);
    const std::string png = testing::Encode(mat, ".png");
    absl::StatusOr<Tensor> out = op->Apply(Bytes(png), ElementContext{});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->rank(), 3);
    ASSERT_EQ(out->dim(2), 3);
    EXPECT_EQ(Compare(MatOf(*out), ReferenceDecode(png)).max, 0);
    if (name != "gray") {
      EXPECT_EQ(Compare(MatOf(*out), rgb).max, 0);
    }
  }
}

TEST(Decode, CorruptInputIsDataLossNotACrash) {
  auto op = Build({DecodeSpec()}, /*fuse=*/false);
  const cv::Mat rgb = MakeRgb(200, 300);
  const std::string jpeg = EncodeJpegRgb(rgb);
  const std::string progressive = EncodeJpegRgb(rgb, {cv::IMWRITE_JPEG_PROGRESSIVE, 1});
  std::string garbage(5000, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 7919 % 251);
  std::string bad_header = jpeg.substr(0, 2) + garbage;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated", jpeg.substr(0, jpeg.size() / 2)},
      {"truncated_progressive", progressive.substr(0, progressive.size() * 2 / 3)},
      {"header_only", jpeg.substr(0, 300)},
      {"soi_only", jpeg.substr(0, 3)},
      {"garbage", garbage},
      {"jpeg_signature_then_garbage", bad_header},
      {"empty", ""},
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    absl::StatusOr<Tensor> out = op->Apply(Bytes(bytes), ElementContext{});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
    EXPECT_THAT(out.status().message(), HasSubstr("cannot decode image"));
  }
  // The fused ops take the same path.
  proto::OpSpec resize;
  resize.mutable_resize()->set_size(50);
  auto fused = Build({DecodeSpec(), resize}, /*fuse=*/true);
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    EXPECT_EQ(fused->Apply(Bytes(bytes), ElementContext{}).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

// Headers that promise more than the data holds are refused before anything
// is allocated: libpng allocates a chunk's declared length (up to 2 GiB)
// before reading it, and a full decode allocates height × width × 3.
TEST(Decode, HeadersPromisingMoreThanTheDataHoldAreDataLoss) {
  const cv::Mat rgb = MakeRgb(40, 30);
  const std::string png = testing::Encode(rgb, ".png");
  ASSERT_EQ(png.substr(12, 4), "IHDR");  // signature(8) + length(4)
  auto put32 = [](std::string* s, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) (*s)[at + i] = static_cast<char>(v >> (24 - 8 * i));
  };
  // A tEXt chunk after IHDR (8 + 25 bytes) declaring 1,644,167,168 bytes.
  std::string huge_chunk = png;
  std::string text_chunk("\0\0\0\0tEXtab\0\0\0\0", 14);
  put32(&text_chunk, 0, 0x62000000);
  huge_chunk.insert(33, text_chunk);
  // IHDR says 20000 × 20000 (4 × 10^8 pixels > 2^28).
  std::string huge_png = png;
  put32(&huge_png, 16, 20000);
  put32(&huge_png, 20, 20000);
  // A BMP whose info header says 30000 × -30000 (top-down).
  std::string huge_bmp = testing::Encode(rgb, ".bmp");
  for (int i = 0; i < 4; ++i) {
    huge_bmp[18 + i] = static_cast<char>(30000 >> (8 * i));
    huge_bmp[22 + i] = static_cast<char>(static_cast<uint32_t>(-30000) >> (8 * i));
  }
  // SOF0 says 60000 × 60000.
  std::string huge_jpeg = EncodeJpegRgb(rgb);
  const size_t sof = huge_jpeg.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  for (size_t at : {sof + 5, sof + 7}) {
    huge_jpeg[at] = static_cast<char>(60000 >> 8);
    huge_jpeg[at + 1] = static_cast<char>(60000 & 0xFF);
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {huge_chunk,
       "PNG chunk 'tEXt' at byte 33 declares 1644167168 data bytes, past the "
       "end of the data"},
      {huge_png,
       "the header declares 20000x20000 pixels, more than the "
       "decoder's limit of 268435456"},
      {png.substr(0, png.size() - 12), "PNG ends at byte"},
      {huge_jpeg, "the header declares 60000x60000 pixels"},
      {huge_bmp, "the header declares 30000x30000 pixels"},
      {huge_bmp.substr(0, 20), "BMP header is truncated"},
  };
  proto::OpSpec resize;
  resize.mutable_resize()->set_size(50);
  for (const bool fuse : {false, true}) {
    auto op =
        fuse ? Build({DecodeSpec(), resize}, /*fuse=*/true) : Build({DecodeSpec()}, /*fuse=*/false);
    for (const auto& [bytes, message] : cases) {
      SCOPED_TRACE(message);
      absl::StatusOr<Tensor> out = op->Apply(Bytes(bytes), ElementContext{});
      ASSERT_FALSE(out.ok());
      EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(out.status().message(),
                  HasSubstr(absl::StrCat("cannot decode image: ", message)));
    }
  }
}

// BMP and WebP decode like OpenCV; OpenCV's other readers are not reachable.
TEST(Decode, BmpAndWebpDecodeOtherFormatsAreRefused) {
  auto op = Build({DecodeSpec()}, /*fuse=*/false);
  const cv::Mat rgb = MakeRgb(40, 30);
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  for (const std::string ext : {".bmp", ".webp"}) {
    SCOPED_TRACE(ext);
    const std::string bytes = ext == ".webp"
                                  ? testing::Encode(bgr, ext, {cv::IMWRITE_WEBP_QUALITY, 101})
                                  : testing::Encode(bgr, ext);
    absl::StatusOr<Tensor> out = op->Apply(Bytes(bytes), ElementContext{});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Compare(MatOf(*out), rgb).max, 0);
  }
  cv::Mat big;  // JPEG 2000's default 6 resolution levels need 64 × 64
  cv::resize(bgr, big, cv::Size(128, 128));
  for (const std::string ext : {".tiff", ".ppm", ".jp2"}) {
    SCOPED_TRACE(ext);
    const std::string bytes = testing::Encode(big, ext);
    ASSERT_FALSE(
        cv::imdecode(std::vector<uint8_t>(bytes.begin(), bytes.end()), cv::IMREAD_COLOR).empty());
    absl::StatusOr<Tensor> out = op->Apply(Bytes(bytes), ElementContext{});
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(out.status().message(), HasSubstr("unsupported image format (first bytes '"));
    EXPECT_THAT(out.status().message(), HasSubstr("sluice decodes JPEG, PNG, BMP and WebP"));
  }
}

// WebP is decoded by libwebp, not cv::imdecode: OpenCV probes every codec's signature and a WebP
// whose header libwebp rejects went on to the DICOM codec, whose library asserts (the decode
// fuzzer's crash: a RIFF/WEBP header with "DICM" at byte 128). Lossy WebP equals OpenCV's decode.
TEST(Decode, WebpIsDecodedByLibwebpAndACorruptOneNeverReachesAnotherCodec) {
  auto op = Build({DecodeSpec()}, /*fuse=*/false);
  cv::Mat bgr;
  cv::cvtColor(MakeRgb(40, 30), bgr, cv::COLOR_RGB2BGR);
  const std::string lossy = testing::Encode(bgr, ".webp", {cv::IMWRITE_WEBP_QUALITY, 80});
  absl::StatusOr<Tensor> out = op->Apply(Bytes(lossy), ElementContext{});
  ASSERT_TRUE(out.ok()) << out.status();
  cv::Mat reference_rgb;
  cv::cvtColor(cv::imdecode(std::vector<uint8_t>(lossy.begin(), lossy.end()), cv::IMREAD_COLOR),
               reference_rgb, cv::COLOR_BGR2RGB);
  EXPECT_EQ(Compare(MatOf(*out), reference_rgb).max, 0);

  std::string corrupt = "RIFF\xff\xd8\xff\x01WEBP";
  corrupt.resize(128, '\x10');
  corrupt += "DICM";
  corrupt.resize(160, '\x10');
  out = op->Apply(Bytes(corrupt), ElementContext{});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out.status().message(), "cannot decode image: corrupt WebP header");

  std::string truncated = lossy.substr(0, lossy.size() / 2);
  out = op->Apply(Bytes(truncated), ElementContext{});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out.status().message(), "cannot decode image: corrupt WebP data");
}

// The faster JPEG settings (DecodeOp.idct, fast_upsampling) reach libjpeg in the plain and the
// fused decode: the pixels change, but stay close to the accurate decode.
TEST(Decode, FasterJpegSettingsChangeThePixelsSlightly) {
  const cv::Mat rgb = MakeRgb(200, 300);
  const std::string jpeg = EncodeJpegRgb(rgb);  // 4:2:0, as most photos
  // 200 -> 150 decodes at DCT scale 1: at 1/2 and below libjpeg scales the chroma in the IDCT
  // and has nothing to upsample.
  proto::OpSpec resize;
  resize.mutable_resize()->set_size(150);
  for (const bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "fused with resize" : "plain decode");
    auto build = [&](proto::OpSpec decode) {
      return fuse ? Build({decode, resize}, /*fuse=*/true) : Build({decode}, /*fuse=*/false);
    };
    absl::StatusOr<Tensor> accurate = build(DecodeSpec())->Apply(Bytes(jpeg), ElementContext{});
    ASSERT_TRUE(accurate.ok()) << accurate.status();
    for (const auto& [name, idct, fast_upsampling] :
         std::vector<std::tuple<std::string, proto::DecodeOp::Idct, bool>>{
             {"ifast", proto::DecodeOp::IDCT_FAST, false},
             {"float", proto::DecodeOp::IDCT_FLOAT, false},
             {"fast upsampling", proto::DecodeOp::IDCT_ACCURATE, true}}) {
      SCOPED_TRACE(name);
      proto::OpSpec decode = DecodeSpec();
      decode.mutable_decode()->set_idct(idct);
      decode.mutable_decode()->set_fast_upsampling(fast_upsampling);
      absl::StatusOr<Tensor> out = build(decode)->Apply(Bytes(jpeg), ElementContext{});
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->shape(), accurate->shape());
      const Diff diff = Compare(MatOf(*out), MatOf(*accurate));
      EXPECT_GT(diff.max, 0);  // the setting took effect
      EXPECT_LT(diff.mean,
                4.0);  // decode_test's tolerance for the region decode
    }
  }
}

// ChooseDctScale's fixed rules, values worked out by hand: the bound is box·n >= out·8 on both
// axes (224·8 = 1792).
TEST(DctScale, FixedRulesPickTheSmallestScaleKeepingTheBoxAtLeastTheOutput) {
  struct Case {
    int box_h, box_w, out;
    int pow2, eighth;
  };
  for (const Case& c : std::vector<Case>{
           {1000, 1000, 224, 2, 2},  // 1000·2 = 2000 >= 1792 > 1000
           {700, 700, 224, 4, 3},    // 700·3 = 2100 >= 1792 > 1400
           {448, 448, 224, 4, 4},    // 448·4 = 1792 exactly
           {447, 447, 224, 8, 5},    // 447·4 = 1788 < 1792
           {1800, 500, 224, 4, 4},   // the narrow side decides: 500·4 = 2000
           {224, 224, 224, 8, 8},    // no reduction
           {100, 150, 224, 8, 8},    // an upscale decodes at full size
           {2000, 2000, 224, 1, 1},  // 2000·1 >= 1792
       }) {
    SCOPED_TRACE(absl::StrCat(c.box_h, "x", c.box_w, " -> ", c.out));
    for (const auto& [h_samp, v_samp] : {std::pair{2, 2}, std::pair{1, 1}}) {
      EXPECT_EQ(
          ChooseDctScale(DctScaleRule::kPowerOfTwo, c.box_h, c.box_w, c.out, c.out, h_samp, v_samp),
          c.pow2);
      EXPECT_EQ(ChooseDctScale(DctScaleRule::kSmallestEighth, c.box_h, c.box_w, c.out, c.out,
                               h_samp, v_samp),
                c.eighth);
    }
  }
}

// The cost model, values worked out by hand from decode.cc's tables: cost(n) = decode[n-1] +
// 0.92·n²/64 ns per source pixel. 4:2:0: 2.45, 3.14, 3.81, 3.69, 5.39, 6.21, 7.82, 5.53;
// 4:4:4: 3.14, 3.97, 4.42, 4.89, 6.30, 7.07, 9.45, 6.46. The cheapest scale at or above the
// smallest one keeping the bound (in parentheses) wins.
TEST(DctScale, CostModelPicksTheCheapestScaleKeepingTheBoundForTheSampling) {
  struct Case {
    int box_h, box_w, out_h, out_w;
    int subsampled, full;
  };
  for (const Case& c : std::vector<Case>{
           {2000, 2000, 224, 224, 1, 1},  // (1)
           {1000, 1000, 224, 224, 2, 2},  // (2)
           {700, 700, 224, 224, 4, 3},    // (3): 3.69 < 3.81; 4.42 < 4.89
           {448, 448, 224, 224, 4, 4},    // (4)
           {447, 447, 224, 224, 5, 5},    // (5): 5.39 < 5.53, 6.30 < 6.46
           {350, 350, 224, 224, 8, 8},    // (6): 6.21 > 5.53, 7.07 > 6.46
           {280, 900, 224, 224, 8, 8},    // (7), the short side decides
           {100, 150, 224, 224, 8, 8},    // an upscale decodes at full size
           {375, 500, 100, 133, 4, 3},    // Resize(100) of 375x500: (3)
       }) {
    SCOPED_TRACE(absl::StrCat(c.box_h, "x", c.box_w, " -> ", c.out_h, "x", c.out_w));
    EXPECT_EQ(ChooseDctScale(DctScaleRule::kCostModel, c.box_h, c.box_w, c.out_h, c.out_w,
                             /*max_h_samp=*/2, /*max_v_samp=*/2),
              c.subsampled);
    EXPECT_EQ(ChooseDctScale(DctScaleRule::kCostModel, c.box_h, c.box_w, c.out_h, c.out_w,
                             /*max_h_samp=*/2, /*max_v_samp=*/1),  // 4:2:2
              c.subsampled);
    EXPECT_EQ(ChooseDctScale(DctScaleRule::kCostModel, c.box_h, c.box_w, c.out_h, c.out_w,
                             /*max_h_samp=*/1, /*max_v_samp=*/1),
              c.full);
  }
}

// DecodeOp.dct_scale reaches the fused decode: 375x500 -> Resize(100) (100x133) decodes at 4/8
// under the power-of-two rule and at 3/8 under the n/8 rule (375·3 = 1125 >= 800), which changes
// the pixels; the default (the cost model) gives exactly the bytes of 4/8 for a 4:2:0 JPEG and
// of 3/8 for a 4:4:4 one (the values of the test above).
TEST(DctScale, TheDecodeSettingSelectsTheRule) {
  const cv::Mat rgb = MakeRgb(375, 500);
  proto::OpSpec resize;
  resize.mutable_resize()->set_size(100);
  for (const auto& [name, h_samp, cost_picks_pow2] :
       std::vector<std::tuple<std::string, int, bool>>{{"420", 2, true}, {"444", 1, false}}) {
    SCOPED_TRACE(name);
    const std::string jpeg = testing::EncodeJpegSampling(rgb, h_samp, h_samp);
    auto run = [&](proto::DecodeOp::DctScale setting) {
      proto::OpSpec decode = DecodeSpec();
      decode.mutable_decode()->set_dct_scale(setting);
      absl::StatusOr<Tensor> out =
          Build({decode, resize}, /*fuse=*/true)->Apply(Bytes(jpeg), ElementContext{});
      EXPECT_TRUE(out.ok()) << out.status();
      return out.ok() ? std::string(out->bytes()) : std::string();
    };
    const std::string pow2 = run(proto::DecodeOp::DCT_SCALE_POWER_OF_TWO);
    const std::string eighth = run(proto::DecodeOp::DCT_SCALE_EIGHTH);
    const std::string cost = run(proto::DecodeOp::DCT_SCALE_COST);
    ASSERT_EQ(pow2.size(), size_t{100 * 133 * 3});
    ASSERT_EQ(eighth.size(), pow2.size());
    EXPECT_NE(pow2, eighth);
    EXPECT_EQ(cost, cost_picks_pow2 ? pow2 : eighth);
  }
}

TEST(Decode, RejectsNonBytesInput) {
  auto op = Build({DecodeSpec()}, /*fuse=*/false);
  absl::StatusOr<Tensor> out =
      op->Apply(Tensor::Allocate(DType::kFloat32, {2, 2}), ElementContext{});
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("op 0 (Decode)"));
  EXPECT_THAT(out.status().message(), HasSubstr("bytes"));
}

// Fused Decode+X vs the plain OpenCV reference (full imdecode, then
// crop/resize). Tolerance: the DCT-domain downscale is a box filter where the
// reference samples bilinearly, and the box is rounded to the scaled pixel
// grid: mean abs diff < 4 levels, max < 48 (at sharp edges).
constexpr double kFusedMeanTolerance = 4.0;
constexpr double kFusedMaxTolerance = 48.0;

TEST(FusedDecode, RandomResizedCropMatchesOpenCvReference) {
  proto::OpSpec rrc;
  rrc.mutable_random_resized_crop()->set_size(224);
  auto fused = Build({DecodeSpec(), rrc}, /*fuse=*/true);
  EXPECT_EQ(fused->name(), "Decode+RandomResizedCrop");
  auto unfused = BuildOps({DecodeSpec(), rrc}, 0, /*fuse=*/false);
  ASSERT_TRUE(unfused.ok());
  double worst_mean = 0;
  for (const Variant& v : JpegVariants()) {
    SCOPED_TRACE(v.name);
    const cv::Mat ref_full = ReferenceDecode(v.bytes);
    for (uint64_t index = 0; index < 12; ++index) {
      SCOPED_TRACE(index);
      const ElementContext ctx{/*seed=*/42, /*epoch=*/1,
                               /*global_index=*/index};
      absl::StatusOr<Tensor> out = fused->Apply(Bytes(v.bytes), ctx);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->shape(), (std::vector<int64_t>{224, 224, 3}));
      Rng rng = ctx.RngFor(1);
      const CropBox box = testing::TorchvisionBox(ref_full.rows, ref_full.cols, rng);
      cv::Mat ref;
      cv::resize(ref_full(cv::Rect(box.left, box.top, box.width, box.height)), ref,
                 cv::Size(224, 224), 0, 0, cv::INTER_LINEAR);
      const Diff d = Compare(MatOf(*out), ref);
      worst_mean = std::max(worst_mean, d.mean);
      EXPECT_LT(d.mean, kFusedMeanTolerance);
      EXPECT_LT(d.max, kFusedMaxTolerance);
      // The unfused chain decodes with the same library: same tolerance.
      absl::StatusOr<Tensor> decoded = (*unfused)[0]->Apply(Bytes(v.bytes), ctx);
      ASSERT_TRUE(decoded.ok());
      absl::StatusOr<Tensor> cropped = (*unfused)[1]->Apply(std::move(*decoded), ctx);
      ASSERT_TRUE(cropped.ok());
      const Diff du = Compare(MatOf(*out), MatOf(*cropped));
      EXPECT_LT(du.mean, kFusedMeanTolerance);
      EXPECT_LT(du.max, kFusedMaxTolerance);
    }
  }
  RecordProperty("worst_mean_abs_diff", std::to_string(worst_mean));
}

// Resize: the reference is cv::resize of the full decode, INTER_LINEAR when
// shrinking by less than 2x and INTER_AREA (antialiased, like torchvision's
// antialias=True) beyond, since bilinear sampling of a 4x shrink aliases and is
// no meaningful reference.
TEST(FusedDecode, ResizeMatchesOpenCvReference) {
  for (int size : {100, 200, 256, 600}) {
    SCOPED_TRACE(size);
    proto::OpSpec resize;
    resize.mutable_resize()->set_size(size);
    auto fused = Build({DecodeSpec(), resize}, /*fuse=*/true);
    for (const Variant& v : JpegVariants()) {
      SCOPED_TRACE(v.name);
      absl::StatusOr<Tensor> out = fused->Apply(Bytes(v.bytes), ElementContext{});
      ASSERT_TRUE(out.ok()) << out.status();
      const cv::Mat full = ReferenceDecode(v.bytes);
      const cv::Size target(out->dim(1), out->dim(0));
      const bool big_shrink = full.cols >= 2 * target.width || full.rows >= 2 * target.height;
      cv::Mat ref;
      cv::resize(full, ref, target, 0, 0, big_shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
      const Diff d = Compare(MatOf(*out), ref);
      EXPECT_LT(d.mean, kFusedMeanTolerance);
      EXPECT_LT(d.max, kFusedMaxTolerance);
    }
  }
}

TEST(FusedDecode, CenterCropEqualsCropOfFullDecode) {
  proto::OpSpec crop;
  crop.mutable_center_crop()->set_height(5);
  crop.mutable_center_crop()->set_width(3);
  proto::OpSpec big = crop;
  big.mutable_center_crop()->set_height(224);
  big.mutable_center_crop()->set_width(224);
  for (const Variant& v : JpegVariants()) {
    SCOPED_TRACE(v.name);
    const cv::Mat full = ReferenceDecode(v.bytes);
    for (const proto::OpSpec& spec : {crop, big}) {
      auto fused = Build({DecodeSpec(), spec}, /*fuse=*/true);
      const int h = spec.center_crop().height(), w = spec.center_crop().width();
      absl::StatusOr<Tensor> out = fused->Apply(Bytes(v.bytes), ElementContext{});
      if (h > full.rows || w > full.cols) {
        ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(out.status().message(), HasSubstr("op 1 (CenterCrop)"));
        EXPECT_THAT(out.status().message(), HasSubstr(absl::StrCat(full.rows, "x", full.cols)));
        continue;
      }
      ASSERT_TRUE(out.ok()) << out.status();
      const int top = static_cast<int>(std::nearbyint((full.rows - h) / 2.0));
      const int left = static_cast<int>(std::nearbyint((full.cols - w) / 2.0));
      const Diff d = Compare(MatOf(*out), full(cv::Rect(left, top, w, h)));
      // Region decode at scale 1: the same pixels up to chroma upsampling at
      // region edges.
      EXPECT_LE(d.max, 2) << "mean " << d.mean;
    }
  }
}

TEST(FusedDecode, PngFallsBackToOpenCvWithIdenticalResult) {
  const cv::Mat rgb = MakeRgb(120, 90);
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  const std::string png = testing::Encode(bgr, ".png");
  proto::OpSpec rrc;
  rrc.mutable_random_resized_crop()->set_size(32);
  auto fused = Build({DecodeSpec(), rrc}, /*fuse=*/true);
  auto unfused = BuildOps({DecodeSpec(), rrc}, 0, false);
  ASSERT_TRUE(unfused.ok());
  const ElementContext ctx{1, 2, 3};
  absl::StatusOr<Tensor> a = fused->Apply(Bytes(png), ctx);
  absl::StatusOr<Tensor> b = (*unfused)[0]->Apply(Bytes(png), ctx);
  ASSERT_TRUE(a.ok() && b.ok());
  b = (*unfused)[1]->Apply(std::move(*b), ctx);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->bytes(), b->bytes());
}

TEST(FusedDecode, SameElementSameBytesDifferentIndexDifferentCrop) {
  proto::OpSpec rrc;
  rrc.mutable_random_resized_crop()->set_size(48);
  auto fused = Build({DecodeSpec(), rrc}, /*fuse=*/true);
  const std::string jpeg = JpegVariants()[0].bytes;
  const ElementContext ctx{7, 0, 5};
  absl::StatusOr<Tensor> a = fused->Apply(Bytes(jpeg), ctx);
  absl::StatusOr<Tensor> b = fused->Apply(Bytes(jpeg), ctx);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->bytes(), b->bytes());
  int different = 0;
  for (uint64_t i = 6; i < 16; ++i) {
    absl::StatusOr<Tensor> c = fused->Apply(Bytes(jpeg), ElementContext{7, 0, i});
    ASSERT_TRUE(c.ok());
    different += c->bytes() != a->bytes();
  }
  EXPECT_EQ(different, 10);
  absl::StatusOr<Tensor> other_epoch = fused->Apply(Bytes(jpeg), ElementContext{7, 1, 5});
  ASSERT_TRUE(other_epoch.ok());
  EXPECT_NE(other_epoch->bytes(), a->bytes());
}

TEST(FusedDecode, ImagenetTrainChainMatchesUnfusedChain) {
  std::vector<proto::OpSpec> specs(5);
  specs[0].mutable_decode();
  specs[1].mutable_random_resized_crop()->set_size(224);
  specs[2].mutable_random_horizontal_flip();
  for (float m : {0.485f, 0.456f, 0.406f}) specs[3].mutable_normalize()->add_mean(m);
  for (float s : {0.229f, 0.224f, 0.225f}) specs[3].mutable_normalize()->add_std(s);
  specs[4].mutable_hwc2chw();
  auto fused = BuildOps(specs, /*first_position=*/3, /*fuse=*/true);
  auto unfused = BuildOps(specs, /*first_position=*/3, /*fuse=*/false);
  ASSERT_TRUE(fused.ok() && unfused.ok());
  ASSERT_EQ(fused->size(), 3u);
  EXPECT_EQ((*fused)[0]->name(), "Decode+RandomResizedCrop");
  EXPECT_EQ((*fused)[1]->name(), "RandomHorizontalFlip");
  EXPECT_EQ((*fused)[2]->name(), "Normalize+HWC2CHW");
  for (const Variant& v : JpegVariants()) {
    SCOPED_TRACE(v.name);
    for (uint64_t index = 0; index < 4; ++index) {
      const ElementContext ctx{99, 0, index};
      auto run = [&](const std::vector<std::unique_ptr<Op>>& ops) {
        Tensor t = Bytes(v.bytes);
        for (const auto& op : ops) {
          absl::StatusOr<Tensor> next = op->Apply(std::move(t), ctx);
          EXPECT_TRUE(next.ok()) << next.status();
          t = std::move(*next);
        }
        return t;
      };
      const Tensor a = run(*fused), b = run(*unfused);
      ASSERT_EQ(a.shape(), (std::vector<int64_t>{3, 224, 224}));
      ASSERT_EQ(a.shape(), b.shape());
      // Back to levels: |diff| * std * 255.
      const float* pa = a.data_as<float>();
      const float* pb = b.data_as<float>();
      const int64_t plane = 224 * 224;
      double sum = 0, worst = 0;
      for (int64_t i = 0; i < a.num_elements(); ++i) {
        const double d = std::abs(pa[i] - pb[i]) * specs[3].normalize().std(i / plane) * 255;
        sum += d;
        worst = std::max(worst, d);
      }
      EXPECT_LT(sum / a.num_elements(), kFusedMeanTolerance);
      EXPECT_LT(worst, kFusedMaxTolerance);
    }
  }
}

}  // namespace
}  // namespace sluice::data_worker
