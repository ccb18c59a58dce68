// Heap allocations on the executor's hot path, counted by replacing the global
// operator new in this test binary: after a warm-up run, a run of small records
// (label int64 + feature float32[16], batched by 64) allocates per batch only,
// nothing per element (docs/engine.md, "Element recycling").
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "data_worker/pipeline/executor.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace {

std::atomic<int64_t> g_allocations{0};

void* Allocate(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

void* AllocateAligned(std::size_t n, std::align_val_t align) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t n) { return Allocate(n); }
void* operator new[](std::size_t n) { return Allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new(std::size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace sluice::data_worker::pipeline {
namespace {

constexpr int kBatch = 64;

// Writes `n` records of label (int64, i % 10) and feature (float32[16]).
void MakeSmallRecords(const std::string& dir, int n) {
  record::Schema schema;
  schema.columns.push_back({"label", record::DType::kInt64, {}, true});
  schema.columns.push_back({"feature", record::DType::kFloat32, {16}, false});
  auto w = record::DatasetWriter::Create(dir, schema, {});
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> feature(16);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 16; ++k) feature[k] = static_cast<float>(i + k);
    ASSERT_TRUE(
        (*w)->Add({record::Tensor::Int64(i % 10), record::Tensor::Of<float>({16}, feature)}).ok());
  }
  ASSERT_TRUE((*w)->Finish().ok());
}

// Submits one run of records [0, n) and reads its outputs; returns the heap
// allocations made meanwhile (by every thread), or -1 on an error.
int64_t AllocationsOfRun(Executor& ex, int n, uint64_t epoch) {
  std::vector<uint64_t> ids(n);
  std::iota(ids.begin(), ids.end(), uint64_t{0});
  const int64_t before = g_allocations.load();
  if (!ex.Submit(std::move(ids), epoch).ok()) return -1;
  int batches = 0;
  while (true) {
    absl::StatusOr<std::optional<Element>> next = ex.Next();
    if (!next.ok()) return -1;
    if (!next->has_value()) break;
    ++batches;
  }
  if (batches != (n + kBatch - 1) / kBatch) return -1;
  return g_allocations.load() - before;
}

TEST(HotPathAllocation, AFullPipelineRunAllocatesPerBatchNotPerElement) {
  sluice::testing::TempDir dir;
  MakeSmallRecords(dir.Join("ds"), 40 * kBatch);
  auto spec =
      sluice::pipeline_spec::ParsePipelineSpec(absl::StrReplaceAll(R"(
seed: 0
source: {dataset: {path: DIR}, columns: [label, feature]}
nodes:
  - batch: {size: 64}
)",
                                                                   {{"DIR", dir.Join("ds")}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExecutorOptions options;
  options.cpu_budget = 1;
  options.autotune = false;
  auto ex = Executor::Create(*spec, options);
  ASSERT_TRUE(ex.ok()) << ex.status();
  ASSERT_TRUE((*ex)->Open().ok());
  // Warm-up: the recycled elements, tensors and reorder-buffer nodes reach their steady number.
  ASSERT_GE(AllocationsOfRun(**ex, 10 * kBatch, /*epoch=*/0), 0);
  // Ten batches each time; the last one short (1 element), full, then twenty batches.
  const int64_t short_last = AllocationsOfRun(**ex, 9 * kBatch + 1, /*epoch=*/0);
  const int64_t full = AllocationsOfRun(**ex, 10 * kBatch, /*epoch=*/0);
  const int64_t twenty = AllocationsOfRun(**ex, 20 * kBatch, /*epoch=*/0);
  ASSERT_GE(short_last, 0);
  ASSERT_GE(full, 0);
  ASSERT_GE(twenty, 0);
  // 63 more elements in the same batches: not one more allocation.
  EXPECT_EQ(full - short_last, 0);
  // Ten more batches: a batch's buffers, its output element and queue entry, ... (15 today).
  EXPECT_EQ((twenty - full) % 10, 0) << twenty - full;
  EXPECT_LE(twenty - full, 10 * 16) << "allocations per batch of 64 elements, times 10";
  (*ex)->Stop();
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
