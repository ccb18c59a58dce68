// Reading and checking a saved iterator state (checkpoint.h).
#include "client/internal/checkpoint.h"

#include "absl/strings/str_cat.h"
#include "client/internal/batch_iterator_impl.h"
#include "common/record/checksum.h"

namespace sluice::client {

// A state saved from another job or spec would silently skip or repeat records.
absl::Status CheckSameJob(const proto::ConsumerCheckpoint& checkpoint, const JobOptions& job,
                          uint64_t fingerprint) {
  if (checkpoint.job_fingerprint() == 0 || checkpoint.job_fingerprint() == fingerprint)
    return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "JobOptions.restore_state was saved by job '", checkpoint.job_name(),
      "' over another pipeline, dataset, seed, split size or remainder mode "
      "than this job '",
      job.job_name, "' has (fingerprint ", record::ChecksumHex(checkpoint.job_fingerprint()),
      ", this job ", record::ChecksumHex(fingerprint),
      "): restore a state only into the job and spec it was saved from"));
}

bool AtEpochBoundary(const proto::ConsumerCheckpoint& checkpoint) {
  return !checkpoint.finished() && checkpoint.splits().empty();
}

// JobOptions::restore_state, checked against the job it is meant to continue.
absl::StatusOr<proto::ConsumerCheckpoint> ParseCheckpoint(const JobOptions& job) {
  proto::ConsumerCheckpoint checkpoint;
  if (!checkpoint.ParseFromString(job.restore_state) || checkpoint.version() == 0) {
    return absl::InvalidArgumentError(
        "JobOptions.restore_state is not a sluice iterator state "
        "(BatchIterator::SaveState)");
  }
  if (checkpoint.version() > kCheckpointVersion) {
    return absl::InvalidArgumentError(absl::StrCat("JobOptions.restore_state has version ",
                                                   checkpoint.version(), "; this client reads ",
                                                   kCheckpointVersion, ": upgrade the client"));
  }
  if (checkpoint.job_name() != job.job_name) {
    return absl::InvalidArgumentError(absl::StrCat("JobOptions.restore_state belongs to job '",
                                                   checkpoint.job_name(), "', not job '",
                                                   job.job_name, "'"));
  }
  // At an epoch boundary (nothing of the epoch returned) any consumer of any world size may
  // start from it; mid-epoch only the same consumer of the same world size.
  if (AtEpochBoundary(checkpoint)) return checkpoint;
  if (checkpoint.num_consumers() != job.num_consumers) {
    return absl::InvalidArgumentError(
        absl::StrCat("JobOptions.restore_state was saved mid-epoch ", checkpoint.epoch(), " with ",
                     checkpoint.num_consumers(), " consumers; this job has ", job.num_consumers,
                     ": the number of consumers can change only at an epoch boundary"));
  }
  if (checkpoint.consumer_index() != job.consumer_index) {
    return absl::InvalidArgumentError(absl::StrCat("JobOptions.restore_state belongs to consumer ",
                                                   checkpoint.consumer_index(), ", not consumer ",
                                                   job.consumer_index));
  }
  return checkpoint;
}

}  // namespace sluice::client
