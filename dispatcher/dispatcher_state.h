// DispatcherState: everything the dispatcher must remember across a restart
// (datasets, jobs, each consumer's split sequence and progress, workers and
// what they hold), changed only through Apply(const proto::Update&). No I/O, no
// clock: replaying the same Updates in order rebuilds the same state, which is
// what a durable journal (dispatcher/journal.h) needs.
//
// Not thread-safe; DispatcherImpl owns one and guards it with its mutex. The
// decisions (which split goes to which worker, when a worker is lost) are
// DispatcherImpl's; Apply only records them and checks they are consistent. See
// dispatcher_impl.h for the protocol.
//
// Size: dispatcher_state.cc is ~650 lines: one Apply case and one consistency
// check per Update kind, kept together so that replay has a single home.
#ifndef SLUICE_DISPATCHER_DISPATCHER_STATE_H_
#define SLUICE_DISPATCHER_DISPATCHER_STATE_H_

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/record/sharding.h"
#include "dispatcher/cache_catalog.h"
#include "dispatcher/repartition.h"
#include "proto/dispatcher.pb.h"
#include "proto/worker.pb.h"

namespace sluice::dispatcher {

// The most splits and consumers one job may have, whatever the flags say (--max-splits-per-job
// and --max-consumers-per-job are checked against them at start): a journal record asking for
// more does not replay (it would allocate by a number nobody checked).
inline constexpr uint64_t kMaxJobSplits = uint64_t{1} << 24;
inline constexpr uint32_t kMaxJobConsumers = uint32_t{1} << 16;

// (job, consumer, epoch, position): one slot of a consumer's split sequence.
struct SlotKey {
  uint64_t job_id = 0;
  uint32_t consumer = 0;
  uint64_t epoch = 0;
  uint64_t position = 0;

  auto operator<=>(const SlotKey&) const = default;
  static SlotKey FromProto(const proto::SplitKey& key);
  proto::SplitKey ToProto() const;
};

class DispatcherState {
 public:
  struct Dataset {
    uint64_t id = 0;
    uint64_t fingerprint = 0;
    std::string pipeline;
    std::vector<uint64_t> shard_record_counts;
    uint64_t batch_size = 0;
  };

  struct Slot {
    record::SlotPieces pieces;  // what it reads (record::ConsumerSlots)
    // Of the batches `pieces` make, [first_batch, end_batch) (end 0: to the end): a slot of a
    // re-partitioned epoch (repartition.h); 0, 0 otherwise.
    uint64_t first_batch = 0;
    uint64_t end_batch = 0;
    proto::SplitStatus status = proto::SPLIT_STATUS_PENDING;
    uint64_t worker_id = 0;  // when ASSIGNED
    uint64_t delivered_batches = 0;
    uint64_t produced_batches = 0;
    bool finished_producing = false;
    uint64_t skip_batches = 0;  // of the current/last assignment
    uint32_t assignments = 0;
    // Soft (the worker reports it every heartbeat): it fell behind its production group and
    // waits for its consumer (WorkerSplitProgress.detached).
    bool detached = false;

    // Position, status, worker and counters into `out` (what the journal's snapshot and
    // GetJobState both carry; each adds its own fields).
    void ToProto(uint64_t position, proto::SplitState* out) const;
  };

  struct Consumer {
    uint32_t index = 0;
    uint64_t epoch = 0;
    bool finished = false;
    uint64_t done = 0;        // slots of `epoch` that are DONE
    std::vector<Slot> slots;  // of `epoch`; position = index (empty in PARALLEL_EPOCHS mode)
    // Indexes of `slots`, kept by Apply one slot at a time, so that neither assigning a split
    // nor applying a report walks every slot (a job may have 1,000,000): positions of PENDING
    // slots, of AWAITING_PROGRESS slots, of ASSIGNED slots their worker paused (detached), and
    // the count of ASSIGNED slots whose worker has not finished producing them.
    std::set<uint64_t> pending;
    std::set<uint64_t> awaiting;
    std::set<uint64_t> detached;
    uint32_t in_production = 0;
    // The following epoch (epoch + 1, same index), opened as soon as this one has nothing left
    // to hand out (no PENDING or AWAITING_PROGRESS slot), so that its first slots are produced
    // while this epoch's last batches are still being read; it becomes the consumer's epoch
    // when this one is done. Null otherwise (and in the last epoch).
    std::unique_ptr<Consumer> next;

    // The consumer's slots of `epoch`: this, its `next`, or nullptr.
    Consumer* OfEpoch(uint64_t epoch);
    const Consumer* OfEpoch(uint64_t epoch) const;
  };

  struct Job {
    uint64_t id = 0;
    std::string name;
    uint64_t dataset_id = 0;
    proto::JobConfig config;  // normalized
    std::vector<record::Split> splits;
    std::vector<Consumer> consumers;
    // A job resumed mid-epoch on another number of consumers: the layout of that epoch.
    std::optional<proto::ResizedEpoch> resized;
    Layout resized_layout;  // ResizedLayout(*resized, ...)
    // `cache: auto` (dispatcher/cache_auto.h): the decision, made once and journaled.
    std::optional<proto::CacheDecision> cache_decision;

    bool finished() const;
  };

  struct Worker {
    uint64_t id = 0;
    std::string address;
    uint32_t capacity = 1;
    bool draining = false;
    std::set<SlotKey> slots;  // ASSIGNED to it
  };

  DispatcherState() = default;
  DispatcherState(const DispatcherState&) = delete;
  DispatcherState& operator=(const DispatcherState&) = delete;

  // Records one change. FailedPrecondition/NotFound/InvalidArgument when the
  // update does not fit the current state (a corrupt or reordered journal); the
  // state is then unchanged.
  absl::Status Apply(const proto::Update& update);
  // The preconditions Apply would check, without changing anything: the dispatcher validates,
  // then journals, then applies, so the journal never holds an update that does not apply.
  absl::Status Validate(const proto::Update& update) const;

  // Updates that rebuild this state when applied, in order, to an empty one (the journal's
  // snapshot).
  proto::DispatcherSnapshot Snapshot() const;

  // The slots of `consumer`'s share in `epoch`, in position order: record::ConsumerSlots
  // over the job's splits with its seed, remainder mode and split size (equal shares at record
  // granularity). Pure; also used by tests.
  static absl::StatusOr<std::vector<record::SlotPieces>> ConsumerSlots(
      const proto::JobConfig& config, const std::vector<record::Split>& splits, uint32_t consumer,
      uint64_t epoch);

  // The layout of the re-partitioned epoch `resized` of a job of `config` (any num_consumers),
  // its `splits` and `batch_size`: computed (Repartition over the old layout, itself ordinary
  // or `previous`'s), or read from the listed form. InvalidArgument if `resized` does not fit.
  static absl::StatusOr<Layout> ResizedLayout(const proto::ResizedEpoch& resized,
                                              const proto::JobConfig& config,
                                              const std::vector<record::Split>& splits,
                                              uint64_t batch_size);

  // The slots of `consumer` in `epoch` of `job`: its re-partitioned layout in that epoch, else
  // ConsumerSlots (whole pieces).
  static absl::StatusOr<std::vector<SlotSource>> SlotsOf(const Job& job, uint32_t consumer,
                                                         uint64_t epoch);

  const Dataset* FindDataset(uint64_t id) const;
  const Job* FindJob(uint64_t id) const;
  const Job* FindJobByName(const std::string& name) const;  // nullptr for ""
  const Worker* FindWorker(uint64_t id) const;
  // nullptr if `key` is not a slot of its consumer's current epoch.
  const Slot* FindSlot(const SlotKey& key) const;

  const std::map<uint64_t, Dataset>& datasets() const { return datasets_; }
  const std::map<uint64_t, Job>& jobs() const { return jobs_; }
  const std::map<uint64_t, Worker>& workers() const { return workers_; }

  // Ids for the next RegisterDataset/CreateJob/RegisterWorker update.
  uint64_t NextDatasetId() const { return next_dataset_id_; }
  uint64_t NextJobId() const { return next_job_id_; }
  uint64_t NextWorkerId() const { return next_worker_id_; }
  // See UpdateIdFloor.incarnation; 0 until set.
  uint64_t incarnation() const { return incarnation_; }
  // A digest of the registered workers' (id, address) pairs: equal sets give equal digests
  // (order-free, kept by Apply in O(1)). Names the task list of ClientHeartbeat.
  uint64_t workers_digest() const { return workers_digest_; }
  // Cache nodes' committed files (cache_catalog.h; Update cases cache_*).
  const CacheCatalog& caches() const { return caches_; }

 private:
  absl::Status ApplyRegisterDataset(const proto::UpdateRegisterDataset& u);
  absl::Status ApplyCreateJob(const proto::UpdateCreateJob& u);
  absl::Status ApplyRegisterWorker(const proto::UpdateRegisterWorker& u);
  absl::Status ApplyAssignSplit(const proto::UpdateAssignSplit& u);
  absl::Status ApplyClientProgress(const proto::UpdateClientProgress& u);
  absl::Status ApplyWorkerProgress(const proto::UpdateWorkerProgress& u);
  absl::Status ApplyWorkerLost(const proto::UpdateWorkerLost& u);
  absl::Status ApplyDrainWorker(const proto::UpdateDrainWorker& u);
  absl::Status ApplyReleaseSplits(const proto::UpdateReleaseSplits& u);
  absl::Status ApplyConsumerState(const proto::UpdateConsumerState& u);
  absl::Status ApplyRemoveJob(const proto::UpdateRemoveJob& u);
  absl::Status ApplyIdFloor(const proto::UpdateIdFloor& u);
  // A dataset may be forgotten once no job uses it.
  absl::Status CheckRemoveDataset(const proto::UpdateRemoveDataset& u) const;
  absl::Status ApplyRemoveDataset(const proto::UpdateRemoveDataset& u);

  // Fills consumer.slots for consumer.epoch (or marks it finished).
  absl::Status StartEpoch(Job& job, Consumer& consumer);
  // Opens consumer.next when its epoch has nothing left to hand out (Consumer::next).
  absl::Status OpenNextEpoch(Job& job, Consumer& consumer);
  // Applies the entries of `progress` about target.epoch to its slots (delivered counts,
  // completions) and makes its AWAITING_PROGRESS slots PENDING.
  void ApplyProgress(
      const Job& job, Consumer& target,
      const google::protobuf::RepeatedPtrField<proto::ClientSplitProgress>& progress);
  // Sets `target`'s slots from a saved state `u` (of target.epoch, either form, checked by
  // CheckSlots) and their `pieces`.
  void RestoreSlots(const Job& job, Consumer& target, const proto::UpdateConsumerState& u,
                    std::vector<SlotSource> pieces);
  // InvalidArgument unless `u` describes `num_slots` slots (listed: one per slot; compact: its
  // ranges and positions within them).
  static absl::Status CheckSlots(const proto::UpdateConsumerState& u, const Job& job,
                                 uint64_t num_slots);
  // The consumer state update that rebuilds `c`; `lookahead`: `c` is a consumer's `next`.
  static void SnapshotConsumer(uint64_t job_id, const Consumer& c, bool lookahead,
                               proto::UpdateConsumerState* out);
  Slot* MutableSlot(const SlotKey& key);
  // The slot goes back to AWAITING_PROGRESS: reassigned after its consumer's
  // next report.
  void Release(Worker& worker, const SlotKey& key);
  // What a slot counts for in its consumer's indexes (Consumer::pending, ...).
  struct SlotClass {
    bool pending = false;
    bool awaiting = false;
    bool detached = false;
    bool producing = false;
    bool operator==(const SlotClass&) const = default;
  };
  static SlotClass Classify(const Slot& slot);
  // Recomputes all of consumer's indexes from its slots.
  static void Reindex(Consumer& consumer);
  // Moves slot `position` of `consumer` from the indexes of `before` (its class before it
  // changed) to those of its class now.
  static void Reindex(Consumer& consumer, uint64_t position, const SlotClass& before);
  void Reindex(const SlotKey& key, const SlotClass& before);
  static uint64_t WorkerHash(uint64_t id, const std::string& address);

  std::map<uint64_t, Dataset> datasets_;
  std::map<uint64_t, Job> jobs_;
  std::map<uint64_t, Worker> workers_;
  uint64_t next_dataset_id_ = 1;
  uint64_t next_job_id_ = 1;
  uint64_t next_worker_id_ = 1;
  uint64_t incarnation_ = 0;
  uint64_t workers_digest_ = 0;
  CacheCatalog caches_;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_DISPATCHER_STATE_H_
