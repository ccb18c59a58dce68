// Reading and checking saved iterator states (checkpoint.h).
#include "client/internal/checkpoint.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/internal/batch_iterator_impl.h"
#include "common/base/status_macros.h"
#include "common/record/checksum.h"

namespace sluice::client {
namespace {

// One saved state (`what` names it in errors), checked for its version and job name.
absl::StatusOr<proto::ConsumerCheckpoint> ParseState(const std::string& bytes,
                                                     const JobOptions& job,
                                                     const std::string& what) {
  proto::ConsumerCheckpoint checkpoint;
  if (!checkpoint.ParseFromString(bytes) || checkpoint.version() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not a sluice iterator state (BatchIterator::SaveState)"));
  }
  if (checkpoint.version() > kCheckpointVersion) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has version ", checkpoint.version(),
                                                   "; this client reads ", kCheckpointVersion,
                                                   ": upgrade the client"));
  }
  if (checkpoint.job_name() != job.job_name) {
    return absl::InvalidArgumentError(absl::StrCat(what, " belongs to job '", checkpoint.job_name(),
                                                   "', not job '", job.job_name, "'"));
  }
  return checkpoint;
}

// A single state restores the same consumer of the same world size, or any at an epoch boundary.
absl::Status CheckRestorable(const proto::ConsumerCheckpoint& checkpoint, const JobOptions& job,
                             const std::string& what) {
  // At an epoch boundary (nothing of the epoch returned) any consumer of any world size may
  // start from it; mid-epoch only the same consumer of the same world size.
  if (AtEpochBoundary(checkpoint)) return absl::OkStatus();
  if (checkpoint.num_consumers() != job.num_consumers) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " was saved mid-epoch ", checkpoint.epoch(), " with ", checkpoint.num_consumers(),
        " consumers; this job has ", job.num_consumers, ": pass the states of all ",
        checkpoint.num_consumers(),
        " old consumers (JobOptions.restore_states, --restore-state FILE,FILE...) to resume "
        "on another number of consumers"));
  }
  if (checkpoint.consumer_index() != job.consumer_index) {
    return absl::InvalidArgumentError(absl::StrCat(what, " belongs to consumer ",
                                                   checkpoint.consumer_index(), ", not consumer ",
                                                   job.consumer_index));
  }
  return absl::OkStatus();
}

}  // namespace

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
  return !checkpoint.finished() && checkpoint.splits().empty() &&
         checkpoint.complete_ranges().empty();
}

absl::StatusOr<std::vector<SlotProgress>> RestoredSlots(const proto::ConsumerCheckpoint& checkpoint,
                                                        uint64_t max_positions) {
  std::vector<SlotProgress> out;
  const auto& ranges = checkpoint.complete_ranges();
  if (ranges.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        "the restored state's complete ranges are not [begin, end) pairs: a damaged state");
  }
  uint64_t floor = 0;
  for (int i = 0; i < ranges.size(); i += 2) {
    if (ranges[i] < floor || ranges[i + 1] <= ranges[i] || ranges[i + 1] > max_positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the restored state's complete range [", ranges[i], ", ", ranges[i + 1],
          ") is not ascending or passes the job's ", max_positions, " slots: a damaged state"));
    }
    floor = ranges[i + 1];
  }
  for (int i = 0; i < ranges.size(); i += 2) {
    for (uint64_t p = ranges[i]; p < ranges[i + 1]; ++p)
      out.push_back({.epoch = checkpoint.epoch(), .position = p, .complete = true});
  }
  for (const proto::ClientSplitProgress& p : checkpoint.splits()) {
    out.push_back({.epoch = p.epoch(),
                   .position = p.position(),
                   .batches = p.delivered_batches(),
                   .complete = p.complete()});
  }
  return out;
}

absl::StatusOr<RestorePlan> PlanRestore(const JobOptions& job) {
  RestorePlan plan;
  if (job.restore_states.empty()) {
    if (job.restore_state.empty()) return plan;
    ASSIGN_OR_RETURN(plan.restore, ParseState(job.restore_state, job, "JobOptions.restore_state"));
    RETURN_IF_ERROR(CheckRestorable(*plan.restore, job, "JobOptions.restore_state"));
    return plan;
  }
  std::vector<proto::ConsumerCheckpoint> states;
  for (size_t i = 0; i < job.restore_states.size(); ++i) {
    ASSIGN_OR_RETURN(
        states.emplace_back(),
        ParseState(job.restore_states[i], job, absl::StrCat("JobOptions.restore_states[", i, "]")));
  }
  // All at an epoch boundary: any of them starts the epoch (the dispatcher resizes the job).
  if (std::all_of(states.begin(), states.end(), AtEpochBoundary) ||
      std::all_of(states.begin(), states.end(),
                  [](const proto::ConsumerCheckpoint& s) { return s.finished(); })) {
    plan.restore = states.front();
    return plan;
  }
  // As many consumers as before: this consumer's own state.
  if (states.front().num_consumers() == job.num_consumers) {
    for (size_t i = 0; i < states.size(); ++i) {
      if (states[i].consumer_index() != job.consumer_index) continue;
      const std::string what = absl::StrCat("JobOptions.restore_states[", i, "]");
      RETURN_IF_ERROR(CheckRestorable(states[i], job, what));
      plan.restore = states[i];
      return plan;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("JobOptions.restore_states has no state of consumer ", job.consumer_index,
                     " of ", job.num_consumers, ": pass the states of all old consumers"));
  }
  plan.resize_from = std::move(states);
  return plan;
}

}  // namespace sluice::client
