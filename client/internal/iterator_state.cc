#include "client/internal/iterator_state.h"

#include <utility>

namespace sluice::client {

IteratorState::IteratorState(bool deterministic, bool track_splits,
                             int prefetch)
    : deterministic_(deterministic && track_splits),
      track_splits_(track_splits),
      prefetch_(prefetch < 1 ? 1 : prefetch) {}

int IteratorState::buffered() const {
  return static_cast<int>(deterministic_ ? ordered_.size() : fifo_.size());
}

IteratorState::Admit IteratorState::Check(uint64_t epoch, uint64_t position,
                                          uint64_t index) const {
  if (track_splits_) {
    if (started_ && epoch < epoch_) return Admit::kDuplicate;
    if (deterministic_ && epoch < std::get<0>(cursor_))
      return Admit::kDuplicate;
    auto it = slots_.find({epoch, position});
    const uint64_t received = it == slots_.end() ? 0 : it->second.received;
    if (it != slots_.end() && it->second.complete && index >= received) {
      // Complete: every batch was received (or the dispatcher says so).
      return Admit::kDuplicate;
    }
    if (index < received) return Admit::kDuplicate;
    if (index > received) return Admit::kAhead;
  }
  if (buffered() < prefetch_) return Admit::kAccept;
  if (deterministic_) {
    const BatchKey key{epoch, position, index};
    if (key == cursor_) return Admit::kAccept;
    if (!ordered_.contains(cursor_))
      return Admit::kAccept;  // see the header: no deadlock
  }
  return Admit::kWait;
}

bool IteratorState::Accept(Batch batch, bool last_in_split) {
  if (!track_splits_) {
    fifo_.push_back(std::move(batch));
    return false;
  }
  Slot& slot = slots_[{batch.epoch, batch.position}];
  ++slot.received;
  if (last_in_split) slot.complete = true;
  const bool completes_slot = last_in_split && batch.epoch == epoch_;
  if (deterministic_) {
    const BatchKey key{batch.epoch, batch.position, batch.batch_index};
    ordered_.emplace(key, std::move(batch));
  } else {
    fifo_.push_back(std::move(batch));
  }
  return completes_slot && CurrentEpochComplete();
}

std::optional<Batch> IteratorState::Pop() {
  if (!deterministic_) {
    if (fifo_.empty()) return std::nullopt;
    Batch batch = std::move(fifo_.front());
    fifo_.pop_front();
    return batch;
  }
  auto it = ordered_.find(cursor_);
  if (it == ordered_.end()) return std::nullopt;
  Batch batch = std::move(it->second);
  ordered_.erase(it);
  std::get<2>(cursor_) += 1;
  AdvanceCursor();
  return batch;
}

void IteratorState::AdvanceCursor() {
  while (true) {
    auto& [epoch, position, index] = cursor_;
    auto n = num_positions_.find(epoch);
    if (n != num_positions_.end() && position >= n->second) {
      ++epoch;
      position = 0;
      index = 0;
      continue;
    }
    auto slot = slots_.find({epoch, position});
    if (slot == slots_.end() || !slot->second.complete) return;
    if (index < slot->second.received)
      return;  // the slot still has batches to release
    ++position;
    index = 0;
  }
}

bool IteratorState::CurrentEpochComplete() const {
  auto n = num_positions_.find(epoch_);
  if (n == num_positions_.end()) return false;
  for (uint64_t p = 0; p < n->second; ++p) {
    auto it = slots_.find({epoch_, p});
    if (it == slots_.end() || !it->second.complete) return false;
  }
  return true;
}

void IteratorState::Forget(uint64_t below_epoch) {
  slots_.erase(slots_.begin(), slots_.lower_bound({below_epoch, 0}));
  num_positions_.erase(num_positions_.begin(),
                       num_positions_.lower_bound(below_epoch));
}

void IteratorState::ApplyHeartbeat(uint64_t epoch, uint64_t num_positions,
                                   const std::vector<uint64_t>& done_positions,
                                   bool finished) {
  finished_ = finished;
  if (!track_splits_) return;
  if (!started_) {
    started_ = true;
    cursor_ = {epoch, 0, 0};
  }
  if (finished) return;  // `epoch` is past the last one; nothing more arrives
  if (epoch < epoch_) return;  // a stale answer
  epoch_ = epoch;
  num_positions_[epoch] = num_positions;
  for (uint64_t p : done_positions) {
    Slot& slot = slots_[{epoch, p}];
    if (!slot.complete) {
      slot.complete = true;
      slot.done_elsewhere = slot.received == 0;
    }
  }
  // Older epochs are done; deterministic mode still needs their slots until the
  // cursor passed.
  Forget(deterministic_ ? std::min(epoch, std::get<0>(cursor_)) : epoch);
  if (deterministic_) AdvanceCursor();
}

std::vector<SlotProgress> IteratorState::Progress() const {
  std::vector<SlotProgress> out;
  if (!track_splits_) return out;
  for (auto it = slots_.lower_bound({epoch_, 0}); it != slots_.end(); ++it) {
    if (it->second.done_elsewhere) continue;
    out.push_back({.epoch = std::get<0>(it->first),
                   .position = std::get<1>(it->first),
                   .received = it->second.received,
                   .complete = it->second.complete});
  }
  return out;
}

}  // namespace sluice::client
