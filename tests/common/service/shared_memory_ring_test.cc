// The shared-memory ring between a client and a worker on one host, both sides in this process
// (the file, the mapping and pwritev are the same across processes): exact bytes and positions,
// laps that never wrap, a full ring that refuses instead of waiting, a replaced stream fenced
// off, and offers that are not the caller's ring refused with the reason.
#include "common/service/shared_memory_ring.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::service {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

ColumnBytes Bytes(const std::shared_ptr<std::string>& s) {
  return {reinterpret_cast<const uint8_t*>(s->data()), s->size(), s};
}

std::shared_ptr<std::string> Filled(size_t n, char c) {
  return std::make_shared<std::string>(n, c);
}

std::string Text(absl::Span<const uint8_t> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

bool Exists(const std::string& name) { return std::filesystem::exists("/dev/shm/" + name); }

struct Pair {
  std::unique_ptr<SharedMemoryRing> ring;
  std::shared_ptr<SharedMemoryRingWriter> writer;
};

Pair Open(uint64_t capacity, SharedMemoryRingWriters& writers, uint64_t stream = 1) {
  absl::StatusOr<std::unique_ptr<SharedMemoryRing>> ring = SharedMemoryRing::Create(capacity);
  EXPECT_TRUE(ring.ok()) << ring.status();
  absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> writer =
      writers.Claim((*ring)->offer(), stream);
  EXPECT_TRUE(writer.ok()) << writer.status();
  return {*std::move(ring), *std::move(writer)};
}

TEST(SharedMemoryRingTest, ColumnsAreWrittenBackToBackAndReadInPlace) {
  SharedMemoryRingWriters writers;
  Pair p = Open(kMiB, writers);
  const std::string name = p.ring->offer().name();
  EXPECT_TRUE(Exists(name));
  EXPECT_EQ(p.ring->offer().token().size(), 32u);
  const std::vector<ColumnBytes> columns = {Bytes(std::make_shared<std::string>("abcdef")),
                                            Bytes(std::make_shared<std::string>("")),
                                            Bytes(std::make_shared<std::string>("0123456789"))};
  std::optional<proto::SharedMemorySpan> span = p.writer->Write(1, columns);
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->position(), 0u);
  EXPECT_EQ(span->length(), 16u);
  absl::StatusOr<absl::Span<const uint8_t>> read = p.ring->Read(*span);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(Text(*read), "abcdef0123456789");
  p.ring->Release(*span);
  span = p.writer->Write(1, {Bytes(std::make_shared<std::string>("xyz"))});
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->position(), 16u);
  EXPECT_EQ(Text(*p.ring->Read(*span)), "xyz");
  // The client's end removes the file.
  p.ring.reset();
  EXPECT_FALSE(Exists(name));
}

TEST(SharedMemoryRingTest, ABatchNeverWrapsAndAFullRingRefusesAtOnce) {
  SharedMemoryRingWriters writers;
  Pair p = Open(kMiB, writers);
  const auto a = Filled(600 * 1024, 'a');
  const auto b = Filled(600 * 1024, 'b');
  std::optional<proto::SharedMemorySpan> first = p.writer->Write(1, {Bytes(a)});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->position(), 0u);
  // The second would have to start in the next lap, over the first, which is not released.
  EXPECT_FALSE(p.writer->Write(1, {Bytes(b)}).has_value());
  p.ring->Release(*first);
  std::optional<proto::SharedMemorySpan> second = p.writer->Write(1, {Bytes(b)});
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->position(), kMiB);  // the rest of lap 0 skipped
  absl::StatusOr<absl::Span<const uint8_t>> read = p.ring->Read(*second);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(Text(*read), *b);
  // More than the whole ring never fits.
  EXPECT_FALSE(p.writer->Write(1, {Bytes(Filled(kMiB + 1, 'c'))}).has_value());
}

TEST(SharedMemoryRingTest, ANewStreamFencesTheOldOneAndFreesWhatItLeftUnread) {
  SharedMemoryRingWriters writers;
  Pair p = Open(kMiB, writers, /*stream=*/7);
  const auto a = Filled(700 * 1024, 'a');
  ASSERT_TRUE(p.writer->Write(7, {Bytes(a)}).has_value());  // in flight, never read
  absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> again = writers.Claim(p.ring->offer(), 8);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), p.writer.get());  // the same ring, continued
  EXPECT_FALSE(p.writer->Write(7, {Bytes(a)}).has_value());
  std::optional<proto::SharedMemorySpan> span =
      p.writer->Write(8, {Bytes(Filled(700 * 1024, 'b'))});
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->position(), kMiB);
  EXPECT_EQ(Text(*p.ring->Read(*span)), std::string(700 * 1024, 'b'));
}

TEST(SharedMemoryRingTest, AWorkerThatReopensTheRingStartsWhereTheClientReleased) {
  SharedMemoryRingWriters writers;
  Pair p = Open(kMiB, writers);
  std::optional<proto::SharedMemorySpan> span =
      p.writer->Write(1, {Bytes(std::make_shared<std::string>("hello"))});
  ASSERT_TRUE(span.has_value());
  p.ring->Release(*span);
  p.writer.reset();  // its last stream ended: closed
  SharedMemoryRingWriters restarted;
  absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> writer =
      restarted.Claim(p.ring->offer(), 1);
  ASSERT_TRUE(writer.ok()) << writer.status();
  span = (*writer)->Write(1, {Bytes(std::make_shared<std::string>("world"))});
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->position(), 5u);
  EXPECT_EQ(Text(*p.ring->Read(*span)), "world");
}

TEST(SharedMemoryRingTest, SpansOutsideTheRingAreDataLoss) {
  SharedMemoryRingWriters writers;
  Pair p = Open(kMiB, writers);
  proto::SharedMemorySpan span;
  span.set_position(kMiB - 4);
  span.set_length(8);  // would wrap
  EXPECT_EQ(p.ring->Read(span).status(),
            absl::DataLossError(
                absl::StrCat("the batch's shared-memory span [1048572, +8) is not in the ring ",
                             p.ring->offer().name(), " (1048576 bytes, released up to 0)")));
  span.set_position(100);
  span.set_length(10);
  ASSERT_TRUE(p.ring->Read(span).ok());
  p.ring->Release(span);
  span.set_position(0);  // before what was released
  EXPECT_EQ(p.ring->Read(span).status().code(), absl::StatusCode::kDataLoss);
  span.set_position(UINT64_MAX - 2);
  span.set_length(10);
  EXPECT_EQ(p.ring->Read(span).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SharedMemoryRingTest, OffersThatAreNotTheCallersRingAreRefused) {
  SharedMemoryRingWriters writers;
  absl::StatusOr<std::unique_ptr<SharedMemoryRing>> ring = SharedMemoryRing::Create(kMiB);
  ASSERT_TRUE(ring.ok()) << ring.status();
  proto::SharedMemoryOffer offer = (*ring)->offer();

  proto::SharedMemoryOffer bad = offer;
  bad.set_name("../../etc/passwd");
  EXPECT_EQ(
      writers.Claim(bad, 1).status(),
      absl::InvalidArgumentError(
          "shared-memory ring name \"../../etc/passwd\" is not sluice-<pid>-<32 hex digits>"));
  bad.set_name("sluice-1-0123456789abcdef0123456789abcdeF");
  EXPECT_EQ(writers.Claim(bad, 1).status().code(), absl::StatusCode::kInvalidArgument);

  bad.set_name("sluice-1-00000000000000000000000000000000");  // not on this host
  EXPECT_EQ(writers.Claim(bad, 1).status(),
            absl::NotFoundError("shared-memory ring /dev/shm/sluice-1-"
                                "00000000000000000000000000000000: No such file or directory"));

  bad = offer;
  bad.set_token(std::string(32, 'x'));
  EXPECT_EQ(writers.Claim(bad, 1).status(),
            absl::PermissionDeniedError(absl::StrCat("shared-memory ring /dev/shm/", offer.name(),
                                                     ": the token does not match")));
  // Once the ring is open, another token for its name is refused as well.
  ASSERT_TRUE(writers.Claim(offer, 1).ok());
  EXPECT_EQ(writers.Claim(bad, 2).status().code(), absl::StatusCode::kPermissionDenied);

  // A file of the right name that is not a ring.
  const std::string name = absl::StrCat("sluice-", getpid(), "-ffffffffffffffffffffffffffffffff");
  const int fd = shm_open(("/" + name).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  close(fd);
  bad.set_name(name);
  EXPECT_EQ(writers.Claim(bad, 3).status(),
            absl::FailedPreconditionError(absl::StrCat(
                "/dev/shm/", name, " is not a sluice shared-memory ring of its size")));
  shm_unlink(("/" + name).c_str());
}

TEST(SharedMemoryRingTest, ARingOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the file to another user";
  absl::StatusOr<std::unique_ptr<SharedMemoryRing>> ring = SharedMemoryRing::Create(kMiB);
  ASSERT_TRUE(ring.ok()) << ring.status();
  const std::string path = "/dev/shm/" + (*ring)->offer().name();
  ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
  SharedMemoryRingWriters writers;
  EXPECT_EQ(writers.Claim((*ring)->offer(), 1).status(),
            absl::PermissionDeniedError(absl::StrCat(
                "shared-memory ring ", path, " belongs to uid 65534, not this worker's 0")));
}

TEST(SharedMemoryRingTest, SizesOutsideTheLimitsAreRefused) {
  EXPECT_EQ(SharedMemoryRing::Create(kMiB - 1).status(),
            absl::InvalidArgumentError("a shared-memory ring of 1048575 bytes: must be between "
                                       "1048576 and 17179869184"));
  EXPECT_EQ(SharedMemoryRing::Create((uint64_t{16} << 30) + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedMemoryRingTest, RingsThatNoClientHoldsAreRemovedOnceTheyAreAMinuteOld) {
  // A ring of a killed client (no lock, old), a live one (locked, old), one being made (no lock
  // yet, new).
  const std::string orphan = "sluice-99-0123456789abcdef0123456789abcdef";
  const std::string held = "sluice-98-0123456789abcdef0123456789abcdef";
  const std::string fresh = "sluice-97-0123456789abcdef0123456789abcdef";
  int held_fd = -1;
  for (const std::string& name : {orphan, held, fresh}) {
    const int fd = shm_open(("/" + name).c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    if (name != fresh) {
      const timespec old[2] = {{time(nullptr) - 120, 0}, {time(nullptr) - 120, 0}};
      ASSERT_EQ(futimens(fd, old), 0);
    }
    if (name == held) {
      ASSERT_EQ(flock(fd, LOCK_SH), 0);
      held_fd = fd;
    } else {
      close(fd);
    }
  }
  absl::StatusOr<std::unique_ptr<SharedMemoryRing>> ring = SharedMemoryRing::Create(kMiB);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_FALSE(Exists(orphan));
  EXPECT_TRUE(Exists(held));
  EXPECT_TRUE(Exists(fresh));
  // A live ring holds its lock: another client's clean-up leaves it, however old.
  const std::string path = "/dev/shm/" + (*ring)->offer().name();
  const timespec old[2] = {{time(nullptr) - 120, 0}, {time(nullptr) - 120, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), old, 0), 0);
  ASSERT_TRUE(SharedMemoryRing::Create(kMiB).ok());
  EXPECT_TRUE(Exists((*ring)->offer().name()));
  close(held_fd);
  shm_unlink(("/" + held).c_str());
  shm_unlink(("/" + fresh).c_str());
}

}  // namespace
}  // namespace sluice::service
