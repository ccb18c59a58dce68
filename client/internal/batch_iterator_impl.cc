#include "client/internal/batch_iterator_impl.h"

#include <algorithm>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "client/internal/channel_options.h"
#include "common/base/retry.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "common/service/batch_codec.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"
#include "common/service/position_runs.h"
#include "common/service/retry_policy.h"
#include "common/tensor_kernels/finish.h"

namespace sluice::client {
namespace {

// How long SaveState() waits for end-of-split markers still in flight.
constexpr absl::Duration kMarkerWait = absl::Seconds(2);

// A worker stream that ended with a retryable error is reopened after 50 ms, doubling up to
// 2 s, with jitter.
// The longest the destructor waits for the dispatcher to hear that the consumer leaves.
constexpr absl::Duration kLeaveWait = absl::Seconds(2);

// The first retry comes soon: the usual failure at a job's start is a worker that learns of the
// job a few milliseconds after the client (NotFound), and that wait is the job's first batch.
RetryOptions StreamBackoff() {
  RetryOptions backoff;
  backoff.initial_backoff = absl::Milliseconds(10);
  backoff.max_backoff = absl::Seconds(2);
  return backoff;
}

// ClientHeartbeatRequest.consumer_token: random, never 0.
uint64_t RandomToken() {
  std::random_device device;
  const uint64_t token = (static_cast<uint64_t>(device()) << 32) ^ device() ^
                         static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return token == 0 ? 1 : token;
}

DType ToDType(proto::TensorDType dtype) {
  switch (dtype) {
    case proto::TENSOR_DTYPE_STRING:
      return DType::kString;
    case proto::TENSOR_DTYPE_UINT8:
      return DType::kUint8;
    case proto::TENSOR_DTYPE_INT32:
      return DType::kInt32;
    case proto::TENSOR_DTYPE_INT64:
      return DType::kInt64;
    case proto::TENSOR_DTYPE_FLOAT16:
      return DType::kFloat16;
    case proto::TENSOR_DTYPE_FLOAT32:
      return DType::kFloat32;
    default:
      return DType::kBytes;
  }
}

// Trainer-side finishing on the host: runs the header's tail ops on the received column,
// fused with the copy into the trainer's float32 buffer (common/tensor_kernels/finish.h).
// The seam for device finishing: a GPU trainer would instead hand the uint8 column (and the
// ops) to the device here. InvalidArgument if the ops or the column are not what the client
// can run.
absl::Status FinishOnHost(const service::ReceivedBatch& wire, const proto::ColumnFinish& finish,
                          BufferPool& buffers, Column* column) {
  const proto::Column& c = wire.header.columns(finish.column());
  ASSIGN_OR_RETURN(record::DType dtype, service::FromWireDType(c.dtype()));
  const std::vector<proto::OpSpec> ops(finish.ops().begin(), finish.ops().end());
  ASSIGN_OR_RETURN(kernels::Finisher finisher, kernels::Finisher::Create(ops, dtype, c.shape()));
  std::shared_ptr<uint8_t[]> out = buffers.Get(finisher.out_bytes());
  RETURN_IF_ERROR(finisher.Run(wire.pieces[finish.column()], finish.mirrored(),
                               reinterpret_cast<float*>(out.get())));
  column->dtype = DType::kFloat32;
  column->shape = finisher.out_shape();
  column->data = out.get();
  column->size = finisher.out_bytes();
  column->owner = std::move(out);
  return absl::OkStatus();
}

// The trainer's batch from a received frame: a column that arrived in one slice (aligned for
// its dtype) is handed over as is, sharing the slices' ownership; any other column is copied
// once into a buffer the batch owns (service::Gather), or finished on the way (FinishOnHost)
// into a buffer from `buffers`.
absl::StatusOr<Batch> FromWire(const service::ReceivedBatch& wire, BufferPool& buffers) {
  const proto::Batch& header = wire.header;
  Batch batch;
  batch.epoch = header.key().epoch();
  batch.position = header.key().position();
  batch.split_id = header.split_id();
  batch.batch_index = header.batch_index();
  batch.global_indices.assign(header.global_indices().begin(), header.global_indices().end());
  batch.columns.reserve(header.columns_size());
  std::vector<const proto::ColumnFinish*> finish(header.columns_size());
  for (const proto::ColumnFinish& f : header.finish()) {
    finish[f.column()] = &f;  // CheckBatch: an existing column, at most once
  }
  for (int i = 0; i < header.columns_size(); ++i) {
    const proto::Column& c = header.columns(i);
    Column column;
    column.name = c.name();
    if (finish[i] != nullptr) {
      RETURN_IF_ERROR(FinishOnHost(wire, *finish[i], buffers, &column));
      batch.columns.push_back(std::move(column));
      continue;
    }
    column.dtype = ToDType(c.dtype());
    column.shape.assign(c.shape().begin(), c.shape().end());
    const absl::StatusOr<record::DType> dtype = service::FromWireDType(c.dtype());
    const size_t alignment = dtype.ok() ? record::DTypeSize(*dtype) : 1;
    service::ColumnBytes bytes = service::Gather(wire, i, std::max<size_t>(1, alignment));
    column.data = const_cast<uint8_t*>(bytes.data);
    column.size = bytes.size;
    column.owner = std::const_pointer_cast<void>(std::move(bytes.owner));
    batch.columns.push_back(std::move(column));
  }
  return batch;
}

// The wait before the next heartbeat after `failures` failed ones in a row: the interval, then
// doubling up to 2 s, with jitter so that consumers do not all return at once after a
// dispatcher restart.
absl::Duration HeartbeatWait(absl::Duration interval, int failures) {
  if (failures == 0) return interval;
  RetryOptions backoff;
  backoff.initial_backoff = interval;
  backoff.max_backoff = std::max(interval, absl::Seconds(2));
  return JitteredBackoff(failures, backoff);
}

}  // namespace

absl::Status DispatcherError(const grpc::Status& status, const std::string& address,
                             const char* rpc) {
  return service::PeerCallError(status, "sluice dispatcher", address, rpc);
}

BatchIteratorImpl::BatchIteratorImpl(IteratorParams params)
    : params_(std::move(params)),
      clock_(params_.options.clock),
      logger_(params_.options.logger),
      consumer_token_(RandomToken()),
      state_(params_.deterministic, /*track_splits=*/!params_.parallel_epochs,
             params_.options.prefetch_batches) {
  if (params_.restore.has_value()) {
    state_.Restore(params_.restore->epoch(), params_.restored_slots);
    restore_pending_ = true;
  }
  if (params_.options.registry != nullptr) {
    prometheus::Registry& registry = *params_.options.registry;
    wait_counter_ = &AddCounter(registry, "sluice_client_wait_seconds_total",
                                "Time the trainer waited in GetNext() for a batch.");
    batches_counter_ =
        &AddCounter(registry, "sluice_client_batches_total", "Batches returned by GetNext().");
    duplicates_counter_ = &AddCounter(registry, "sluice_client_duplicate_batches_total",
                                      "Batches dropped because the consumer already held them.");
    reopens_counter_ =
        &AddCounter(registry, "sluice_client_stream_reopens_total",
                    "Worker streams reopened because a batch arrived ahead of what the "
                    "consumer holds (lost in flight, or dropped by the deterministic "
                    "bound).");
    fill_gauge_ = &AddGauge(registry, "sluice_client_buffer_fill",
                            "Fraction (0..1) of the client's prefetch buffer in use.");
  }
}

absl::StatusOr<std::unique_ptr<BatchIteratorImpl>> BatchIteratorImpl::Create(
    IteratorParams params) {
  auto it = std::unique_ptr<BatchIteratorImpl>(new BatchIteratorImpl(std::move(params)));
  {
    absl::MutexLock lock(&it->mu_);
    it->last_heartbeat_ok_ = it->clock_->Now();
  }
  absl::Status first = it->Heartbeat();
  if (!first.ok()) return first;
  it->heartbeat_thread_ = std::thread(&BatchIteratorImpl::HeartbeatLoop, it.get());
  return it;
}

BatchIteratorImpl::~BatchIteratorImpl() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (auto& [address, reader] : readers_) {
      if (reader->context != nullptr) reader->context->TryCancel();
    }
    if (heartbeat_context_ != nullptr) heartbeat_context_->TryCancel();
    cv_.SignalAll();
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  bool report;
  {
    absl::MutexLock lock(&mu_);
    report = error_.ok() && !params_.parallel_epochs;
  }
  // Say so at once: a job whose consumers all left frees its workers now, not when the lease
  // runs out (ClientHeartbeatRequest.leaving). Best effort: a failure leaves it to the lease.
  if (report) (void)Heartbeat(/*leaving=*/true);
  std::map<std::string, std::unique_ptr<Reader>> readers;
  std::vector<std::unique_ptr<Reader>> finished;
  {
    absl::MutexLock lock(&mu_);
    readers.swap(readers_);
    finished.swap(finished_readers_);
  }
  for (auto& [address, reader] : readers) reader->thread.join();
  for (auto& reader : finished) reader->thread.join();
}

void BatchIteratorImpl::Fail(absl::Status status) {
  if (!error_.ok()) return;
  logger_->error("sluice client (job {}): {}", params_.job_id, status.ToString());
  error_ = std::move(status);
  for (auto& [address, reader] : readers_) {
    if (reader->context != nullptr) reader->context->TryCancel();
  }
  cv_.SignalAll();
}

void BatchIteratorImpl::UpdateFillGauge() {
  if (fill_gauge_ == nullptr) return;
  fill_gauge_->Set(std::min(
      1.0, static_cast<double>(state_.buffered()) / std::max(1, params_.options.prefetch_batches)));
}

absl::StatusOr<std::optional<Batch>> BatchIteratorImpl::GetNext() {
  const absl::Time start = clock_->Now();
  bool waited = false;
  absl::MutexLock lock(&mu_);
  auto account_wait = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!waited) return;
    waiting_since_ = absl::InfinitePast();
    const double seconds = std::max(0.0, absl::ToDoubleSeconds(clock_->Now() - start));
    wait_seconds_ += seconds;
    if (wait_counter_ != nullptr) wait_counter_->Increment(seconds);
  };
  while (true) {
    if (!error_.ok()) {
      waiting_since_ = absl::InfinitePast();
      return error_;
    }
    std::optional<Batch> batch = state_.Pop();
    if (batch.has_value()) {
      epoch_ = batch->epoch;
      ++batches_returned_;
      // The first batch returned tells the dispatcher that this consumer started: its other
      // splits go out now (DispatcherImpl::Assignable).
      if (state_.TakeProgressDue() || batches_returned_ == 1) heartbeat_due_ = true;
      if (batches_counter_ != nullptr) batches_counter_->Increment();
      UpdateFillGauge();
      cv_.SignalAll();  // room in the buffer
      account_wait();
      return batch;
    }
    if (state_.Done() || ParallelDone()) {
      account_wait();
      return std::optional<Batch>();
    }
    if (cancelled_) {
      waiting_since_ = absl::InfinitePast();
      return absl::CancelledError("the iterator is being destroyed");
    }
    if (!waited) waiting_since_ = start;
    waited = true;
    cv_.Wait(&mu_);
  }
}

bool BatchIteratorImpl::ParallelDone() const {
  if (!params_.parallel_epochs || listed_.empty() || state_.buffered() > 0) return false;
  for (const std::string& address : listed_) {
    if (!parallel_done_.contains(address)) return false;
  }
  return true;
}

uint64_t BatchIteratorImpl::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

double BatchIteratorImpl::wait_seconds() const {
  absl::MutexLock lock(&mu_);
  return wait_seconds_;
}

int BatchIteratorImpl::buffered_batches() const {
  absl::MutexLock lock(&mu_);
  return state_.buffered();
}

uint64_t BatchIteratorImpl::shared_memory_bytes() const {
  absl::MutexLock lock(&mu_);
  return shared_memory_bytes_;
}

uint64_t BatchIteratorImpl::received_bytes() const {
  absl::MutexLock lock(&mu_);
  return received_bytes_;
}

uint64_t BatchIteratorImpl::duplicate_batches() const {
  absl::MutexLock lock(&mu_);
  return duplicates_;
}

absl::StatusOr<std::string> BatchIteratorImpl::SaveState() const {
  proto::ConsumerCheckpoint checkpoint;
  checkpoint.set_version(kCheckpointVersion);
  checkpoint.set_job_id(params_.job_id);
  checkpoint.set_job_name(params_.job_name);
  checkpoint.set_consumer_index(params_.consumer_index);
  checkpoint.set_num_consumers(params_.num_consumers);
  checkpoint.set_job_fingerprint(params_.job_fingerprint);
  checkpoint.set_split_size(params_.split_size);
  absl::MutexLock lock(&mu_);
  if (params_.parallel_epochs) {
    return absl::FailedPreconditionError(
        "SaveState: a parallel-epochs job has no exactly-once position to "
        "save");
  }
  // At an epoch boundary (everything of the epoch returned) the state is the start of the next
  // epoch: nothing of it returned, so the number of consumers may change on restore.
  uint64_t epoch = state_.epoch();
  // Right after the last batch of an epoch its end-of-split markers may still be in flight:
  // wait for them (briefly), so that a state saved at the end of an epoch is one.
  const absl::Time deadline = absl::Now() + kMarkerWait;
  while (!params_.parallel_epochs && !cancelled_ && error_.ok() &&
         state_.EpochReturned(epoch) == IteratorState::Returned::kMaybe) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (state_.EpochReturned(epoch) == IteratorState::Returned::kYes) ++epoch;
  checkpoint.set_epoch(epoch);
  checkpoint.set_finished(state_.Done() ||
                          (params_.num_epochs != 0 && epoch >= params_.num_epochs));
  if (checkpoint.finished()) return checkpoint.SerializeAsString();
  if (params_.resized.has_value() && params_.resized->epoch() == epoch)
    *checkpoint.mutable_resized() = *params_.resized;
  // Slots returned whole as runs (complete_ranges), so the state stays small at any number of
  // slots; the others one by one.
  for (const SlotProgress& p : state_.Progress(/*acknowledged=*/true)) {
    if (p.epoch != epoch || (p.batches == 0 && !p.complete)) continue;
    if (p.complete) {
      service::AppendToRuns(checkpoint.mutable_complete_ranges(), p.position);
      checkpoint.set_complete_batches(checkpoint.complete_batches() + p.batches);
      continue;
    }
    proto::ClientSplitProgress* out = checkpoint.add_splits();
    out->set_epoch(p.epoch);
    out->set_position(p.position);
    out->set_delivered_batches(p.batches);
    out->set_complete(p.complete);
  }
  return checkpoint.SerializeAsString();
}

absl::Status BatchIteratorImpl::Heartbeat(bool leaving) {
  proto::ClientHeartbeatRequest request;
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + (leaving ? std::min(params_.options.rpc_timeout, kLeaveWait)
                                                : params_.options.rpc_timeout)));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ && !leaving) return absl::CancelledError("the iterator is being destroyed");
    request.set_leaving(leaving);
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(params_.job_id);
    request.set_consumer_index(params_.consumer_index);
    request.set_buffer_fill(std::min(1.0, static_cast<double>(state_.buffered()) /
                                              std::max(1, params_.options.prefetch_batches)));
    // A wait in progress counts up to now; when it ends, the whole wait is
    // added to wait_seconds_, so the total never goes back.
    request.set_wait_seconds_total(
        wait_seconds_ +
        (waiting_since_ == absl::InfinitePast()
             ? 0.0
             : std::max(0.0, absl::ToDoubleSeconds(clock_->Now() - waiting_since_))));
    request.set_batches_returned_total(batches_returned_);
    // A restore sends the slots returned whole as runs, to a dispatcher that reads them.
    const bool ranges = restore_pending_ && params_.restore_ranges;
    for (const SlotProgress& p : state_.Progress()) {
      if (ranges && p.complete && p.epoch == params_.restore->epoch()) {
        service::AppendToRuns(request.mutable_restore_complete_ranges(), p.position);
        continue;
      }
      proto::ClientSplitProgress* out = request.add_progress();
      out->set_epoch(p.epoch);
      out->set_position(p.position);
      out->set_delivered_batches(p.batches);
      out->set_complete(p.complete);
    }
    request.set_consumer_token(consumer_token_);
    request.set_claim(claim_pending_);
    if (restore_pending_) {
      request.set_restore(true);
      request.set_restore_epoch(params_.restore->epoch());
    }
    request.set_splits_count_only(true);
    request.set_done_as_ranges(true);
    request.set_tasks_version(lists_.tasks_version());
    request.set_splits_version(lists_.splits_version());
    if (!leaving) heartbeat_context_ = &context;
  }
  proto::ClientHeartbeatResponse response;
  const grpc::Status status = params_.dispatcher->ClientHeartbeat(&context, request, &response);
  std::vector<std::unique_ptr<Reader>> to_join;
  {
    absl::MutexLock lock(&mu_);
    if (!leaving) heartbeat_context_ = nullptr;
    if (status.ok()) restore_pending_ = claim_pending_ = false;
    if (!status.ok()) {
      return DispatcherError(status, params_.options.dispatcher_address, "ClientHeartbeat");
    }
    std::vector<uint64_t> done(response.done_positions().begin(), response.done_positions().end());
    for (int i = 0; i + 1 < response.done_ranges_size(); i += 2) {
      for (uint64_t p = response.done_ranges(i); p < response.done_ranges(i + 1); ++p)
        done.push_back(p);
    }
    // A dispatcher that knows splits_count_only sends num_splits; an older one the list.
    HeldLists::Response lists{.tasks_version = response.tasks_version(),
                              .splits_version = response.splits_version(),
                              .num_splits = response.num_splits() != 0
                                                ? response.num_splits()
                                                : static_cast<uint64_t>(response.splits_size())};
    for (const proto::Task& task : response.tasks()) lists.addresses.push_back(task.address());
    lists_.Apply(request.tasks_version(), request.splits_version(), std::move(lists));
    const bool was_started = state_.started();
    state_.ApplyHeartbeat(response.epoch(), lists_.num_splits(), done, response.finished());
    if (!was_started) epoch_ = response.epoch();
    if (!cancelled_ && error_.ok()) SyncReaders(lists_.addresses());
    ++heartbeats_;
    last_heartbeat_ok_ = clock_->Now();
    cv_.SignalAll();
    to_join.swap(finished_readers_);
  }
  for (auto& reader : to_join) reader->thread.join();
  return absl::OkStatus();
}

void BatchIteratorImpl::SyncReaders(const std::set<std::string>& addresses) {
  listed_ = addresses;
  for (auto it = readers_.begin(); it != readers_.end();) {
    if (it->second->exited) {
      finished_readers_.push_back(std::move(it->second));
      it = readers_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& address : addresses) {
    if (readers_.contains(address)) continue;
    auto reader = std::make_unique<Reader>();
    reader->address = address;
    Reader* raw = reader.get();
    readers_.emplace(address, std::move(reader));
    raw->thread = std::thread(&BatchIteratorImpl::ReaderLoop, this, raw);
    logger_->debug("sluice client (job {}): streaming from worker {}", params_.job_id, address);
  }
}

void BatchIteratorImpl::HeartbeatLoop() {
  int failures = 0;  // in a row: the next heartbeat backs off (no early ones meanwhile)
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time deadline =
          absl::Now() + HeartbeatWait(params_.options.heartbeat_interval, failures);
      while (!cancelled_ && (failures > 0 || !heartbeat_due_) && error_.ok()) {
        if (cv_.WaitWithDeadline(&mu_, deadline)) break;
      }
      if (cancelled_ || !error_.ok()) return;
      heartbeat_due_ = false;
    }
    const absl::Status status = Heartbeat();
    failures = status.ok() ? 0 : failures + 1;
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    if (!status.ok()) {
      // Only transport trouble is retried; anything else is the dispatcher's verdict.
      if (!service::IsRetryable(status.code())) {
        Fail(status);
        return;
      }
      if (clock_->Now() - last_heartbeat_ok_ > params_.options.dispatcher_lost_timeout) {
        Fail(absl::UnavailableError(absl::StrCat(
            "no answer from the sluice dispatcher at ", params_.options.dispatcher_address, " for ",
            absl::FormatDuration(params_.options.dispatcher_lost_timeout), ": ",
            status.message())));
        return;
      }
      logger_->warn("sluice client (job {}): heartbeat failed, retrying: {}", params_.job_id,
                    status.ToString());
    } else if (state_.Done()) {
      return;  // all epochs done and returned; nothing more to report
    }
  }
}

BatchIteratorImpl::DeliverResult BatchIteratorImpl::Deliver(grpc::ByteBuffer* frame,
                                                            const std::string& address,
                                                            service::SharedMemoryRing* ring) {
  const size_t frame_bytes = frame->Length();
  // DecodeBatch runs CheckBatch on the header and checks the lengths against the frame (or
  // against its span of the ring).
  absl::StatusOr<service::ReceivedBatch> received = service::DecodeBatch(frame, ring);
  if (!received.ok()) {
    absl::MutexLock lock(&mu_);
    Fail(absl::DataLossError(absl::StrCat(
        "sluice worker at ", address, " sent a malformed batch: ", received.status().message())));
    return DeliverResult::kStop;
  }
  const proto::Batch* wire = &received->header;
  // The ring space is the worker's again once the batch is copied or finished out of it (below),
  // whatever happens to the batch.
  absl::Cleanup release = [&] {
    if (wire->has_shared_memory()) ring->Release(wire->shared_memory());
  };
  {
    absl::MutexLock lock(&mu_);
    received_bytes_ += frame_bytes + wire->shared_memory().length();
    shared_memory_bytes_ += wire->shared_memory().length();
  }
  const bool ours =
      params_.parallel_epochs || (wire->key().job_id() == params_.job_id &&
                                  wire->key().consumer_index() == params_.consumer_index);
  // The one copy (or none) into the trainer's memory, outside the lock.
  std::optional<Batch> ready;
  if (ours && !wire->end_of_split()) {
    absl::StatusOr<Batch> batch = FromWire(*received, *buffers_);
    if (!batch.ok()) {
      absl::MutexLock lock(&mu_);
      Fail(absl::DataLossError(
          absl::StrCat("sluice worker at ", address,
                       " sent a batch the client cannot finish: ", batch.status().message())));
      return DeliverResult::kStop;
    }
    ready = std::move(*batch);
  }
  absl::MutexLock lock(&mu_);
  if (!ours) {
    logger_->error(
        "sluice client (job {}, consumer {}): worker {} sent a batch of job {} "
        "consumer {}; "
        "dropped",
        params_.job_id, params_.consumer_index, address, wire->key().job_id(),
        wire->key().consumer_index());
    return DeliverResult::kContinue;
  }
  const bool marker = wire->end_of_split();
  if (params_.parallel_epochs && marker) {
    // This worker walked the dataset for every epoch.
    parallel_done_.insert(address);
    cv_.SignalAll();
    return DeliverResult::kContinue;
  }
  const uint64_t epoch = wire->key().epoch();
  const uint64_t position = wire->key().position();
  const uint64_t index = wire->batch_index();
  while (true) {
    if (cancelled_ || !error_.ok()) return DeliverResult::kStop;
    switch (state_.Check(epoch, position, index, marker)) {
      case IteratorState::Admit::kDuplicate:
        if (marker) return DeliverResult::kContinue;
        ++duplicates_;
        if (duplicates_counter_ != nullptr) duplicates_counter_->Increment();
        logger_->debug(
            "sluice client (job {}): duplicate batch (epoch {}, position {}, "
            "index {}) from {} "
            "dropped",
            params_.job_id, epoch, position, index, address);
        return DeliverResult::kContinue;
      case IteratorState::Admit::kAhead:
      case IteratorState::Admit::kDrop:
        // Batches before it are missing (lost in flight, or dropped by the deterministic
        // bound): reopen the stream, telling the worker what we hold, once the buffer drained.
        logger_->debug(
            "sluice client (job {}): batch (epoch {}, position {}, index {}) "
            "from {} not held "
            "now; the stream will be reopened from what this consumer holds",
            params_.job_id, epoch, position, index, address);
        return DeliverResult::kReopen;
      case IteratorState::Admit::kAccept: {
        if (marker) {
          state_.AcceptMarker(epoch, position, index);
        } else {
          state_.Accept(std::move(*ready));
        }
        if (state_.TakeProgressDue()) heartbeat_due_ = true;
        UpdateFillGauge();
        cv_.SignalAll();
        return DeliverResult::kContinue;
      }
      case IteratorState::Admit::kWait:
        cv_.Wait(&mu_);
        break;
    }
  }
}

void BatchIteratorImpl::ReaderLoop(Reader* reader) {
  const std::string address = reader->address;
  // One batch can be tens of MB: no receive limit. TLS and token:
  // common/service/channel_factory.h (the options were checked by Create()).
  const service::ChannelOptions channel_options =
      ToChannelOptions(params_.options, /*max_receive_message_bytes=*/-1);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      service::CreateChannel(address, channel_options);
  if (!channel.ok()) {
    absl::MutexLock lock(&mu_);
    Fail(channel.status());
    reader->exited = true;
    return;
  }
  // Offered on every stream to this worker; used if the worker shares this host.
  std::unique_ptr<service::SharedMemoryRing> ring;
  if (params_.options.shared_memory_bytes > 0) {
    absl::StatusOr<std::unique_ptr<service::SharedMemoryRing>> created =
        service::SharedMemoryRing::Create(params_.options.shared_memory_bytes);
    if (created.ok()) {
      ring = *std::move(created);
    } else {
      logger_->debug("sluice client (job {}): batches from {} come through the stream only: {}",
                     params_.job_id, address, created.status().ToString());
    }
  }
  int failures = 0;
  while (true) {
    grpc::ClientContext* context;
    proto::GetBatchesRequest request;
    request.set_protocol_version(kProtocolVersion);
    if (ring != nullptr) *request.mutable_shared_memory() = ring->offer();
    request.set_job_id(params_.job_id);
    request.set_consumer_index(params_.consumer_index);
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ || !error_.ok() || !listed_.contains(address)) {
        reader->exited = true;
        return;
      }
      for (const SlotProgress& h : state_.Held()) {
        if (h.complete) continue;
        proto::HeldSplit* out = request.add_held();
        out->mutable_key()->set_job_id(params_.job_id);
        out->mutable_key()->set_consumer_index(params_.consumer_index);
        out->mutable_key()->set_epoch(h.epoch);
        out->mutable_key()->set_position(h.position);
        out->set_batches(h.batches);
      }
      reader->context = std::make_unique<grpc::ClientContext>();
      context = reader->context.get();
    }
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream =
        service::OpenBatchStream(channel->get(), context, request);
    bool received_any = false;
    bool reopen = false;
    grpc::ByteBuffer frame;
    while (stream->Read(&frame)) {
      received_any = true;
      const DeliverResult result = Deliver(&frame, address, ring.get());
      if (result == DeliverResult::kStop) {
        context->TryCancel();
        break;
      }
      if (result == DeliverResult::kReopen) {
        reopen = true;
        if (reopens_counter_ != nullptr) reopens_counter_->Increment();
        context->TryCancel();
        break;
      }
    }
    const grpc::Status status = stream->Finish();
    stream.reset();
    absl::MutexLock lock(&mu_);
    reader->context.reset();
    if (cancelled_ || !error_.ok()) {
      reader->exited = true;
      return;
    }
    if (received_any) failures = 0;
    if (reopen) {
      // Reopen once the buffer has room, so the re-sent batches can be taken; at once (after a
      // short pause) while the batch the deterministic cursor waits for is missing: it may be
      // the next one this worker sends.
      while (!cancelled_ && error_.ok() && state_.buffered() >= params_.options.prefetch_batches &&
             state_.NextBuffered()) {
        cv_.Wait(&mu_);
      }
      const absl::Time resume = absl::Now() + absl::Milliseconds(50);
      while (!cancelled_ && error_.ok() && !cv_.WaitWithDeadline(&mu_, resume)) {
      }
      continue;
    }
    if (status.ok()) {
      // The worker has nothing more for us now: reopen after the next heartbeat if still
      // listed.
      const uint64_t seen = heartbeats_;
      while (!cancelled_ && error_.ok() && heartbeats_ == seen) cv_.Wait(&mu_);
      continue;
    }
    if (!service::IsRetryable(static_cast<absl::StatusCode>(status.error_code()),
                              service::CallKind::kBatchStream)) {
      Fail(service::FromGrpcStatus(status, absl::StrCat("sluice worker at ", address)));
      reader->exited = true;
      return;
    }
    ++failures;
    const absl::Duration backoff = JitteredBackoff(failures, StreamBackoff());
    logger_->debug("sluice client (job {}): stream from {} ended ({}: {}); retrying in {}",
                   params_.job_id, address, static_cast<int>(status.error_code()),
                   status.error_message(), absl::FormatDuration(backoff));
    const absl::Time deadline = absl::Now() + backoff;
    while (!cancelled_ && error_.ok()) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
  }
}

}  // namespace sluice::client
