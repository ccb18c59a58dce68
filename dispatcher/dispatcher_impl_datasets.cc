// DispatcherImpl, continued: checking a registered dataset's shard record counts against the
// dataset (a synthetic source here, a Unirecord manifest through a worker's heartbeat). The
// protocol is in dispatcher_impl.h, "Datasets".

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dispatcher/dispatcher_impl.h"
#include "proto/pipeline.pb.h"

namespace sluice::dispatcher {

bool DispatcherImpl::HasDataset(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  return state_.FindDataset(id) != nullptr;
}

absl::Status DispatcherImpl::CheckCountsLocally(const proto::RegisterDatasetRequest& request,
                                                std::string* path) const {
  proto::Pipeline spec;
  if (!spec.ParseFromString(request.pipeline())) {
    return absl::InvalidArgumentError(
        "RegisterDataset: the pipeline does not parse as "
        "sluice.proto.Pipeline, so its shard "
        "record counts cannot be checked (client and dispatcher versions "
        "differ?)");
  }
  const proto::SourceNode& source = spec.source();
  if (source.has_synthetic()) {
    const int64_t n = source.synthetic().num_records();
    if (request.shard_record_counts_size() != 1 || n <= 0 ||
        request.shard_record_counts(0) != static_cast<uint64_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterDataset: the synthetic source has ", n,
                       " records in one shard, the request's shard_record_counts are [",
                       absl::StrJoin(request.shard_record_counts(), ", "), "]"));
    }
    return absl::OkStatus();
  }
  if (source.has_dataset() && !source.dataset().path().empty()) {
    *path = source.dataset().path();
    return absl::NotFoundError("a worker reads the manifest");
  }
  return absl::InvalidArgumentError(
      "RegisterDataset: the pipeline's source is neither a Unirecord dataset "
      "nor synthetic, so "
      "its shard record counts cannot be checked (convert an image folder with "
      "`sluice record "
      "convert`)");
}

absl::Status DispatcherImpl::Verdict(const Verification& v, uint64_t worker_id,
                                     const std::string& address,
                                     const proto::DatasetDescription& description) {
  const std::string reader = absl::StrCat("data worker ", worker_id, " at ", address);
  if (description.error_code() != 0) {
    const int32_t raw = description.error_code();
    const auto code =
        raw > 0 && raw <= 16 ? static_cast<absl::StatusCode>(raw) : absl::StatusCode::kUnknown;
    return absl::Status(
        code, absl::StrCat("RegisterDataset: ", reader, " could not read the manifest of dataset '",
                           v.path, "': ", description.error_message()));
  }
  const auto& claimed = v.request.shard_record_counts();
  const auto& read = description.shard_record_counts();
  if (claimed.size() != read.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterDataset: dataset '", v.path, "' has ", read.size(), " shards (read by ", reader,
        "), the request's shard_record_counts list ", claimed.size()));
  }
  for (int i = 0; i < read.size(); ++i) {
    if (claimed[i] != read[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterDataset: shard ", i, " of dataset '", v.path, "' has ", read[i],
                       " records (read by ", reader, "), the request says ", claimed[i]));
    }
  }
  return absl::OkStatus();
}

bool DispatcherImpl::VerificationToHand(absl::Time now) const {
  for (const Verification& v : verifications_) {
    if (v.verdict.has_value()) continue;
    if (v.worker_id == 0 || state_.FindWorker(v.worker_id) == nullptr ||
        now - v.handed >= 2 * options_.heartbeat_interval)
      return true;
  }
  return false;
}

void DispatcherImpl::ExchangeDescriptions(const proto::WorkerHeartbeatRequest& request,
                                          const DispatcherState::Worker& worker,
                                          proto::WorkerHeartbeatResponse* response) {
  for (const proto::DatasetDescription& d : request.described()) {
    for (Verification& v : verifications_) {
      if (v.ticket != d.ticket() || v.verdict.has_value()) continue;
      v.verdict = Verdict(v, worker.id, worker.address, d);
      if (v.verdict->ok()) {
        logger_->info("data worker {} confirmed the {} shard record counts of '{}'", worker.id,
                      v.request.shard_record_counts_size(), v.path);
      } else {
        logger_->warn("{}", std::string(v.verdict->message()));
      }
    }
  }
  if (worker.draining) return;
  const absl::Time now = clock_->Now();
  for (Verification& v : verifications_) {
    if (v.verdict.has_value()) continue;
    if (v.worker_id != 0 && state_.FindWorker(v.worker_id) != nullptr &&
        now - v.handed < 2 * options_.heartbeat_interval)
      continue;  // another worker has it
    v.worker_id = worker.id;
    v.handed = now;
    proto::DescribeTask* task = response->add_describe();
    task->set_ticket(v.ticket);
    task->set_pipeline(v.request.pipeline());
  }
}

void DispatcherImpl::AnswerVerifications(bool stopping) {
  std::vector<Verification> answer;
  {
    absl::MutexLock lock(&mu_);
    if (verifications_.empty()) return;
    const absl::Time now = clock_->Now();
    std::vector<Verification> held;
    for (Verification& v : verifications_) {
      if (stopping && !v.verdict.has_value()) {
        v.verdict = absl::UnavailableError("the dispatcher is stopping: retry RegisterDataset");
      } else if (!v.verdict.has_value() && now >= v.deadline) {
        v.verdict = absl::UnavailableError(absl::StrCat(
            "RegisterDataset: no data worker read the manifest of dataset '", v.path, "' within ",
            absl::FormatDuration(options_.verify_timeout), " to check its shard record counts (",
            state_.workers().empty() ? "no worker is registered" : "none answered",
            "): start a worker whose --data-root holds the dataset, then "
            "retry"));
      }
      if (v.verdict.has_value()) {
        answer.push_back(std::move(v));
      } else {
        held.push_back(std::move(v));
      }
    }
    verifications_ = std::move(held);
  }
  for (Verification& v : answer) {
    if (!v.verdict->ok()) {
      v.done(*std::move(v.verdict));
      continue;
    }
    RunAsync(&DispatcherImpl::DoRegisterDataset, v.request, v.response, std::move(v.done));
  }
}

}  // namespace sluice::dispatcher
