// The sluice client library: what a training process links to read its share of
// a job's batches from the data workers (docs/architecture.md, docs/delivery.md).
//
//   ClientOptions options;
//   options.dispatcher_address = "dispatcher:7000";
//   ASSIGN_OR_RETURN(std::unique_ptr<DataServiceClient> client,
//                    DataServiceClient::Create(options));
//   JobOptions job;
//   job.job_name = "resnet50-run3";
//   job.pipeline = PipelineBuilder().Dataset("/data/imagenet-train")...Batch(64).Build();
//   job.num_epochs = 90;
//   job.num_consumers = world_size;
//   job.consumer_index = rank;
//   ASSIGN_OR_RETURN(std::unique_ptr<BatchIterator> it, client->Open(job));
//   while (true) {
//     ASSIGN_OR_RETURN(std::optional<Batch> batch, it->GetNext());
//     if (!batch) break;  // all epochs done
//     Train(*batch);
//   }
//
// Delivery: every batch of this consumer's share is returned exactly once per
// epoch, also when workers die or are replaced (duplicates a replacement worker
// re-sends are dropped). By default batches are returned in arrival order;
// JobOptions::deterministic returns them in the split sequence's order,
// identical for a given seed whatever the number of workers.
#ifndef SLUICE_CLIENT_INCLUDE_SLUICE_CLIENT_H_
#define SLUICE_CLIENT_INCLUDE_SLUICE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
// The one generated header here, on purpose: a job's pipeline is the proto::Pipeline message
// that PipelineBuilder, the YAML loader and the Python binding produce, and the dataset's
// identity is its deterministic serialization (as tf.data service's DatasetDef). Wrapping it
// would add a copy and a second schema to keep in step.
#include "proto/pipeline.pb.h"

// Declared only: pass your own logger, registry or clock, or leave them null.
namespace spdlog {
class logger;
}  // namespace spdlog
namespace prometheus {
class Registry;
}  // namespace prometheus

namespace sluice {

class Clock;  // common/base/clock.h

struct ClientOptions {
  // host:port of the sluice dispatcher.
  std::string dispatcher_address;
  // Deadline of every unary call to the dispatcher.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // How long Create() waits for the dispatcher's channel to connect, and Open()
  // for a data worker to describe the dataset.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Period of the ClientHeartbeat that reports progress and learns epochs and
  // workers.
  absl::Duration heartbeat_interval = absl::Milliseconds(200);
  // Bound of the prefetch buffer, in batches. Readers stop reading their worker
  // streams (and so stop the workers, through flow control) when it is full.
  int prefetch_batches = 16;
  // GetNext() fails with Unavailable when no heartbeat succeeded for this long. Until then the
  // iterator keeps reading the splits it holds and retrying the dispatcher (stopped, paused,
  // restarting): a trainer outlives a dispatcher restart or a node pause of several minutes.
  absl::Duration dispatcher_lost_timeout = absl::Minutes(10);
  // Bytes of the shared-memory ring offered to each worker (a file in /dev/shm, taken as batches
  // touch it): a worker on this host writes batches there and streams only their headers,
  // instead of sending their bytes through loopback TCP. Workers elsewhere ignore it. 0: off;
  // otherwise 1 MiB .. 16 GiB. Size it to a few batches: a batch that does not fit is streamed.
  uint64_t shared_memory_bytes = uint64_t{64} << 20;
  std::shared_ptr<spdlog::logger> logger;    // null: no logging
  prometheus::Registry* registry = nullptr;  // null: no metrics
  // null: RealClock::Get(). Measures the trainer's wait time and the time
  // since the last answered heartbeat (dispatcher_lost_timeout), and paces
  // Open()'s wait for a worker. gRPC deadlines and the heartbeat period are
  // wall-clock.
  Clock* clock = nullptr;

  // Transport security (docs/security.md), for the dispatcher and the workers alike.
  // tls_ca: PEM file of the CA that signed the servers' certificates; set: connect with TLS.
  std::string tls_ca;
  // PEM client certificate and key, for servers that require mutual TLS (need tls_ca).
  std::string tls_cert;
  std::string tls_key;
  // File holding the bearer token presented on every call, re-read when it changes (needs
  // tls_ca).
  std::string auth_token_file;
  // The name the servers' certificates must carry, checked instead of the host dialled (the
  // dispatcher's and every worker's: workers are dialled by IP, so on Kubernetes they share one
  // certificate naming a service, docs/kubernetes.md). Empty: the host dialled.
  std::string tls_server_name;
};

struct JobOptions {
  // Consumers of one training run share a job by name; empty: a new anonymous
  // job.
  std::string job_name;
  // Its source must be a Unirecord dataset folder (or a synthetic source); its
  // batch node gives the batch size (no batch node: 1).
  proto::Pipeline pipeline;
  // Orders the records, and draws the augmentation: random ops draw from the
  // pipeline's seed mixed with this one (0: the pipeline's own draws, those of
  // an in-process run).
  uint64_t seed = 0;
  uint64_t num_epochs = 1;  // 0: repeat until the iterator is destroyed
  uint32_t num_consumers = 1;
  uint32_t consumer_index = 0;
  // Release batches in split-sequence order (reproducible), instead of arrival
  // order (faster).
  bool deterministic = false;
  // Every consumer gets the same number of records per epoch: false pads (at most
  // num_consumers - 1 records read twice), true drops (at most num_consumers - 1 left out).
  bool drop_remainder = false;
  uint64_t split_size = 0;  // records per split; 0: the dispatcher's default
  bool parallel_epochs = false;
  // When the autoscaler's pool is bounded (--max-workers), a job of higher
  // priority gets its need first, and min_workers are reserved for it while
  // the pool holds every job's reservation (when they do not fit, the
  // largest are dropped; docs/autoscaling.md, "Many jobs, one pool").
  int32_t priority = 0;
  uint32_t min_workers = 0;
  // "auto": share production with the other jobs that opt in and whose slots are byte-identical
  // (same dataset, pipeline, seed, consumers, split size, remainder): each batch is produced
  // once for all of them, each job still gets every record exactly once per epoch
  // (docs/sharing.md). "off" or empty (default): the job's batches are its own. Open() fails
  // InvalidArgument for another value.
  std::string sharing;
  // "auto": the dispatcher measures the pipeline's per-node cost in the first epoch and, when
  // reading a deterministic prefix back is cheaper than computing it, caches that prefix (within
  // its --cache-budget-bytes) for the following epochs and for later jobs with the same prefix;
  // `sluice status` says what it decided and why (docs/cache.md, "cache: auto"). "off" or empty
  // (default): only an explicit cache node caches. Open() fails InvalidArgument for another value.
  std::string cache;
  // BatchIterator::SaveState() of an earlier iterator of this consumer (another process,
  // another number of workers): continue with what it had not returned, each record of the
  // epoch exactly once; in deterministic mode the continuation is the exact tail of the
  // uninterrupted sequence. Empty: start from the beginning.
  std::string restore_state;
  // The states that every consumer of the job saved at the same step (one per old consumer
  // index, in any order), when the number of consumers changes mid-epoch: the old job's
  // unreturned batches are divided into num_consumers equal shares (+-1 batch), in the epoch's
  // global order (docs/delivery.md), and this consumer reads share consumer_index. Every new
  // consumer passes the same states. States of as many consumers as this job has: this
  // consumer's own state is restored, as restore_state. Takes precedence over restore_state.
  std::vector<std::string> restore_states;
};

// Element type of a column. kBytes/kString columns carry the worker's encoding.
enum class DType { kBytes, kString, kUint8, kInt32, kInt64, kFloat16, kFloat32 };

// "uint8", "float32", ...
const char* DTypeName(DType dtype);
// Bytes per element; 1 for kBytes/kString.
size_t DTypeSize(DType dtype);

// One column of a batch: `size` bytes at `data`, product(shape) elements, little-endian,
// row-major. The memory is writable and stays valid as long as any copy of `owner` lives (all
// columns of a batch share one owner: the received message). Nothing was copied to make it.
struct Column {
  std::string name;
  DType dtype = DType::kBytes;
  std::vector<int64_t> shape;  // shape[0] = batch size
  uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<void> owner;

  std::string_view bytes() const { return {reinterpret_cast<const char*>(data), size}; }
};

struct Batch {
  uint64_t epoch = 0;
  std::vector<Column> columns;
  std::vector<uint64_t> global_indices;  // one per element: the record's global index
  // Origin: position of the slot in this consumer's sequence of `epoch`, the id
  // of the first split it reads, and the batch's index within the slot.
  uint64_t position = 0;
  uint64_t split_id = 0;
  uint64_t batch_index = 0;
};

// Iterates over one consumer's share of a job. Made by DataServiceClient::Open.
//
// Threads: GetNext() runs on the caller's thread; a heartbeat thread and one
// reader thread per worker stream, owned by the iterator, fill a bounded
// prefetch buffer. The destructor cancels the streams and joins every thread.
// Thread-safe, but batches are meant for one trainer thread.
class BatchIterator {
 public:
  virtual ~BatchIterator() = default;

  // The next batch of this consumer's share; nullopt once all epochs are done
  // (and on every call after that). Blocks only while no batch is buffered and
  // none can be released yet. Errors (final: every later call returns the same
  // error):
  //   a worker stream's INVALID_ARGUMENT / PERMISSION_DENIED / DATA_LOSS /
  //   FAILED_PRECONDITION, prefixed with the worker address; NotFound when the
  //   dispatcher no longer knows the job; FailedPrecondition for a protocol
  //   version mismatch; Unavailable when the dispatcher was unreachable for
  //   ClientOptions::dispatcher_lost_timeout.
  virtual absl::StatusOr<std::optional<Batch>> GetNext() = 0;

  // The epoch of the last batch GetNext() returned (the first epoch before
  // that).
  virtual uint64_t epoch() const = 0;
  // Cumulative time GetNext() waited for a batch, in seconds.
  virtual double wait_seconds() const = 0;
  // Batches received and not yet returned by GetNext().
  virtual int buffered_batches() const = 0;
  // Batches dropped because this consumer already held them (re-sent after a
  // reassignment).
  virtual uint64_t duplicate_batches() const = 0;
  virtual uint64_t job_id() const = 0;
  // Bytes of batches received from workers so far (frame headers and column
  // bytes, duplicates included), through the stream or shared memory.
  virtual uint64_t received_bytes() const { return 0; }
  // Of those, the column bytes a worker on this host wrote to shared memory.
  virtual uint64_t shared_memory_bytes() const { return 0; }

  // A small versioned blob of what this iterator has returned so far (job, consumer, epoch,
  // per split the batches returned). Pass it as JobOptions::restore_state to continue in a new
  // process. FailedPrecondition for a parallel-epochs job.
  virtual absl::StatusOr<std::string> SaveState() const = 0;
};

// A connection to the dispatcher. Thread-safe; may open several iterators.
class DataServiceClient {
 public:
  // Connects to options.dispatcher_address within connect_timeout and checks
  // that a sluice dispatcher speaking this client's protocol answers.
  // Unavailable "cannot reach the sluice dispatcher at ADDR: ..." when nothing
  // (or something that is not a gRPC server) listens there; FailedPrecondition
  // with the dispatcher's message on a protocol version mismatch;
  // InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<DataServiceClient>> Create(ClientOptions options);

  virtual ~DataServiceClient() = default;

  // Registers the pipeline's dataset, gets or creates the job named
  // job.job_name, and starts iterating. A dataset's shard record counts come
  // from its Unirecord manifest, read by a data worker (the trainer need not
  // mount the data): Open waits up to connect_timeout for an active worker.
  // The worker's verdict names the path: NotFound when the source is not a
  // Unirecord dataset folder, PermissionDenied outside its --data-root;
  // InvalidArgument for an image folder; Unavailable when no worker answered;
  // FailedPrecondition when a job of that name exists with another config; the
  // dispatcher's error (code kept) otherwise.
  virtual absl::StatusOr<std::unique_ptr<BatchIterator>> Open(const JobOptions& job) = 0;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_INCLUDE_SLUICE_CLIENT_H_
