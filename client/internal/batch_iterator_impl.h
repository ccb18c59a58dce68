// BatchIteratorImpl: the BatchIterator behind DataServiceClient::Open.
//
// Threads (all owned here, joined by the destructor):
//   - the caller's: GetNext() takes released batches out of the IteratorState;
//   - the heartbeat thread: ClientHeartbeat every heartbeat_interval (sooner
//     when the consumer completed its epoch) with the cumulative progress;
//     applies the answer (epoch, split sequence, done positions, finished) and
//     starts a reader for every listed worker address that has none;
//   - one reader thread per worker address: a GetBatches stream (no deadline;
//     cancelled with ClientContext::TryCancel on destruction) whose batches it
//     hands to the IteratorState, waiting while the buffer is full (so gRPC
//     flow control stops the worker). When the stream ends it reopens it while
//     the address is still listed: after the next heartbeat when it ended OK,
//     after a backoff for UNAVAILABLE / NOT_FOUND (and other transient codes).
//     A stream error INVALID_ARGUMENT, PERMISSION_DENIED, DATA_LOSS,
//     FAILED_PRECONDITION or UNIMPLEMENTED becomes the iterator's error,
//     prefixed with the worker address.
// One mutex guards everything; one CondVar is signalled on every change.
//
// Size: batch_iterator_impl.cc is ~690 lines because these three threads share
// one mutex and one state; split into files they would share it across them.
// Frame decoding and finishing live in common/service/ and
// common/tensor_kernels/, progress and order in iterator_state.h.
#ifndef SLUICE_CLIENT_INTERNAL_BATCH_ITERATOR_IMPL_H_
#define SLUICE_CLIENT_INTERNAL_BATCH_ITERATOR_IMPL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/internal/buffer_pool.h"
#include "client/internal/iterator_state.h"
#include "common/service/protocol.h"
#include "common/service/shared_memory_ring.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "proto/dispatcher.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "sluice/client.h"
#include "spdlog/spdlog.h"

namespace sluice::client {

// The wire protocol version all components share (proto/worker.proto).
using service::kProtocolVersion;

// An error of dispatcher RPC `rpc`: UNAVAILABLE and DEADLINE_EXCEEDED become
// Unavailable "cannot reach the sluice dispatcher at ADDRESS: ..."; other codes
// are kept, the message prefixed.
absl::Status DispatcherError(const grpc::Status& status, const std::string& address,
                             const char* rpc);

struct IteratorParams {
  ClientOptions options;  // logger and clock already defaulted
  std::shared_ptr<proto::DispatcherService::StubInterface> dispatcher;
  uint64_t job_id = 0;
  uint32_t consumer_index = 0;
  bool deterministic = false;
  bool parallel_epochs = false;
  std::string job_name;
  uint32_t num_consumers = 1;
  uint64_t num_epochs = 1;       // 0: until destroyed
  uint64_t job_fingerprint = 0;  // ConsumerCheckpoint.job_fingerprint
  // Continue from this checkpoint (SaveState of an earlier iterator of this consumer).
  std::optional<proto::ConsumerCheckpoint> restore;
  std::vector<SlotProgress> restored_slots;  // RestoredSlots(*restore)
  // The dispatcher reads restore_complete_ranges (GetOrCreateJobResponse.restore_ranges).
  bool restore_ranges = false;
  uint64_t split_size = 0;  // the job's, for ConsumerCheckpoint.split_size
  // The job continues a re-partitioned epoch: its layout, saved with a state of that epoch.
  std::optional<proto::ResizedEpoch> resized;
};

// The version SaveState() writes and Open(restore_state) accepts (and every earlier one). 2:
// slots returned whole are ConsumerCheckpoint.complete_ranges, which a client reading only 1
// would take for not returned; it refuses a state of version 2 instead.
inline constexpr uint32_t kCheckpointVersion = 2;

class BatchIteratorImpl final : public BatchIterator {
 public:
  // Sends the first heartbeat (its error, e.g. NotFound for an unknown job, is
  // returned) and starts the threads.
  static absl::StatusOr<std::unique_ptr<BatchIteratorImpl>> Create(IteratorParams params);
  ~BatchIteratorImpl() override;

  absl::StatusOr<std::optional<Batch>> GetNext() override ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t epoch() const override ABSL_LOCKS_EXCLUDED(mu_);
  double wait_seconds() const override ABSL_LOCKS_EXCLUDED(mu_);
  int buffered_batches() const override ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t duplicate_batches() const override ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t job_id() const override { return params_.job_id; }
  uint64_t received_bytes() const override ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t shared_memory_bytes() const override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> SaveState() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Reader {
    std::string address;
    std::thread thread;
    std::unique_ptr<grpc::ClientContext> context;  // of the open stream, for TryCancel
    bool exited = false;
  };

  explicit BatchIteratorImpl(IteratorParams params);

  // One ClientHeartbeat round trip and its application. Returns the RPC's
  // error.
  // `leaving`: the destructor's last report (ClientHeartbeatRequest.leaving), sent after
  // cancelled_ is set; its answer only returns the readers that ended.
  absl::Status Heartbeat(bool leaving = false) ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void ReaderLoop(Reader* reader) ABSL_LOCKS_EXCLUDED(mu_);
  enum class DeliverResult { kContinue, kReopen, kStop };
  // Hands one message to the state; waits while the buffer is full. kReopen: batches before
  // it are missing; reopen the stream from what the consumer holds. kStop: the reader must
  // stop.
  // `frame` is taken over (its slices move into the batch). `ring`: the reader's shared-memory
  // ring (null: none offered); a batch read from it is released before this returns.
  DeliverResult Deliver(grpc::ByteBuffer* frame, const std::string& address,
                        service::SharedMemoryRing* ring) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts readers for `addresses` that have none; collects exited ones that
  // are not listed.
  void SyncReaders(const std::set<std::string>& addresses) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PARALLEL_EPOCHS: every listed worker sent its end marker and everything was returned.
  bool ParallelDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateFillGauge() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const IteratorParams params_;
  Clock* const clock_;
  const std::shared_ptr<spdlog::logger> logger_;
  prometheus::Counter* wait_counter_ = nullptr;
  prometheus::Counter* batches_counter_ = nullptr;
  prometheus::Counter* duplicates_counter_ = nullptr;
  prometheus::Counter* reopens_counter_ = nullptr;
  prometheus::Gauge* fill_gauge_ = nullptr;
  // Finished batches' buffers, reused (buffer_pool.h says why). A few beyond the ones the
  // trainer and the prefetch buffer hold keep the steady state free of new allocations.
  const std::shared_ptr<BufferPool> buffers_ = BufferPool::Create(/*max_free=*/4);

  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;  // SaveState() waits on it too
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool heartbeat_due_ ABSL_GUARDED_BY(mu_) = false;
  // ClientHeartbeatRequest.consumer_token: this iterator's identity as the consumer's owner;
  // claim_pending_ until a heartbeat was answered.
  const uint64_t consumer_token_;
  bool claim_pending_ ABSL_GUARDED_BY(mu_) = true;
  bool restore_pending_ ABSL_GUARDED_BY(mu_) = false;  // until a heartbeat carried it
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  IteratorState state_ ABSL_GUARDED_BY(mu_);
  HeldLists lists_ ABSL_GUARDED_BY(mu_);          // of the last heartbeat answer
  uint64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;  // successful ones
  absl::Time last_heartbeat_ok_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> listed_ ABSL_GUARDED_BY(mu_);         // worker addresses with a reader
  std::set<std::string> parallel_done_ ABSL_GUARDED_BY(mu_);  // workers whose walk ended
  std::map<std::string, std::unique_ptr<Reader>> readers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Reader>> finished_readers_ ABSL_GUARDED_BY(mu_);  // to join
  grpc::ClientContext* heartbeat_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  double wait_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // When the GetNext() waiting now began (InfinitePast: none waits). The
  // heartbeat counts a wait in progress, so that a long wait is reported in
  // the windows it spans rather than all in the one where it ends.
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t batches_returned_ ABSL_GUARDED_BY(mu_) = 0;  // by GetNext, cumulative
  uint64_t duplicates_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t received_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t shared_memory_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread heartbeat_thread_;
};

}  // namespace sluice::client

#endif  // SLUICE_CLIENT_INTERNAL_BATCH_ITERATOR_IMPL_H_
