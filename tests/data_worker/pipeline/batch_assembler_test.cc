#include "data_worker/pipeline/batch_assembler.h"

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data_worker/ops/op.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::data_worker::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Collects what the assembler emits.
struct Sink {
  std::map<uint64_t, absl::StatusOr<Element>> batches;
  std::optional<uint64_t> end;
  LiveBytes live;
};

std::unique_ptr<BatchAssembler> Make(Sink* sink, int64_t batch_size, bool drop_remainder = false,
                                     uint64_t window = 100, int64_t max_buffer_bytes = 0) {
  BatchAssembler::Options o;
  o.max_buffer_bytes = max_buffer_bytes;
  o.batch_size = batch_size;
  o.drop_remainder = drop_remainder;
  o.window = window;
  o.column_names = {"value", "image"};
  o.live = &sink->live;
  return std::make_unique<BatchAssembler>(
      o, [sink](uint64_t k, absl::StatusOr<Element> b) { sink->batches.emplace(k, std::move(b)); },
      [sink](uint64_t n) { sink->end = n; },
      [](absl::Status s, uint64_t global) {
        return absl::Status(s.code(), absl::StrCat("record ", global, ": ", s.message()));
      });
}

// An element with global index `g`: an int32 scalar g and a 2x2 uint8 image
// filled with g.
Item Elem(uint64_t g, LiveBytes* live, int side = 2) {
  auto e = std::make_unique<Element>();
  e->global_indices = {g};
  e->columns.push_back(Tensor::Scalar<int32_t>(static_cast<int32_t>(g)));
  Tensor img = Tensor::Allocate(DType::kUint8, {side, side});
  std::memset(img.data(), static_cast<int>(g), img.num_bytes());
  e->columns.push_back(std::move(img));
  return Item(std::move(e), live);
}

std::vector<int32_t> Values(const Element& b) {
  const Tensor& t = b.columns[0];
  return std::vector<int32_t>(t.data_as<int32_t>(), t.data_as<int32_t>() + t.dim(0));
}

TEST(BatchAssembler, ReordersAndSkipsHolesAndCutsTheLastBatch) {
  Sink sink;
  auto a = Make(&sink, /*batch_size=*/3);
  // Sequence 0..7; 2 and 5 are holes. Added out of order.
  const std::vector<uint64_t> order = {4, 1, 7, 0, 3, 6, 2, 5};
  for (uint64_t seq : order) {
    if (seq == 2 || seq == 5) {
      a->Add(seq, Item());
    } else {
      a->Add(seq, Elem(100 + seq, &sink.live));
    }
  }
  EXPECT_FALSE(sink.end.has_value());
  a->SetInputEnd(8);
  ASSERT_EQ(sink.end, 2u);
  ASSERT_EQ(sink.batches.size(), 2u);
  const Element& b0 = *sink.batches.at(0);
  EXPECT_THAT(b0.global_indices, ElementsAre(100, 101, 103));
  EXPECT_THAT(Values(b0), ElementsAre(100, 101, 103));
  EXPECT_EQ(b0.columns[1].shape(), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(b0.columns[1].data()[4 * 2], 103);  // slot 2 at offset 2 * 4
  const Element& b1 = *sink.batches.at(1);
  EXPECT_THAT(b1.global_indices, ElementsAre(104, 106, 107));
  // 6 elements in 2 full batches; no short batch.
  EXPECT_EQ(sink.live.live(), 0);
}

TEST(BatchAssembler, ShortLastBatchIsKeptOrDropped) {
  for (const bool drop : {false, true}) {
    Sink sink;
    auto a = Make(&sink, /*batch_size=*/4, drop);
    for (uint64_t seq = 0; seq < 6; ++seq) a->Add(seq, Elem(seq, &sink.live));
    a->SetInputEnd(6);
    if (drop) {
      EXPECT_EQ(sink.end, 1u);
      EXPECT_EQ(sink.batches.size(), 1u);
    } else {
      EXPECT_EQ(sink.end, 2u);
      ASSERT_EQ(sink.batches.size(), 2u);
      const Element& last = *sink.batches.at(1);
      EXPECT_THAT(last.global_indices, ElementsAre(4, 5));
      EXPECT_EQ(last.columns[0].shape(), (std::vector<int64_t>{2}));
      EXPECT_EQ(last.columns[1].shape(), (std::vector<int64_t>{2, 2, 2}));
      EXPECT_THAT(Values(last), ElementsAre(4, 5));
    }
    EXPECT_EQ(sink.live.live(), 0) << "drop=" << drop;
  }
}

TEST(BatchAssembler, AnErrorEndsTheOutputInItsBatch) {
  Sink sink;
  auto a = Make(&sink, /*batch_size=*/2);
  a->Add(0, Elem(0, &sink.live));
  a->Add(1, Elem(1, &sink.live));
  a->Add(2, Elem(2, &sink.live));
  a->Add(4, Elem(4, &sink.live));  // after the error: never committed
  a->Add(3, Item::Error(absl::DataLossError("bad record 3")));
  EXPECT_EQ(sink.end, 2u);
  ASSERT_EQ(sink.batches.size(), 2u);
  EXPECT_THAT(sink.batches.at(0)->global_indices, ElementsAre(0, 1));
  EXPECT_EQ(sink.batches.at(1).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(sink.batches.at(1).status().message(), "bad record 3");
  a->SetInputEnd(5);  // no effect after the error
  EXPECT_EQ(sink.end, 2u);
  EXPECT_EQ(sink.batches.size(), 2u);
}

TEST(BatchAssembler, ErrorAtABatchBoundaryIsItsOwnBatch) {
  Sink sink;
  auto a = Make(&sink, /*batch_size=*/2);
  a->Add(0, Elem(0, &sink.live));
  a->Add(1, Elem(1, &sink.live));
  a->Add(2, Item::Error(absl::InternalError("boom")));
  EXPECT_EQ(sink.end, 2u);
  EXPECT_TRUE(sink.batches.at(0).ok());
  EXPECT_EQ(sink.batches.at(1).status().code(), absl::StatusCode::kInternal);
}

TEST(BatchAssembler, ShapeMismatchNamesTheColumnAndRecord) {
  Sink sink;
  auto a = Make(&sink, /*batch_size=*/2);
  a->Add(0, Elem(0, &sink.live, /*side=*/2));
  a->Add(1, Elem(1, &sink.live, /*side=*/3));
  ASSERT_EQ(sink.batches.size(), 1u);
  const absl::Status s = sink.batches.at(0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "record 1: column 'image' is uint8[3,3] but the batch holds "
            "uint8[2,2]; resize or crop to a fixed size first");
  EXPECT_EQ(sink.live.live(), 0);
}

TEST(BatchAssembler, ABatchOverTheBudgetIsRefusedBeforeItsBufferIsAllocated) {
  Sink sink;
  // An element is 8 (id) + 4 (int32) + 4 (2x2 uint8) = 16 bytes: a batch of 1e9 would be 16 GB.
  auto a = Make(&sink, /*batch_size=*/1000000000, /*drop_remainder=*/false,
                /*window=*/100, /*max_buffer_bytes=*/1 << 20);
  a->Add(0, Elem(0, &sink.live));
  a->Add(1, Elem(1, &sink.live));
  a->SetInputEnd(2);
  ASSERT_EQ(sink.batches.size(), 1u);
  const absl::Status s = sink.batches.at(0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "a batch of 1000000000 elements of 16 bytes is more than this "
            "worker's memory budget of 1048576 bytes (--memory-mb): use a "
            "smaller batch size or smaller images");
  EXPECT_EQ(sink.live.live(), 0);

  Sink fits;  // 65536 x 16 bytes = the budget exactly
  auto b = Make(&fits, /*batch_size=*/65536, /*drop_remainder=*/false,
                /*window=*/100, /*max_buffer_bytes=*/1 << 20);
  b->Add(0, Elem(0, &fits.live));
  b->SetInputEnd(1);
  ASSERT_EQ(fits.batches.size(), 1u);
  EXPECT_TRUE(fits.batches.at(0).ok()) << fits.batches.at(0).status();
}

// Batch write fusion: column 1 is written through Normalize+HWC2CHW (mean 0,
// std 1: x / 255) after a flip that always mirrors (p = 1), into a float32
// C×H×W batch; an element the op rejects (a gray H×W image: the flip takes
// it, Normalize+HWC2CHW does not) fails its batch, naming the record and the
// op, as the unfused ops would.
TEST(BatchAssembler, WrittenColumnsGoThroughTheirOpIntoAFloatBatch) {
  std::vector<proto::OpSpec> specs(3);
  specs[0].mutable_random_horizontal_flip()->set_p(1);
  specs[1].mutable_normalize()->add_mean(0);
  specs[1].mutable_normalize()->add_std(1);
  specs[2].mutable_hwc2chw();
  auto ops = BuildOps(specs, /*first_position=*/0, /*fuse=*/true);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 2u);
  Sink sink;
  BatchAssembler::Options o;
  o.batch_size = 2;
  o.window = 10;
  o.column_names = {"value", "image"};
  o.live = &sink.live;
  o.writes.push_back({/*slot=*/1, std::move((*ops)[0]), std::move((*ops)[1])});
  BatchAssembler a(
      o, [&](uint64_t k, absl::StatusOr<Element> b) { sink.batches.emplace(k, std::move(b)); },
      [&](uint64_t n) { sink.end = n; },
      [](absl::Status s, uint64_t global) {
        return absl::Status(s.code(), absl::StrCat("record ", global, ": ", s.message()));
      });
  // Elements: a 1×2 RGB image (0, 10, 20) (30, 40, 50) + g, or a 2×2 gray
  // one (rank 2: not H×W×C).
  auto image = [&](uint64_t g, bool gray) {
    auto e = std::make_unique<Element>();
    e->global_indices = {g};
    e->columns.push_back(Tensor::Scalar<int32_t>(static_cast<int32_t>(g)));
    Tensor img = Tensor::Allocate(
        DType::kUint8, gray ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{1, 2, 3});
    for (int64_t i = 0; i < img.num_elements(); ++i) img.data()[i] = 10 * i + g;
    e->columns.push_back(std::move(img));
    return Item(std::move(e), &sink.live);
  };
  a.Add(0, image(1, false));
  a.Add(1, image(2, false));
  a.Add(2, image(3, false));
  a.Add(3, image(4, /*gray=*/true));
  a.SetInputEnd(4);
  ASSERT_EQ(sink.batches.size(), 2u);
  ASSERT_TRUE(sink.batches.at(0).ok()) << sink.batches.at(0).status();
  const Tensor& t = sink.batches.at(0)->columns[1];
  ASSERT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3, 1, 2}));
  // Mirrored, C×H×W: R plane (30, 0), G (40, 10), B (50, 20), plus g.
  const float want[2][6] = {{31, 1, 41, 11, 51, 21}, {32, 2, 42, 12, 52, 22}};
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 6; ++k) {
      EXPECT_FLOAT_EQ(t.data_as<float>()[i * 6 + k], want[i][k] / 255) << i << " " << k;
    }
  }
  EXPECT_THAT(Values(*sink.batches.at(0)), ElementsAre(1, 2));
  ASSERT_FALSE(sink.batches.at(1).ok());
  EXPECT_EQ(sink.batches.at(1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sink.batches.at(1).status().message(), HasSubstr("record 4: op 1 (Normalize)"));
}

TEST(BatchAssembler, ClearFreesPartialBatchesAndPendingItems) {
  Sink sink;
  auto a = Make(&sink, /*batch_size=*/4);
  a->Add(0, Elem(0, &sink.live));
  a->Add(2, Elem(2, &sink.live));  // pending: 1 is missing
  EXPECT_GT(sink.live.live(), 0);
  a->Clear();
  EXPECT_EQ(sink.live.live(), 0);
  EXPECT_TRUE(sink.batches.empty());
}

TEST(BatchAssembler, ReserveWaitsForCommitsAndStopsOnCancel) {
  Sink sink;
  auto a = Make(&sink, /*batch_size=*/2, false, /*window=*/2);
  ASSERT_TRUE(a->Reserve());
  ASSERT_TRUE(a->Reserve());
  bool got = false;
  std::thread t([&] { got = a->Reserve(); });
  a->Add(0, Elem(0, &sink.live));  // commits seq 0: room for one more
  t.join();
  EXPECT_TRUE(got);
  std::thread c([&] { got = a->Reserve(); });
  a->Cancel();
  c.join();
  EXPECT_FALSE(got);
}

TEST(BatchAssembler, TryReserveNeverWaits) {
  Sink sink;
  auto a = Make(&sink, /*batch_size=*/2, false, /*window=*/2);
  ASSERT_TRUE(a->TryReserve());
  ASSERT_TRUE(a->TryReserve());
  EXPECT_FALSE(a->TryReserve());  // the window is full
  a->Add(0, Elem(0, &sink.live));
  EXPECT_TRUE(a->TryReserve());
  a->Cancel();
  EXPECT_FALSE(a->TryReserve());
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
