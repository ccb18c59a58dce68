// Batches through shared memory when a trainer and a worker share a host (docs/architecture.md,
// "Co-located trainers and workers"). Over loopback TCP a batch's bytes are copied into the
// kernel, through the TCP stack and out again on the other side; through a ring they are written
// once by the worker and read in place by the client, and the gRPC stream carries only headers.
//
// The client owns the ring: a file in /dev/shm (shm_open), 0600, named sluice-<pid>-<32 hex>,
// created per worker connection and unlinked when the connection ends; it holds a shared flock on
// it meanwhile, so that the next client to start on the host removes a ring whose client was
// killed (no lock held, older than a minute), in any pid namespace. It offers {name, token} in
// its GetBatchesRequest; a worker that can open the file, owns it under the same uid and finds
// the token in it writes each batch's column bytes there and sends a header whose
// SharedMemorySpan says where. Anything else (another host, another container's /dev/shm, another
// user, a full /dev/shm) leaves the batches on the stream, as before. Nothing is ever waited for:
// a batch that does not fit goes on the stream.
//
//   file = [control page, kControlBytes][data: capacity bytes]
//   control page = magic "sluice-ring-v1\0\0" (16) | capacity u64 | token (32) | released u64
//
// Positions count bytes written since the ring was created; position p lies at data offset
// p % capacity, and a batch never wraps (the writer skips to the next lap). The client reads the
// frames of a stream in order and, once a batch is copied or finished out of the ring, stores
// `released` = its span's end (release order): the writer reuses only what lies before it. When a
// stream is replaced (a reopen), the frames the old one had in flight are never read: the new
// stream claims the ring and everything written before is free.
#ifndef SLUICE_COMMON_SERVICE_SHARED_MEMORY_RING_H_
#define SLUICE_COMMON_SERVICE_SHARED_MEMORY_RING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/service/wire_batch.h"
#include "proto/worker_service.pb.h"

namespace sluice::service {

inline constexpr size_t kControlBytes = 4096;
inline constexpr uint64_t kMinRingBytes = uint64_t{1} << 20;   // 1 MiB
inline constexpr uint64_t kMaxRingBytes = uint64_t{16} << 30;  // 16 GiB

// The client's side: creates the file, maps it, reads spans in place and releases them.
// Thread-compatible (one reader thread per worker connection).
class SharedMemoryRing {
 public:
  // A new ring of `capacity` data bytes (kMinRingBytes..kMaxRingBytes; pages are taken from
  // /dev/shm as batches first touch them), or of an eighth of what /dev/shm has free if that is
  // less. Unavailable naming the file when /dev/shm cannot hold it, or when that eighth is below
  // kMinRingBytes. First removes the rings in /dev/shm that no live client holds.
  static absl::StatusOr<std::unique_ptr<SharedMemoryRing>> Create(uint64_t capacity);
  ~SharedMemoryRing();  // unmaps and unlinks
  SharedMemoryRing(const SharedMemoryRing&) = delete;
  SharedMemoryRing& operator=(const SharedMemoryRing&) = delete;

  // What the GetBatchesRequest carries.
  const proto::SharedMemoryOffer& offer() const { return offer_; }

  // The bytes `span` names, valid until Release(span). DataLoss naming the span when it lies
  // outside the ring, wraps, or starts before what was already released.
  absl::StatusOr<absl::Span<const uint8_t>> Read(const proto::SharedMemorySpan& span) const;
  // The writer may reuse everything up to the span's end. REQUIRES: Read(span) succeeded.
  void Release(const proto::SharedMemorySpan& span);

 private:
  SharedMemoryRing(proto::SharedMemoryOffer offer, int fd, uint64_t capacity, uint8_t* map);

  const proto::SharedMemoryOffer offer_;
  const int fd_;  // holds a shared flock: the ring is in use
  const uint64_t capacity_;
  uint8_t* const map_;  // kControlBytes + capacity_, read-write
  uint64_t released_ = 0;
};

// The worker's side of one ring: the file opened and mapped. In the ring's first lap column bytes
// are written through the file (pwritev), so that a /dev/shm too full to give a page is an error
// (ENOSPC), not a SIGBUS; after it, when every page exists, the whole ring is mapped in one call
// (MADV_POPULATE_WRITE) and batches are copied into the mapping, without the file's per-page
// work. Only a file of the worker's uid is used (a process that could shrink it under the worker
// could also kill it). Thread-safe.
class SharedMemoryRingWriter {
 public:
  // Opens the offered ring. InvalidArgument for a malformed name; NotFound when the file is
  // not visible here (another host or container); PermissionDenied when it is owned by another
  // user or its token differs; FailedPrecondition for a file that is not a ring of its size.
  static absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> Open(
      const proto::SharedMemoryOffer& offer);
  ~SharedMemoryRingWriter();
  SharedMemoryRingWriter(const SharedMemoryRingWriter&) = delete;
  SharedMemoryRingWriter& operator=(const SharedMemoryRingWriter&) = delete;

  // Stream `stream` takes the ring over: what was written before is free (its frames are lost
  // with the old stream), and the old stream's writes are refused from now on.
  void Claim(uint64_t stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `columns` back to back for stream `stream` and returns where, or nullopt when they do
  // not fit in what the client released, the stream no longer owns the ring, or /dev/shm is
  // full (after which the ring is not used again).
  std::optional<proto::SharedMemorySpan> Write(uint64_t stream,
                                               absl::Span<const ColumnBytes> columns)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& token() const { return token_; }

 private:
  SharedMemoryRingWriter(int fd, uint8_t* map, uint64_t capacity, std::string token);
  uint64_t ReleasedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;
  uint8_t* const map_;  // kControlBytes + capacity_
  const uint64_t capacity_;
  const std::string token_;
  absl::Mutex mu_;
  uint64_t owner_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t floor_ ABSL_GUARDED_BY(mu_) = 0;  // free below this whatever `released` says
  bool populate_tried_ ABSL_GUARDED_BY(mu_) = false;
  bool populated_ ABSL_GUARDED_BY(mu_) = false;  // every page mapped: copy into map_
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

// The worker's open rings by name, so that a client's next stream continues its ring. A ring
// is closed when its last stream ends. Thread-safe.
class SharedMemoryRingWriters {
 public:
  // The ring `offer` names, claimed by `stream` (opened if no stream holds it now).
  // PermissionDenied when a ring of that name is open with another token; Open()'s errors.
  absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> Claim(
      const proto::SharedMemoryOffer& offer, uint64_t stream) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::weak_ptr<SharedMemoryRingWriter>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_SHARED_MEMORY_RING_H_
