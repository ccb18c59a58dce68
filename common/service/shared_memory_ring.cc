#include "common/service/shared_memory_ring.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace sluice::service {
namespace {

// The control page.
constexpr char kMagic[16] = "sluice-ring-v1";
constexpr size_t kCapacityAt = 16;
constexpr size_t kTokenAt = 24;
constexpr size_t kTokenBytes = 32;
constexpr size_t kReleasedAt = 56;
constexpr absl::string_view kPrefix = "sluice-";

std::string ErrnoText(int error) { return std::strerror(error); }

// sluice-<pid>-<32 hex digits>.
bool IsRingName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kPrefix)) return false;
  const size_t dash = name.find('-');
  if (dash == absl::string_view::npos || dash == 0 || dash > 10 || name.size() - dash - 1 != 32) {
    return false;
  }
  for (char c : name.substr(0, dash)) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  for (char c : name.substr(dash + 1)) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
  }
  return true;
}

// Removes the rings whose client is gone (killed before it could unlink): a live client holds a
// shared flock on its ring for the ring's life, whatever pid namespace it runs in. A ring made
// in the last minute may not be locked yet, and is left alone.
void RemoveOrphans() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const time_t recent = time(nullptr) - 60;
  while (const dirent* entry = readdir(dir)) {
    if (!IsRingName(entry->d_name)) continue;
    const std::string path = absl::StrCat("/", entry->d_name);
    const int fd = shm_open(path.c_str(), O_RDONLY, 0);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_mtime < recent && flock(fd, LOCK_EX | LOCK_NB) == 0) {
      shm_unlink(path.c_str());
    }
    close(fd);
  }
  closedir(dir);
}

std::string RandomBytes(size_t n) {
  std::random_device random;  // /dev/urandom
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(random() & 0xff);
  return out;
}

proto::SharedMemorySpan Span(uint64_t position, uint64_t length) {
  proto::SharedMemorySpan span;
  span.set_position(position);
  span.set_length(length);
  return span;
}

uint64_t LoadU64(const uint8_t* at) {
  uint64_t v;
  std::memcpy(&v, at, sizeof(v));
  return v;
}

}  // namespace

SharedMemoryRing::SharedMemoryRing(proto::SharedMemoryOffer offer, int fd, uint64_t capacity,
                                   uint8_t* map)
    : offer_(std::move(offer)), fd_(fd), capacity_(capacity), map_(map) {}

absl::StatusOr<std::unique_ptr<SharedMemoryRing>> SharedMemoryRing::Create(uint64_t capacity) {
  if (capacity < kMinRingBytes || capacity > kMaxRingBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a shared-memory ring of ", capacity,
                                                   " bytes: must be between ", kMinRingBytes,
                                                   " and ", kMaxRingBytes));
  }
  RemoveOrphans();
  // /dev/shm is shared with everything else on the host that uses it (a multi-process PyTorch
  // DataLoader moves its batches through it, and a container's is often 64 MB): a ring takes at
  // most an eighth of what is free, or is not made.
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) == 0) {
    const uint64_t share = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize / 8;
    if (share < kMinRingBytes) {
      return absl::UnavailableError(
          absl::StrCat("/dev/shm has ", static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize,
                       " bytes free; a shared-memory ring takes at most an eighth of that, and ",
                       share, " is below ", kMinRingBytes));
    }
    capacity = std::min(capacity, share);
  }
  std::string hex;
  for (char c : RandomBytes(16))
    absl::StrAppend(&hex, absl::Hex(static_cast<uint8_t>(c), absl::kZeroPad2));
  proto::SharedMemoryOffer offer;
  offer.set_name(absl::StrCat(kPrefix, getpid(), "-", hex));
  offer.set_token(RandomBytes(kTokenBytes));
  const std::string path = absl::StrCat("/", offer.name());
  const int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create the shared-memory ring /dev/shm",
                                               path, ": ", ErrnoText(errno)));
  }
  flock(fd, LOCK_SH);  // "in use", for RemoveOrphans() of other clients
  const size_t size = kControlBytes + capacity;
  void* map = MAP_FAILED;
  int error = 0;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    error = errno;
  } else {
    map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) error = errno;
  }
  if (map == MAP_FAILED) {
    close(fd);
    shm_unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("cannot size the shared-memory ring /dev/shm", path,
                                               " to ", size, " bytes: ", ErrnoText(error)));
  }
  auto* bytes = static_cast<uint8_t*>(map);
  std::memcpy(bytes, kMagic, sizeof(kMagic));
  std::memcpy(bytes + kCapacityAt, &capacity, sizeof(capacity));
  std::memcpy(bytes + kTokenAt, offer.token().data(), kTokenBytes);
  return std::unique_ptr<SharedMemoryRing>(
      new SharedMemoryRing(std::move(offer), fd, capacity, bytes));
}

SharedMemoryRing::~SharedMemoryRing() {
  munmap(map_, kControlBytes + capacity_);
  shm_unlink(absl::StrCat("/", offer_.name()).c_str());
  close(fd_);
}

absl::StatusOr<absl::Span<const uint8_t>> SharedMemoryRing::Read(
    const proto::SharedMemorySpan& span) const {
  const uint64_t position = span.position();
  const uint64_t length = span.length();
  if (position < released_ || length > capacity_ || position % capacity_ + length > capacity_) {
    return absl::DataLossError(absl::StrCat("the batch's shared-memory span [", position, ", +",
                                            length, ") is not in the ring ", offer_.name(), " (",
                                            capacity_, " bytes, released up to ", released_, ")"));
  }
  return absl::Span<const uint8_t>(map_ + kControlBytes + position % capacity_, length);
}

void SharedMemoryRing::Release(const proto::SharedMemorySpan& span) {
  released_ = span.position() + span.length();
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(map_ + kReleasedAt))
      .store(released_, std::memory_order_release);
}

SharedMemoryRingWriter::SharedMemoryRingWriter(int fd, uint8_t* map, uint64_t capacity,
                                               std::string token)
    : fd_(fd), map_(map), capacity_(capacity), token_(std::move(token)) {
  absl::MutexLock lock(&mu_);
  written_ = floor_ = ReleasedLocked();
}

absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> SharedMemoryRingWriter::Open(
    const proto::SharedMemoryOffer& offer) {
  if (!IsRingName(offer.name())) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory ring name \"",
                                                   absl::CHexEscape(offer.name().substr(0, 64)),
                                                   "\" is not sluice-<pid>-<32 hex digits>"));
  }
  const std::string path = absl::StrCat("/", offer.name());
  const int fd = shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int error = errno;
    const std::string what =
        absl::StrCat("shared-memory ring /dev/shm", path, ": ", ErrnoText(error));
    if (error == ENOENT) return absl::NotFoundError(what);
    if (error == EACCES) return absl::PermissionDeniedError(what);
    return absl::UnavailableError(what);
  }
  struct stat st;
  const uint8_t* control = nullptr;
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = absl::UnavailableError(
        absl::StrCat("shared-memory ring /dev/shm", path, ": ", ErrnoText(errno)));
  } else if (!S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(kControlBytes)) {
    status = absl::FailedPreconditionError(
        absl::StrCat("/dev/shm", path, " is not a sluice shared-memory ring"));
  } else if (st.st_uid != geteuid()) {
    status = absl::PermissionDeniedError(absl::StrCat("shared-memory ring /dev/shm", path,
                                                      " belongs to uid ", st.st_uid,
                                                      ", not this worker's ", geteuid()));
  } else {
    void* map =
        mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      status = absl::UnavailableError(
          absl::StrCat("cannot map shared-memory ring /dev/shm", path, ": ", ErrnoText(errno)));
    } else {
      control = static_cast<const uint8_t*>(map);
    }
  }
  uint64_t capacity = 0;
  if (status.ok()) {
    capacity = LoadU64(control + kCapacityAt);
    if (std::memcmp(control, kMagic, sizeof(kMagic)) != 0 || capacity < kMinRingBytes ||
        capacity > kMaxRingBytes || static_cast<uint64_t>(st.st_size) != kControlBytes + capacity) {
      status = absl::FailedPreconditionError(
          absl::StrCat("/dev/shm", path, " is not a sluice shared-memory ring of its size"));
    } else if (offer.token().size() != kTokenBytes ||
               std::memcmp(control + kTokenAt, offer.token().data(), kTokenBytes) != 0) {
      status = absl::PermissionDeniedError(
          absl::StrCat("shared-memory ring /dev/shm", path, ": the token does not match"));
    }
  }
  if (!status.ok()) {
    if (control != nullptr) munmap(const_cast<uint8_t*>(control), static_cast<size_t>(st.st_size));
    close(fd);
    return status;
  }
  return std::shared_ptr<SharedMemoryRingWriter>(
      new SharedMemoryRingWriter(fd, const_cast<uint8_t*>(control), capacity, offer.token()));
}

SharedMemoryRingWriter::~SharedMemoryRingWriter() {
  munmap(map_, kControlBytes + capacity_);
  close(fd_);
}

uint64_t SharedMemoryRingWriter::ReleasedLocked() const {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(map_ + kReleasedAt))
      .load(std::memory_order_acquire);
}

void SharedMemoryRingWriter::Claim(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  owner_ = stream;
  floor_ = written_;
}

std::optional<proto::SharedMemorySpan> SharedMemoryRingWriter::Write(
    uint64_t stream, absl::Span<const ColumnBytes> columns) {
  uint64_t length = 0;
  std::vector<iovec> parts;
  parts.reserve(columns.size());
  for (const ColumnBytes& c : columns) {
    if (c.size == 0) continue;
    length += c.size;
    parts.push_back({const_cast<uint8_t*>(c.data), c.size});
  }
  absl::MutexLock lock(&mu_);
  if (broken_ || owner_ != stream || length == 0 || length > capacity_) return std::nullopt;
  uint64_t position = written_;
  if (position % capacity_ + length > capacity_) position += capacity_ - position % capacity_;
  // The client releases in order; a value outside [floor, written] is not believed.
  const uint64_t free_from = std::max(floor_, std::min(ReleasedLocked(), written_));
  if (position + length - free_from > capacity_) return std::nullopt;
  if (!populate_tried_ && position >= capacity_) {
    // A lap is done: the ring's pages exist. Map them all at once (one call, where a store into
    // each would fault it in) and copy into the mapping from now on; if that fails (an old
    // kernel, or no page for a tail the first lap skipped), go on through the file.
    populate_tried_ = true;
    populated_ = madvise(map_ + kControlBytes, capacity_, MADV_POPULATE_WRITE) == 0;
  }
  if (populated_) {
    uint8_t* to = map_ + kControlBytes + position % capacity_;
    for (const iovec& part : parts) {
      std::memcpy(to, part.iov_base, part.iov_len);
      to += part.iov_len;
    }
    written_ = position + length;
    return Span(position, length);
  }
  off_t at = static_cast<off_t>(kControlBytes + position % capacity_);
  size_t first = 0;
  while (first < parts.size()) {
    const ssize_t n =
        pwritev(fd_, parts.data() + first,
                static_cast<int>(std::min<size_t>(parts.size() - first, IOV_MAX)), at);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      broken_ = true;  // ENOSPC: /dev/shm is full; the stream carries the batches from now on
      return std::nullopt;
    }
    at += n;
    for (size_t left = static_cast<size_t>(n); left > 0;) {
      iovec& part = parts[first];
      const size_t take = std::min(left, part.iov_len);
      part.iov_base = static_cast<uint8_t*>(part.iov_base) + take;
      part.iov_len -= take;
      left -= take;
      if (part.iov_len == 0) ++first;
    }
  }
  written_ = position + length;
  return Span(position, length);
}

absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> SharedMemoryRingWriters::Claim(
    const proto::SharedMemoryOffer& offer, uint64_t stream) {
  absl::MutexLock lock(&mu_);
  for (auto it = open_.begin(); it != open_.end();) {
    it = it->second.expired() ? open_.erase(it) : std::next(it);
  }
  std::shared_ptr<SharedMemoryRingWriter> ring;
  if (auto it = open_.find(offer.name()); it != open_.end()) ring = it->second.lock();
  if (ring != nullptr && ring->token() != offer.token()) {
    return absl::PermissionDeniedError(
        absl::StrCat("shared-memory ring /dev/shm/", offer.name(), ": the token does not match"));
  }
  if (ring == nullptr) {
    absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> opened =
        SharedMemoryRingWriter::Open(offer);
    if (!opened.ok()) return opened.status();
    ring = *std::move(opened);
    open_[offer.name()] = ring;
  }
  ring->Claim(stream);
  return ring;
}

}  // namespace sluice::service
