// libFuzzer target for a GetBatches request as a worker's service handler receives it: the
// request bytes are parsed the way GrpcWorkerService's BatchWriter parses them (a ByteBuffer,
// grpc::SerializationTraits), then WorkerImpl::OpenStream checks the caller, the job, the
// consumer index and the held splits, and the stream is polled and closed. Every field is the
// caller's (job id, consumer index, held splits with any keys and batch counts): a bad request
// must be an error Status to that caller, never a crash, and must leave no stream open.
//
// One worker serves every input: a scripted dispatcher gives it job 1 (owned by alice, two
// consumers, a small synthetic source) and job 2 (made in development mode) and no splits, so no
// producer thread runs and each input explores the same code whatever the machine's load.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "data_worker/worker/worker_impl.h"
#include "grpcpp/grpcpp.h"
#include "proto/pipeline.pb.h"
#include "proto/worker_service.grpc.pb.h"  // the request's SerializationTraits

namespace {

using sluice::service::Identity;

// Registers the worker and answers the first heartbeat with the two jobs.
class ScriptedDispatcher : public sluice::data_worker::DispatcherClient {
 public:
  absl::Status WorkerRegister(const sluice::proto::WorkerRegisterRequest&,
                              sluice::proto::WorkerRegisterResponse* response) override {
    response->set_worker_id(1);
    response->set_incarnation(1);
    return absl::OkStatus();
  }
  absl::Status WorkerHeartbeat(const sluice::proto::WorkerHeartbeatRequest&,
                               sluice::proto::WorkerHeartbeatResponse* response) override {
    response->set_incarnation(1);
    if (answered_) return absl::OkStatus();
    answered_ = true;
    sluice::proto::Pipeline pipeline;
    auto* synthetic = pipeline.mutable_source()->mutable_synthetic();
    synthetic->set_num_records(16);
    synthetic->set_height(8);
    synthetic->set_width(8);
    pipeline.add_nodes()->mutable_batch()->set_size(4);
    for (uint64_t id : {1, 2}) {
      sluice::proto::JobInfo* job = response->add_jobs();
      job->set_job_id(id);
      job->set_job_name(id == 1 ? "alice/train" : "anonymous");
      job->set_dataset_id(1);
      job->set_pipeline(pipeline.SerializeAsString());
      job->set_batch_size(4);
      job->mutable_config()->set_num_consumers(2);
    }
    return absl::OkStatus();
  }
  absl::Status DrainWorker(const sluice::proto::DrainWorkerRequest&,
                           sluice::proto::DrainWorkerResponse*) override {
    return absl::OkStatus();
  }
  absl::Status WorkerUnregister(const sluice::proto::WorkerUnregisterRequest&,
                                sluice::proto::WorkerUnregisterResponse*) override {
    return absl::OkStatus();
  }

 private:
  bool answered_ = false;  // only the worker's own thread calls
};

sluice::data_worker::WorkerImpl& Worker() {
  static sluice::data_worker::WorkerImpl* worker = [] {
    const auto root = std::filesystem::temp_directory_path() /
                      ("sluice-fuzz-batches-" + std::to_string(getpid()));
    std::filesystem::create_directories(root);
    sluice::data_worker::WorkerOptions options;
    options.address = "127.0.0.1:1";
    options.data_roots = {root.string()};
    options.threads = 1;
    options.capacity = 1;
    options.heartbeat_thread = false;
    options.limits.max_streams_per_identity = 4;
    auto created =
        sluice::data_worker::WorkerImpl::Create(options, std::make_unique<ScriptedDispatcher>());
    if (!created.ok() || !(*created)->Start().ok() || !(*created)->Heartbeat().ok()) std::abort();
    return created->release();
  }();
  return *worker;
}

Identity Caller(size_t size) {
  switch (size % 4) {
    case 0:
      return Identity::Development();
    case 1:
      return {.user = "alice", .groups = {"sluice:trainers"}};
    case 2:
      return {.user = "bob", .groups = {"sluice:trainers"}};
    default:
      return {.user = "ops", .groups = {"sluice:operators"}};
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::data_worker::WorkerImpl& worker = Worker();
  grpc::Slice slice(data, size);
  grpc::ByteBuffer buffer(&slice, 1);
  sluice::proto::GetBatchesRequest request;
  if (!grpc::SerializationTraits<sluice::proto::GetBatchesRequest>::Deserialize(&buffer, &request)
           .ok())
    return 0;  // the handler answers INVALID_ARGUMENT
  // Most inputs reach a job the worker knows, in the protocol version it speaks.
  if (size % 3 != 0) request.set_protocol_version(sluice::service::kProtocolVersion);
  if (size % 5 != 0) request.set_job_id(1 + size % 2);
  absl::StatusOr<uint64_t> stream = worker.OpenStream(request, Caller(size), [] {});
  if (!stream.ok()) return 0;
  for (int i = 0; i < 4; ++i) {
    sluice::data_worker::StreamEvent event = worker.PollStream(*stream);
    if (event.kind == sluice::data_worker::StreamEvent::kBatch) {
      worker.ReturnBatch(*stream, std::move(event.batch));
    } else if (event.kind == sluice::data_worker::StreamEvent::kEnd) {
      break;
    }
  }
  worker.CloseStream(*stream);
  return 0;
}
