#include "client/internal/buffer_pool.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::client {
namespace {

TEST(BufferPool, AFreedBufferOfTheSameSizeIsHandedOutAgain) {
  std::shared_ptr<BufferPool> pool = BufferPool::Create(/*max_free=*/2);
  std::shared_ptr<uint8_t[]> a = pool->Get(1000);
  uint8_t* const address = a.get();
  std::memset(a.get(), 7, 1000);
  std::shared_ptr<void> owner = a;  // as a Column holds it
  a.reset();
  EXPECT_EQ(pool->free_buffers(), 0u);  // still owned
  owner.reset();
  EXPECT_EQ(pool->free_buffers(), 1u);
  EXPECT_EQ(pool->Get(999).get() == address, false);  // other size: a new one
  std::shared_ptr<uint8_t[]> b = pool->Get(1000);
  EXPECT_EQ(b.get(), address);
  EXPECT_EQ(pool->reused(), 1u);
}

TEST(BufferPool, KeepsAtMostMaxFreeAndBuffersOutliveThePool) {
  std::shared_ptr<BufferPool> pool = BufferPool::Create(/*max_free=*/2);
  std::vector<std::shared_ptr<uint8_t[]>> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool->Get(64));
  held.clear();
  EXPECT_EQ(pool->free_buffers(), 2u);
  std::shared_ptr<uint8_t[]> survivor = pool->Get(64);
  pool.reset();
  survivor[63] = 1;  // still valid; freed (not pooled) when dropped
  survivor.reset();
}

TEST(BufferPool, ConcurrentGetAndReleaseReuseWithoutLoss) {
  std::shared_ptr<BufferPool> pool = BufferPool::Create(/*max_free=*/4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 1000; ++i) {
        std::shared_ptr<uint8_t[]> b = pool->Get(4096);
        b[0] = static_cast<uint8_t>(t);
        b[4095] = static_cast<uint8_t>(i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(pool->free_buffers(), 4u);
  EXPECT_GT(pool->reused(), 3000u);
}

}  // namespace
}  // namespace sluice::client
