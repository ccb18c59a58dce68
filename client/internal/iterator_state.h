// IteratorState: the bookkeeping of one consumer's iterator, without threads or gRPC, so the
// delivery rules can be tested on their own. BatchIteratorImpl owns one and calls it under its
// mutex. Not thread-safe.
//
// Per split slot (epoch, position) it counts the batches *received* (buffered or returned) and
// *returned* to the trainer, both contiguous prefixes, and whether the end-of-split marker
// arrived (then the slot's batch count is known). A message (epoch, position, index) is
//   index <  received -> a duplicate (re-sent after a reassignment or a stream restart): dropped
//   index == received -> accepted (a marker completes the slot)
//   index >  received -> "ahead": batches before it were lost in flight or dropped by the bound
//                        below; dropped, and the caller reopens the stream so the worker
//                        produces the split again from `received` (see Held()).
//   epoch < the dispatcher's current epoch -> a duplicate: that epoch is done.
// A slot the dispatcher lists in done_positions without the consumer holding it (a previous
// process of this consumer completed it) counts as complete and returned.
//
// Delivered means returned: Progress() reports *returned* counts, and a slot is complete for
// the dispatcher only once all its batches were returned, so a trainer that dies with batches
// in its prefetch buffer gets them again (through SaveState()/restore). Held() reports
// *received* counts: what the worker streams need not send again.
//
// Release order. Default: arrival order (FIFO), one epoch at a time: batches of the following
// epoch (its first slots are produced before this one ends, DispatcherState::Consumer::next)
// are held until every slot of the current epoch was returned in full, which the iterator
// knows from the markers and its own returns, without waiting for the dispatcher.
// Deterministic: (epoch, position, batch_index) of the split sequence; the cursor skips slots
// that are complete and fully released (an empty split's marker alone moves it on).
//
// Bound. A data batch waits (kWait) while `prefetch` batches are buffered. Beyond that, while no
// batch the trainer may take next is buffered (deterministic: the cursor's; default: one of the
// current epoch), a batch it may take is accepted, and others up to a hard cap of
// 4 x prefetch + 4 (the one it waits for may be queued behind them on a worker stream, so
// readers must keep reading). Past the cap such a batch is dropped (kDrop), so a stalled worker
// cannot make the client buffer without bound; the worker produces it again when the stream is
// reopened.
//
// Example (deterministic, prefetch 2): sequence of epoch 0 has positions 0 and 1, two batches
// each. Worker B sends (1,0), (1,1), marker (1,2): accepted (the cursor (0,0) is not buffered).
// Worker A sends (0,0): accepted (it is the cursor's). Pop() returns (0,0); A's (0,1) and marker
// (0,2) arrive; Pop() -> (0,1), (1,0), (1,1).
#ifndef SLUICE_CLIENT_INTERNAL_ITERATOR_STATE_H_
#define SLUICE_CLIENT_INTERNAL_ITERATOR_STATE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "sluice/client.h"

namespace sluice::client {

struct SlotProgress {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t batches = 0;   // Progress(): returned; Held(): received (contiguous prefixes)
  bool complete = false;  // Progress(): every batch returned; Held(): the marker received
};

class IteratorState {
 public:
  enum class Admit { kAccept, kDuplicate, kAhead, kWait, kDrop };

  // track_splits = false (PARALLEL_EPOCHS): no per-split bookkeeping; every batch is accepted.
  IteratorState(bool deterministic, bool track_splits, int prefetch);

  // What to do with message `index` of slot (epoch, position) now; `marker`: an end-of-split
  // marker (index = the split's batch count).
  Admit Check(uint64_t epoch, uint64_t position, uint64_t index, bool marker) const;
  // REQUIRES: Check(...) == kAccept for the batch's origin.
  void Accept(Batch batch);
  // REQUIRES: Check(..., marker=true) == kAccept.
  void AcceptMarker(uint64_t epoch, uint64_t position, uint64_t count);
  // The next batch to release, if any.
  std::optional<Batch> Pop();
  // Some slot of the current epoch became fully returned since the last call (report early).
  bool TakeProgressDue();

  // A ClientHeartbeatResponse: the consumer is in `epoch`, whose sequence has `num_positions`
  // slots, of which `done_positions` are done; `finished`: all epochs are done.
  void ApplyHeartbeat(uint64_t epoch, uint64_t num_positions,
                      const std::vector<uint64_t>& done_positions, bool finished);
  // Starts from a saved state: in `epoch`, slots with `returned` batches returned (and complete
  // ones fully returned), as SaveState() described them.
  void Restore(uint64_t epoch, const std::vector<SlotProgress>& returned);

  // Returned counts of every slot of the current (and any later) epoch the consumer holds, for
  // the next ClientHeartbeat (`acknowledged` false: without the slots a heartbeat answer
  // already listed done, so reports grow with the slots in flight, not with the epoch), and
  // for SaveState() (`acknowledged` true: all of them).
  std::vector<SlotProgress> Progress(bool acknowledged = false) const;
  // Received counts of every slot not yet complete, for a (re)opened worker stream.
  std::vector<SlotProgress> Held() const;

  // Whether every slot of `epoch` was returned in full: kYes; kNo (a slot has batches not yet
  // returned, has not started, or the slot count is unknown); kMaybe while end-of-split markers
  // that would decide it may still be in flight (every slot started, everything received was
  // returned, some markers not received yet).
  enum class Returned { kYes, kNo, kMaybe };
  Returned EpochReturned(uint64_t epoch) const;

  // All epochs done and everything returned.
  bool Done() const { return finished_ && buffered() == 0; }
  bool started() const { return started_; }
  bool finished() const { return finished_; }
  int buffered() const;
  // A batch Pop() would return now is buffered.
  bool NextBuffered() const;
  uint64_t epoch() const { return epoch_; }

 private:
  using Key = std::tuple<uint64_t, uint64_t>;                 // (epoch, position)
  using BatchKey = std::tuple<uint64_t, uint64_t, uint64_t>;  // (epoch, position, index)
  struct Slot {
    uint64_t received = 0;
    uint64_t returned = 0;
    bool complete = false;        // marker received (or done elsewhere)
    bool done_elsewhere = false;  // listed done by the dispatcher, not held here
    bool acknowledged = false;    // listed done by the dispatcher
    bool FullyReturned() const { return complete && returned == received; }
  };

  void AdvanceCursor();
  void Forget(uint64_t below_epoch);
  // Counts a slot that just became FullyReturned.
  void CountFullyReturned(uint64_t epoch);
  // Every slot of `epoch` (whose length is known) is fully returned.
  bool EpochFullyReturned(uint64_t epoch) const;
  // The earliest epoch not returned in full: default mode releases batches up to it.
  uint64_t ReleaseEpoch() const;
  // Default mode: moves the held batches of epochs now released to `fifo_`.
  void ReleaseLater();

  const bool deterministic_;
  const bool track_splits_;
  const int prefetch_;

  bool started_ = false;
  bool finished_ = false;
  bool progress_due_ = false;
  uint64_t epoch_ = 0;                           // the dispatcher's current epoch for this consumer
  std::map<uint64_t, uint64_t> num_positions_;   // per epoch, as heartbeats told
  std::map<uint64_t, uint64_t> fully_returned_;  // per epoch, slots FullyReturned
  std::map<Key, Slot> slots_;

  std::deque<Batch> fifo_;                       // default mode: released in this order
  std::map<uint64_t, std::deque<Batch>> later_;  // default mode: per epoch after ReleaseEpoch()
  std::map<BatchKey, Batch> ordered_;            // deterministic mode
  BatchKey cursor_{0, 0, 0};                     // deterministic: the next batch to release
};

// The two lists of a ClientHeartbeatResponse that the dispatcher omits when the client holds
// them already (proto/dispatcher.proto, "Versioned lists"): the worker addresses to stream from
// and the length of the consumer's split sequence. The client echoes the versions it holds;
// a response with another version (or version 0, from a dispatcher without versions) carries
// the whole list, which replaces the held one. Not thread-safe.
//
//   Apply(sent 0,  {version 7, [a, b]})  -> addresses [a, b], tasks_version 7
//   Apply(sent 7,  {version 7, []})      -> addresses [a, b] (omitted: unchanged)
//   Apply(sent 7,  {version 9, [a]})     -> addresses [a]
class HeldLists {
 public:
  struct Response {
    uint64_t tasks_version = 0;
    std::vector<std::string> addresses;  // empty when omitted
    uint64_t splits_version = 0;
    uint64_t num_splits = 0;  // 0 when omitted
  };

  // What the next ClientHeartbeatRequest echoes.
  uint64_t tasks_version() const { return tasks_version_; }
  uint64_t splits_version() const { return splits_version_; }

  // Applies the answer to a request that echoed `sent_tasks` / `sent_splits`.
  void Apply(uint64_t sent_tasks, uint64_t sent_splits, Response response);

  const std::set<std::string>& addresses() const { return addresses_; }
  uint64_t num_splits() const { return num_splits_; }

 private:
  uint64_t tasks_version_ = 0;
  uint64_t splits_version_ = 0;
  std::set<std::string> addresses_;
  uint64_t num_splits_ = 0;
};

}  // namespace sluice::client

#endif  // SLUICE_CLIENT_INTERNAL_ITERATOR_STATE_H_
