// IteratorState: the bookkeeping of one consumer's iterator, without threads or
// gRPC, so the delivery rules can be tested on their own. BatchIteratorImpl
// owns one and calls it under its mutex. Not thread-safe.
//
// Exactly-once. Per split slot (epoch, position) the state counts the batches
// *received* (buffered or already returned): a contiguous prefix, since a
// worker produces a split's batches in order and a replacement worker starts at
// the prefix the consumer last reported. A batch (epoch, position, index) is
//   index <  received  -> a duplicate (re-sent after a reassignment): dropped
//   and counted; index == received  -> accepted (received + 1; complete when it
//   is the split's last batch); index >  received  -> "ahead": dropped and
//   logged by the caller. It cannot happen under the
//                         protocol (the reported prefix never exceeds what the
//                         consumer holds, so no producer starts past it);
//                         accepting it would leave a hole that no one re-sends,
//                         so we keep the invariant "received is a prefix"
//                         instead.
//   epoch < the dispatcher's current epoch -> a duplicate: that epoch is done,
//   so every batch of it
//                         was already received.
// A split slot the dispatcher lists in done_positions without the consumer
// holding it (a previous process of this consumer completed it) counts as
// complete.
//
// Release order. Default: arrival order (FIFO). Deterministic: (epoch,
// position, batch_index) of the split sequence; the cursor skips slots that are
// complete and fully released.
//
// Bound. An accepted batch waits (Check() says kWait) while `prefetch` batches
// are buffered. Deterministic mode exempts the batch the cursor waits for and,
// to avoid a deadlock, every batch while the cursor's batch is not buffered:
// that batch may be queued behind others on any worker stream (a worker
// interleaves the splits it produces), so readers must keep reading until it
// arrives. The dispatcher hands out splits roughly in sequence order, so the
// overshoot stays near (workers x splits in production) batches.
//
// Example (deterministic, prefetch 2): sequence of epoch 0 has positions 0 and
// 1, two batches each. Worker B sends (1,0), (1,1): (1,0) accepted (buffer 1),
// (1,1) accepted (buffer 2, the cursor (0,0) is not buffered, so the bound does
// not apply). Worker A sends (0,0): accepted (it is the cursor's). Pop()
// returns (0,0); A's (0,1) arrives, accepted; Pop() -> (0,1), (1,0), (1,1).
#ifndef SLUICE_CLIENT_INTERNAL_ITERATOR_STATE_H_
#define SLUICE_CLIENT_INTERNAL_ITERATOR_STATE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "sluice/client.h"

namespace sluice::client {

struct SlotProgress {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t received = 0;  // contiguous prefix of batches held
  bool complete = false;  // holds the split's last batch
};

class IteratorState {
 public:
  enum class Admit { kAccept, kDuplicate, kAhead, kWait };

  // track_splits = false (PARALLEL_EPOCHS): no per-split bookkeeping; every
  // batch is accepted.
  IteratorState(bool deterministic, bool track_splits, int prefetch);

  // What to do with batch `index` of slot (epoch, position) now.
  Admit Check(uint64_t epoch, uint64_t position, uint64_t index) const;
  // REQUIRES: Check(...) == kAccept for the batch's origin. Returns true when
  // this batch completed every slot of the dispatcher's current epoch (time for
  // an early heartbeat).
  bool Accept(Batch batch, bool last_in_split);
  // The next batch to release, if any.
  std::optional<Batch> Pop();

  // A ClientHeartbeatResponse: the consumer is in `epoch`, whose sequence has
  // `num_positions` slots, of which `done_positions` are done; `finished`: all
  // epochs are done.
  void ApplyHeartbeat(uint64_t epoch, uint64_t num_positions,
                      const std::vector<uint64_t>& done_positions,
                      bool finished);

  // Cumulative progress of every slot of the current (and any later) epoch the
  // consumer holds batches of, for the next ClientHeartbeat.
  std::vector<SlotProgress> Progress() const;

  // All epochs done and everything returned.
  bool Done() const { return finished_ && buffered() == 0; }
  bool started() const { return started_; }
  int buffered() const;
  uint64_t dispatcher_epoch() const { return epoch_; }

 private:
  using Key = std::tuple<uint64_t, uint64_t>;  // (epoch, position)
  using BatchKey =
      std::tuple<uint64_t, uint64_t, uint64_t>;  // (epoch, position, index)
  struct Slot {
    uint64_t received = 0;
    bool complete = false;
    bool done_elsewhere =
        false;  // listed done by the dispatcher, not held here
  };

  bool CurrentEpochComplete() const;
  void AdvanceCursor();
  void Forget(uint64_t below_epoch);

  const bool deterministic_;
  const bool track_splits_;
  const int prefetch_;

  bool started_ = false;
  bool finished_ = false;
  uint64_t epoch_ = 0;  // the dispatcher's current epoch for this consumer
  std::map<uint64_t, uint64_t> num_positions_;  // per epoch, as heartbeats told
  std::map<Key, Slot> slots_;

  std::deque<Batch> fifo_;             // default mode
  std::map<BatchKey, Batch> ordered_;  // deterministic mode
  BatchKey cursor_{0, 0, 0};  // deterministic: the next batch to release
};

}  // namespace sluice::client

#endif  // SLUICE_CLIENT_INTERNAL_ITERATOR_STATE_H_
