// dct_scale_cost_bench: the measurements behind DctScaleRule::kCostModel's
// table (decode.cc): CPU time per source pixel of a JPEG region decode at each
// DCT scale n/8, and how far each scale's train output is from a full decode
// followed by the same bilinear resize.
//
//   dct_scale_cost_bench --data DS [--rounds R]
//
// DS is a Unirecord dataset with an `image` column of JPEGs, all in memory.
// For n = 1..8 every image, cropped to a multiple of 8 pixels on each axis, is
// decoded at scale n/8 (no resize: the output is exactly the scaled box), R times;
// prints `scale n/8: <ns> ns per source pixel` (CPU time over the pixels of
// the full-size image: the cost of decoding a region of A pixels at n/8 is
// about A times this, whatever the region; the table in decode.cc), and
// `resize: <ns> ns per input pixel` (bilinear, shrinking by 1/0.6). Then for
// the centre box of each image with side s = ceil(224·8/n), the largest box
// decoded at n/8 (at the fidelity bound: decoded box = output), it prints the
// mean absolute difference, in 0..255 levels, between the region decode at n/8
// + resize to 224×224 and the same box decoded at full size and resized.
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/record/dataset.h"
#include "data_worker/ops/decode.h"
#include "data_worker/ops/geometry.h"

namespace dw = sluice::data_worker;

namespace {

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// A plan decoding `box` at scale n/8 resized to out × out (0: box·n/8, which
// the n/8 rule decodes at exactly n/8 when the box is a multiple of 8). n = 8
// turns DCT scaling off.
dw::PlanFn ScalePlan(int n, dw::CropBox box, int out) {
  return [=](int, int) -> absl::StatusOr<dw::DecodePlan> {
    dw::DecodePlan p;
    p.box = box;
    p.out_height = out > 0 ? out : box.height * n / 8;
    p.out_width = out > 0 ? out : box.width * n / 8;
    p.allow_dct_scaling = n < 8;
    p.dct_rule = dw::DctScaleRule::kSmallestEighth;
    return p;
  };
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DCT scale cost and fidelity"};
  std::string data;
  int rounds = 3;
  app.add_option("--data", data, "Unirecord dataset folder")->required();
  app.add_option("--rounds", rounds, "Timed rounds")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto ds = sluice::record::Dataset::Open(data);
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ds.status().message()).c_str());
    return 1;
  }
  const int col = (*ds)->schema().ColumnIndex("image");
  std::vector<std::string> jpegs;
  std::vector<std::pair<int, int>> sizes;
  for (uint64_t i = 0; i < (*ds)->size(); ++i) {
    auto rec = (*ds)->Read(i);
    if (!rec.ok()) return 1;
    jpegs.push_back(std::string(rec->columns[col].data));
    auto full = dw::DecodeImage(jpegs.back());
    if (!full.ok()) return 1;
    sizes.emplace_back(full->dim(0), full->dim(1));
  }
  for (int n = 1; n <= 8; ++n) {
    double pixels = 0;
    const double cpu0 = CpuSeconds();
    for (int r = 0; r < rounds; ++r) {
      for (size_t i = 0; i < jpegs.size(); ++i) {
        const dw::CropBox box{0, 0, sizes[i].first / 8 * 8, sizes[i].second / 8 * 8};
        auto img = dw::DecodeImageRegion(jpegs[i], ScalePlan(n, box, 0));
        if (!img.ok()) return 1;
        pixels += double(sizes[i].first) * sizes[i].second;
      }
    }
    std::printf("scale %d/8: %.2f ns per source pixel\n", n, 1e9 * (CpuSeconds() - cpu0) / pixels);
  }
  double resize_pixels = 0, resize_secs = 0;
  for (size_t i = 0; i < jpegs.size(); ++i) {
    auto full = dw::DecodeImage(jpegs[i]);
    if (!full.ok()) return 1;
    const int h = sizes[i].first, w = sizes[i].second;
    const double cpu0 = CpuSeconds();
    for (int r = 0; r < rounds; ++r) {
      dw::Tensor out = dw::CropAndResize(*full, dw::CropBox{0, 0, h, w}, h * 6 / 10, w * 6 / 10,
                                         /*INTER_LINEAR=*/1);
      resize_pixels += double(h) * w;
    }
    resize_secs += CpuSeconds() - cpu0;
  }
  std::printf("resize: %.2f ns per input pixel\n", 1e9 * resize_secs / resize_pixels);
  constexpr int kOut = 224;
  {
    for (int n = 1; n <= 8; ++n) {
      const int side = (kOut * 8 + n - 1) / n;
      double sum = 0;
      int64_t count = 0;
      for (size_t i = 0; i < jpegs.size(); ++i) {
        const auto [h, w] = sizes[i];
        if (side > h || side > w) continue;
        const dw::CropBox box{(h - side) / 2, (w - side) / 2, side, side};
        auto got = dw::DecodeImageRegion(jpegs[i], ScalePlan(n, box, kOut));
        auto ref = dw::DecodeImageRegion(jpegs[i], ScalePlan(8, box, kOut));
        if (!got.ok() || !ref.ok()) return 1;
        for (size_t k = 0; k < ref->num_bytes(); ++k) {
          sum += std::abs(int(got->data()[k]) - int(ref->data()[k]));
        }
        count += static_cast<int64_t>(ref->num_bytes());
      }
      if (count == 0) continue;
      std::printf("bound scale %d/8: mean abs diff %.3f levels (%lld images)\n", n, sum / count,
                  static_cast<long long>(count / (kOut * kOut * 3)));
    }
  }
  return 0;
}
