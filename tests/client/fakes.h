// Test doubles for the client tests: a fake dispatcher and fake workers served
// over real gRPC on 127.0.0.1:0, whose behaviour the test scripts.
#ifndef SLUICE_TESTS_CLIENT_FAKES_H_
#define SLUICE_TESTS_CLIENT_FAKES_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/service/batch_codec.h"
#include "common/service/protocol.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/method_handler.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "proto/dispatcher.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"

namespace sluice::client::testing {

inline constexpr uint64_t kJobId = 7;

// The id a fake worker writes into a batch's "id" column (and global_indices).
inline uint64_t BatchId(uint64_t epoch, uint64_t position, uint64_t index) {
  return epoch * 1000000 + position * 1000 + index;
}

// A gRPC server on 127.0.0.1:<free port> serving one service.
class TestServer {
 public:
  explicit TestServer(grpc::Service* service) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
  }
  ~TestServer() { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A dispatcher with one job (kJobId) whose consumer has `positions` splits per
// epoch. A position is done when a heartbeat reports it complete; when all are,
// the epoch advances; after `num_epochs` the consumer is finished. Like the real
// one it omits the task list and the split sequence when the request echoes
// their versions, unless SetVersionedLists(false) (a dispatcher that predates
// versions: whole lists, version 0).
class FakeDispatcher final : public proto::DispatcherService::Service {
 public:
  FakeDispatcher(uint64_t num_epochs, uint64_t positions)
      : num_epochs_(num_epochs), positions_(positions) {}

  void SetTasks(std::vector<std::string> addresses) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    tasks_ = std::move(addresses);
    ++tasks_version_;
  }
  void SetVersionedLists(bool versioned) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    versioned_ = versioned;
  }
  // Heartbeat answers that omitted the task list.
  int omitted_tasks() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return omitted_tasks_;
  }
  void SetVersion(uint32_t version) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    version_ = version;
  }
  void SetHeartbeatError(grpc::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    heartbeat_error_ = std::move(status);
  }
  proto::RegisterDatasetRequest registered() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return registered_;
  }
  proto::GetOrCreateJobRequest job_request() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return job_request_;
  }
  // The progress of the last heartbeat.
  std::vector<proto::ClientSplitProgress> last_progress() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return last_progress_;
  }
  int heartbeats() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  int status_calls() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return status_calls_;
  }
  // Heartbeats answered with the SetHeartbeatError status.
  int failed_heartbeats() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return failed_heartbeats_;
  }

  // A dispatcher without data workers (the client asks them for a dataset's shard sizes).
  grpc::Status GetStatus(grpc::ServerContext*, const proto::GetStatusRequest* request,
                         proto::GetStatusResponse*) override {
    absl::MutexLock lock(&mu_);
    ++status_calls_;
    return CheckVersion(request->protocol_version());
  }

  grpc::Status RegisterDataset(grpc::ServerContext*, const proto::RegisterDatasetRequest* request,
                               proto::RegisterDatasetResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = CheckVersion(request->protocol_version()); !s.ok()) return s;
    registered_ = *request;
    response->set_dataset_id(1);
    return grpc::Status::OK;
  }
  grpc::Status GetOrCreateJob(grpc::ServerContext*, const proto::GetOrCreateJobRequest* request,
                              proto::GetOrCreateJobResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = CheckVersion(request->protocol_version()); !s.ok()) return s;
    job_request_ = *request;
    response->set_job_id(kJobId);
    response->set_created(true);
    *response->mutable_config() = request->config();
    return grpc::Status::OK;
  }
  grpc::Status GetJobState(grpc::ServerContext*, const proto::GetJobStateRequest* request,
                           proto::GetJobStateResponse*) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = CheckVersion(request->protocol_version()); !s.ok()) return s;
    if (request->job_id() == kJobId) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "job not found");
  }
  grpc::Status ClientHeartbeat(grpc::ServerContext*, const proto::ClientHeartbeatRequest* request,
                               proto::ClientHeartbeatResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = CheckVersion(request->protocol_version()); !s.ok()) return s;
    if (!heartbeat_error_.ok()) {
      ++failed_heartbeats_;
      return heartbeat_error_;
    }
    if (request->job_id() != kJobId) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "job not found");
    }
    ++heartbeats_;
    last_progress_.assign(request->progress().begin(), request->progress().end());
    for (const proto::ClientSplitProgress& p : request->progress()) {
      if (p.epoch() == epoch_ && p.complete()) done_.insert(p.position());
    }
    if (!finished_ && done_.size() == positions_) {
      ++epoch_;
      done_.clear();
      finished_ = epoch_ == num_epochs_;
    }
    response->set_epoch(epoch_);
    response->set_finished(finished_);
    const uint64_t splits_version = versioned_ ? 100 + 2 * epoch_ + (finished_ ? 1 : 0) : 0;
    const uint64_t tasks_version = versioned_ ? tasks_version_ : 0;
    response->set_splits_version(splits_version);
    response->set_tasks_version(tasks_version);
    if (splits_version == 0 || request->splits_version() != splits_version) {
      for (uint64_t p = 0; p < positions_; ++p) {
        proto::SplitAssignment* split = response->add_splits();
        split->mutable_key()->set_job_id(kJobId);
        split->mutable_key()->set_epoch(epoch_);
        split->mutable_key()->set_position(p);
        split->add_pieces()->set_split_id(p);
      }
    }
    for (uint64_t p : done_) response->add_done_positions(p);
    if (tasks_version == 0 || request->tasks_version() != tasks_version) {
      uint64_t id = 1;
      for (const std::string& address : tasks_) {
        proto::Task* task = response->add_tasks();
        task->set_worker_id(id++);
        task->set_address(address);
      }
    } else {
      ++omitted_tasks_;
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status CheckVersion(uint32_t version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (version == version_) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "client protocol version " + std::to_string(version) + ", dispatcher " +
                            std::to_string(version_) + ": upgrade the client");
  }

  const uint64_t num_epochs_;
  const uint64_t positions_;
  mutable absl::Mutex mu_;
  uint32_t version_ ABSL_GUARDED_BY(mu_) = service::kProtocolVersion;
  grpc::Status heartbeat_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t tasks_version_ ABSL_GUARDED_BY(mu_) = 1;
  bool versioned_ ABSL_GUARDED_BY(mu_) = true;
  int omitted_tasks_ ABSL_GUARDED_BY(mu_) = 0;
  proto::RegisterDatasetRequest registered_ ABSL_GUARDED_BY(mu_);
  proto::GetOrCreateJobRequest job_request_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::ClientSplitProgress> last_progress_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int status_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<uint64_t> done_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A worker that streams a scripted list of batches (each at most once over all
// its streams) as frames (service/batch_codec.h), then ends the stream with
// `final_status`. Synchronous, on the raw GetBatches method.
class FakeWorker final : public grpc::Service {
 public:
  FakeWorker() {
    AddMethod(new grpc::internal::RpcServiceMethod(
        service::kGetBatchesMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
        new grpc::internal::ServerStreamingHandler<FakeWorker, proto::GetBatchesRequest,
                                                   grpc::ByteBuffer>(
            [](FakeWorker* self, grpc::ServerContext* context,
               const proto::GetBatchesRequest* request,
               grpc::ServerWriter<grpc::ByteBuffer>* writer) {
              return self->GetBatches(context, request, writer);
            },
            this)));
  }

  struct Item {
    uint64_t epoch;
    uint64_t position;
    uint64_t index;
    bool last;
  };

  // Appends batches 0..count-1 of slot (epoch, position) to the script.
  void AddSplit(uint64_t epoch, uint64_t position, uint64_t count) ABSL_LOCKS_EXCLUDED(mu_) {
    for (uint64_t i = 0; i < count; ++i) Add({epoch, position, i, i + 1 == count});
  }
  void Add(Item item) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    script_.push_back(item);
  }
  void SetFinalStatus(grpc::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    final_status_ = std::move(status);
  }
  // Bytes of an extra "payload" column per batch.
  void SetPayloadBytes(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    payload_bytes_ = bytes;
  }
  // Sends this frame instead of the first scripted batch (a malformed one).
  void SetFirstFrame(std::string frame) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    first_frame_ = std::move(frame);
  }
  // Streams wait for `gate` before their first write.
  void SetGate(absl::Notification* gate) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    gate_ = gate;
  }
  // Completed Write() calls.
  int writes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return writes_;
  }
  // All scripted batches were written.
  bool drained() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return next_ == script_.size();
  }
  // GetBatches streams opened so far, and those that ended with a status
  // other than OK.
  int streams() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return streams_;
  }
  int failed_streams() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return failed_streams_;
  }
  // A Write() has begun and not returned: with a client that stopped reading,
  // the stream's flow-control window is full and the write waits for it.
  bool in_write() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return in_write_;
  }

  grpc::Status GetBatches(grpc::ServerContext* context, const proto::GetBatchesRequest* request,
                          grpc::ServerWriter<grpc::ByteBuffer>* writer) {
    absl::Notification* gate;
    {
      absl::MutexLock lock(&mu_);
      gate = gate_;
      ++streams_;
    }
    if (gate != nullptr) {
      while (!gate->WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
        if (context->IsCancelled()) return grpc::Status::CANCELLED;
      }
    }
    while (true) {
      service::WireBatch wire;
      proto::Batch& batch = wire.header;
      service::WireBatch end;
      proto::Batch& marker = end.header;  // after a split's last batch: its end-of-split marker
      {
        absl::MutexLock lock(&mu_);
        if (!first_frame_.empty()) {
          const grpc::Slice slice(first_frame_);
          first_frame_.clear();
          if (!writer->Write(grpc::ByteBuffer(&slice, 1))) return grpc::Status::CANCELLED;
          continue;
        }
        if (next_ == script_.size()) {
          if (!final_status_.ok()) ++failed_streams_;
          return final_status_;
        }
        const Item item = script_[next_++];
        batch.mutable_key()->set_job_id(request->job_id());
        batch.mutable_key()->set_consumer_index(request->consumer_index());
        batch.mutable_key()->set_epoch(item.epoch);
        batch.mutable_key()->set_position(item.position);
        batch.set_split_id(item.position);
        batch.set_batch_index(item.index);
        if (item.last) {
          *marker.mutable_key() = batch.key();
          marker.set_split_id(item.position);
          marker.set_batch_index(item.index + 1);
          marker.set_end_of_split(true);
        }
        const uint64_t id = BatchId(item.epoch, item.position, item.index);
        auto id_bytes = std::make_shared<uint64_t>(id);
        const int64_t one = 1;
        (void)service::AppendColumn(
            "id", record::DType::kInt64, {&one, 1},
            {reinterpret_cast<const uint8_t*>(id_bytes.get()), sizeof(id), id_bytes}, &wire);
        if (payload_bytes_ > 0) {
          auto payload = std::make_shared<std::string>(payload_bytes_, 'x');
          const int64_t shape[] = {1, static_cast<int64_t>(payload_bytes_)};
          (void)service::AppendColumn(
              "payload", record::DType::kUint8, shape,
              {reinterpret_cast<const uint8_t*>(payload->data()), payload->size(), payload}, &wire);
        }
        batch.add_global_indices(id);
        in_write_ = true;
      }
      const bool written = writer->Write(service::EncodeBatch(wire)) &&
                           (!marker.end_of_split() || writer->Write(service::EncodeBatch(end)));
      absl::MutexLock lock(&mu_);
      in_write_ = false;
      if (!written) return grpc::Status::CANCELLED;
      ++writes_;
    }
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Item> script_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int writes_ ABSL_GUARDED_BY(mu_) = 0;
  bool in_write_ ABSL_GUARDED_BY(mu_) = false;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_streams_ ABSL_GUARDED_BY(mu_) = 0;
  size_t payload_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification* gate_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
  std::string first_frame_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::client::testing

#endif  // SLUICE_TESTS_CLIENT_FAKES_H_
