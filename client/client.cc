#include "sluice/client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/internal/batch_iterator_impl.h"
#include "client/internal/channel_options.h"
#include "client/internal/checkpoint.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/retry.h"
#include "common/base/status_macros.h"
#include "common/record/checksum.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"
#include "common/service/retry_policy.h"
#include "common/service/shared_memory_ring.h"
#include "common/tensor_kernels/finish.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/grpcpp.h"
#include "proto/dispatcher.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"

namespace sluice {
namespace {

using client::AtEpochBoundary;
using client::CheckSameJob;
using client::DispatcherError;
using client::kProtocolVersion;
using client::PlanRestore;
using client::RestorePlan;

// Deterministic bytes of `pipeline`: the dataset's identity (the dispatcher
// fingerprints them).
std::string SerializeDeterministic(const proto::Pipeline& pipeline) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    pipeline.SerializeToCodedStream(&coded);
  }
  return out;
}

// Asks the worker at `address` for the shard record counts of the dataset
// `pipeline` (serialized) reads.
absl::StatusOr<std::vector<uint64_t>> DescribeDatasetAt(const std::string& address,
                                                        const std::string& pipeline,
                                                        const ClientOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   service::CreateChannel(address, client::ToChannelOptions(options, 0)));
  std::unique_ptr<proto::WorkerService::Stub> worker = proto::WorkerService::NewStub(channel);
  proto::DescribeDatasetRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_pipeline(pipeline);
  proto::DescribeDatasetResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  const grpc::Status status = worker->DescribeDataset(&context, request, &response);
  if (!status.ok()) {
    return service::FromGrpcStatus(status,
                                   absl::StrCat("data worker at ", address, ": DescribeDataset"));
  }
  return std::vector<uint64_t>(response.shard_record_counts().begin(),
                               response.shard_record_counts().end());
}

// Records per shard of the pipeline's source, as the dispatcher cuts splits
// from them. A synthetic source states its size. A dataset's sizes are in its
// manifest, which a data worker reads (DescribeDataset): trainers need not
// mount the data, and the dispatcher never opens it. The active workers the
// dispatcher lists are asked in turn; while none answers (a cluster starting,
// workers restarting) the client waits up to options.connect_timeout. A
// verdict on the dataset (no manifest, outside the worker's --data-root, ...)
// is returned at once, naming the worker.
absl::StatusOr<std::vector<uint64_t>> ShardRecordCounts(
    const proto::Pipeline& spec, const std::string& pipeline, const ClientOptions& options,
    proto::DispatcherService::StubInterface& dispatcher) {
  const proto::SourceNode& source = spec.source();
  switch (source.kind_case()) {
    case proto::SourceNode::kDataset:
      if (source.dataset().path().empty()) {
        return absl::InvalidArgumentError("pipeline source.dataset.path is empty");
      }
      break;
    case proto::SourceNode::kImageFolder:
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline source '", source.image_folder().path(),
                       "' is an image folder; the data service reads Unirecord "
                       "datasets: convert it first "
                       "with `sluice record convert`"));
    case proto::SourceNode::kSynthetic:
      if (source.synthetic().num_records() <= 0) {
        return absl::InvalidArgumentError("pipeline source.synthetic.num_records must be > 0");
      }
      return std::vector<uint64_t>{static_cast<uint64_t>(source.synthetic().num_records())};
    default:
      return absl::InvalidArgumentError("the pipeline has no source");
  }
  // One round: every active worker the dispatcher lists, until one answers.
  std::vector<uint64_t> counts;
  auto ask_workers = [&]() -> absl::Status {
    proto::GetStatusRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_starting_workers(-1);
    proto::GetStatusResponse status;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    RETURN_IF_ERROR(DispatcherError(dispatcher.GetStatus(&context, request, &status),
                                    options.dispatcher_address, "GetStatus"));
    absl::Status last = absl::UnavailableError("no data worker is registered");
    for (const proto::WorkerStatus& worker : status.workers()) {
      if (worker.state() != "active") continue;
      absl::StatusOr<std::vector<uint64_t>> answer =
          DescribeDatasetAt(worker.address(), pipeline, options);
      if (answer.ok()) {
        counts = *std::move(answer);
        return absl::OkStatus();
      }
      // A worker that is going away or overloaded; another may answer.
      if (!service::IsRetryable(answer.status().code())) return answer.status();
      last = absl::UnavailableError(answer.status().message());
    }
    return last;
  };
  RetryOptions retry;
  retry.initial_backoff = absl::Milliseconds(50);
  retry.max_backoff = absl::Seconds(1);
  retry.deadline = options.connect_timeout;
  const absl::Status asked = RetryWithBackoff(ask_workers, retry, options.clock);
  if (asked.ok()) return counts;
  if (asked.code() != absl::StatusCode::kUnavailable) return asked;
  return absl::UnavailableError(
      absl::StrCat("no data worker of the dispatcher at ", options.dispatcher_address,
                   " read the manifest of dataset '", source.dataset().path(), "' within ",
                   absl::FormatDuration(options.connect_timeout),
                   " (the dataset's shard sizes come from a worker; is one running with a "
                   "--data-root that holds the dataset?): ",
                   asked.message()));
}

absl::StatusOr<uint64_t> BatchSize(const proto::Pipeline& pipeline) {
  uint64_t size = 1;  // no batch node: one element per batch
  for (const proto::PipelineNode& node : pipeline.nodes()) {
    if (!node.has_batch()) continue;
    if (node.batch().size() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline batch.size must be > 0, got ", node.batch().size()));
    }
    size = static_cast<uint64_t>(node.batch().size());
  }
  return size;
}

// ConsumerCheckpoint.job_fingerprint of `job` over a dataset of `counts` records per shard.
// Not num_epochs (a run may be extended) nor the consumer count (it may change at an epoch
// boundary, or mid-epoch through restore_states; PlanRestore checks it).
uint64_t JobFingerprint(const JobOptions& job, const std::string& pipeline,
                        const std::vector<uint64_t>& counts) {
  std::string bytes = pipeline;
  for (uint64_t c : counts) absl::StrAppend(&bytes, ",", c);
  absl::StrAppend(&bytes, ";seed=", job.seed, ";split=", job.split_size,
                  ";drop=", job.drop_remainder ? 1 : 0, ";parallel=", job.parallel_epochs ? 1 : 0);
  return std::max<uint64_t>(record::Checksum(bytes), 1);
}

class DataServiceClientImpl final : public DataServiceClient {
 public:
  DataServiceClientImpl(ClientOptions options,
                        std::shared_ptr<proto::DispatcherService::StubInterface> stub)
      : options_(std::move(options)), stub_(std::move(stub)) {}

  absl::StatusOr<std::unique_ptr<BatchIterator>> Open(const JobOptions& job) override {
    if (job.num_consumers == 0 || job.consumer_index >= job.num_consumers) {
      return absl::InvalidArgumentError(
          absl::StrCat("JobOptions.consumer_index ", job.consumer_index,
                       " must be < num_consumers ", job.num_consumers));
    }
    if (absl::StatusOr<kernels::FinishMode> finish =
            kernels::ParseFinishMode(job.pipeline.finish());
        !finish.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline ", finish.status().message()));
    }
    ASSIGN_OR_RETURN(RestorePlan plan, PlanRestore(job));
    std::optional<proto::ConsumerCheckpoint> restore = std::move(plan.restore);
    ASSIGN_OR_RETURN(uint64_t batch_size, BatchSize(job.pipeline));
    const std::string pipeline = SerializeDeterministic(job.pipeline);
    ASSIGN_OR_RETURN(std::vector<uint64_t> counts,
                     ShardRecordCounts(job.pipeline, pipeline, options_, *stub_));
    const uint64_t fingerprint = JobFingerprint(job, pipeline, counts);
    if (restore.has_value()) RETURN_IF_ERROR(CheckSameJob(*restore, job, fingerprint));
    for (const proto::ConsumerCheckpoint& state : plan.resize_from)
      RETURN_IF_ERROR(CheckSameJob(state, job, fingerprint));

    proto::RegisterDatasetRequest reg;
    reg.set_protocol_version(kProtocolVersion);
    reg.set_pipeline(pipeline);
    for (uint64_t c : counts) reg.add_shard_record_counts(c);
    reg.set_batch_size(batch_size);
    proto::RegisterDatasetResponse dataset;
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
      RETURN_IF_ERROR(DispatcherError(stub_->RegisterDataset(&context, reg, &dataset),
                                      options_.dispatcher_address, "RegisterDataset"));
    }

    proto::GetOrCreateJobRequest get_job;
    get_job.set_protocol_version(kProtocolVersion);
    get_job.set_job_name(job.job_name);
    get_job.set_dataset_id(dataset.dataset_id());
    proto::JobConfig* config = get_job.mutable_config();
    config->set_mode(job.parallel_epochs ? proto::PROCESSING_MODE_PARALLEL_EPOCHS
                                         : proto::PROCESSING_MODE_DISTRIBUTED_EPOCH);
    config->set_seed(job.seed);
    config->set_num_epochs(job.num_epochs);
    config->set_num_consumers(job.num_consumers);
    config->set_deterministic(job.deterministic);
    config->set_remainder(job.drop_remainder ? proto::REMAINDER_MODE_DROP
                                             : proto::REMAINDER_MODE_PAD);
    config->set_split_size(job.split_size);
    config->set_priority(job.priority);
    config->set_min_workers(job.min_workers);
    if (job.sharing == "auto") {
      config->set_sharing(proto::SHARING_MODE_AUTO);
    } else if (!job.sharing.empty() && job.sharing != "off") {
      return absl::InvalidArgumentError(
          absl::StrCat("JobOptions.sharing '", job.sharing, "' must be 'auto' or 'off'"));
    }
    if (job.cache == "auto") {
      config->set_cache(proto::CACHE_MODE_AUTO);
    } else if (!job.cache.empty() && job.cache != "off") {
      return absl::InvalidArgumentError(
          absl::StrCat("JobOptions.cache '", job.cache, "' must be 'auto' or 'off'"));
    }
    if (restore.has_value() && AtEpochBoundary(*restore)) {
      get_job.set_restore_at_boundary(true);
      get_job.set_restore_epoch(restore->epoch());
    } else if (restore.has_value()) {
      // Mid-epoch: the slots the state counts in are those of the job's split size, and of the
      // re-partitioned layout if it was saved in such an epoch.
      if (restore->split_size() != 0) config->set_split_size(restore->split_size());
      if (restore->has_resized()) *get_job.mutable_restore_layout() = restore->resized();
    }
    for (const proto::ConsumerCheckpoint& state : plan.resize_from) {
      *get_job.add_resize_from() = state;
      if (state.split_size() != 0) config->set_split_size(state.split_size());
    }
    proto::GetOrCreateJobResponse created;
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
      RETURN_IF_ERROR(DispatcherError(stub_->GetOrCreateJob(&context, get_job, &created),
                                      options_.dispatcher_address, "GetOrCreateJob"));
    }
    options_.logger->info("sluice client: job {} ('{}', dataset {}), consumer {} of {}",
                          created.job_id(), job.job_name, dataset.dataset_id(), job.consumer_index,
                          job.num_consumers);
    if (created.already_finished()) {
      options_.logger->warn(
          "sluice client: job '{}' had already read all its epochs when this consumer joined: "
          "it reads nothing. The dispatcher keeps a finished job for its late readers for a "
          "quarter of its consumer timeout after their last report; to read the data again, "
          "use another job name",
          job.job_name);
    }

    client::IteratorParams params;
    params.options = options_;
    params.dispatcher = stub_;
    params.job_id = created.job_id();
    params.consumer_index = job.consumer_index;
    params.deterministic = job.deterministic;
    params.parallel_epochs = job.parallel_epochs;
    params.job_name = job.job_name;
    params.num_consumers = job.num_consumers;
    params.num_epochs = job.num_epochs;
    params.job_fingerprint = fingerprint;
    if (restore.has_value()) {
      // A consumer has at most the epoch's splits, and a re-partition cuts a few more.
      ASSIGN_OR_RETURN(params.restored_slots,
                       client::RestoredSlots(*restore, 2 * created.splits_per_epoch() + 1024));
    }
    params.restore = std::move(restore);
    params.restore_ranges = created.restore_ranges();
    params.split_size = created.config().split_size();
    if (created.has_resized()) params.resized = created.resized();
    ASSIGN_OR_RETURN(std::unique_ptr<client::BatchIteratorImpl> it,
                     client::BatchIteratorImpl::Create(std::move(params)));
    return std::unique_ptr<BatchIterator>(std::move(it));
  }

 private:
  ClientOptions options_;
  std::shared_ptr<proto::DispatcherService::StubInterface> stub_;
};

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBytes:
      return "bytes";
    case DType::kString:
      return "string";
    case DType::kUint8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat16:
      return "float16";
    case DType::kFloat32:
      return "float32";
  }
  return "unknown";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
      return 2;
    default:
      return 1;
  }
}

absl::StatusOr<std::unique_ptr<DataServiceClient>> DataServiceClient::Create(
    ClientOptions options) {
  if (options.dispatcher_address.empty()) {
    return absl::InvalidArgumentError("ClientOptions.dispatcher_address is empty");
  }
  if (options.prefetch_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.prefetch_batches must be >= 1, got ", options.prefetch_batches));
  }
  if (options.shared_memory_bytes != 0 && (options.shared_memory_bytes < service::kMinRingBytes ||
                                           options.shared_memory_bytes > service::kMaxRingBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.shared_memory_bytes must be 0 (off) or between ", service::kMinRingBytes,
        " and ", service::kMaxRingBytes, ", got ", options.shared_memory_bytes));
  }
  if (options.logger == nullptr) options.logger = NullLogger();
  if (options.clock == nullptr) options.clock = RealClock::Get();
  const std::string& address = options.dispatcher_address;
  const absl::Time deadline = absl::Now() + options.connect_timeout;

  // Transport security (TLS, bearer token): common/service/channel_factory.h.
  // A TLS mismatch fails here at once, saying which side is wrong.
  const service::ChannelOptions channel_options =
      client::ToChannelOptions(options, /*max_receive_message_bytes=*/0);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   service::CreateChannel(address, channel_options));
  if (absl::Status connected =
          service::WaitForConnected(*channel, address, channel_options, deadline);
      !connected.ok()) {
    // Unavailable: a TLS mismatch, with its reason.
    if (connected.code() != absl::StatusCode::kDeadlineExceeded) return connected;
    return absl::UnavailableError(
        absl::StrCat("cannot reach the sluice dispatcher at ", address,
                     ": no gRPC connection within ", absl::FormatDuration(options.connect_timeout),
                     " (is sluice-dispatcher running there, and is the address "
                     "host:port right?)"));
  }
  std::shared_ptr<proto::DispatcherService::StubInterface> stub =
      proto::DispatcherService::NewStub(channel);

  // Does a dispatcher of our protocol answer? An unknown job is the expected
  // answer.
  proto::GetJobStateRequest ping;
  ping.set_protocol_version(kProtocolVersion);
  ping.set_job_id(0);
  proto::GetJobStateResponse ignored;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + options.rpc_timeout)));
  const grpc::Status status = stub->GetJobState(&context, ping, &ignored);
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::INVALID_ARGUMENT:
      break;
    default:
      return DispatcherError(status, address, "GetJobState");
  }
  return std::unique_ptr<DataServiceClient>(
      new DataServiceClientImpl(std::move(options), std::move(stub)));
}

}  // namespace sluice
