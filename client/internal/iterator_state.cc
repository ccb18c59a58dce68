#include "client/internal/iterator_state.h"

#include <algorithm>
#include <utility>

namespace sluice::client {

IteratorState::IteratorState(bool deterministic, bool track_splits, int prefetch)
    : deterministic_(deterministic && track_splits),
      track_splits_(track_splits),
      prefetch_(prefetch < 1 ? 1 : prefetch) {}

int IteratorState::buffered() const {
  size_t n = deterministic_ ? ordered_.size() : fifo_.size();
  for (const auto& [epoch, batches] : later_) n += batches.size();  // at most an epoch or two
  return static_cast<int>(n);
}

bool IteratorState::NextBuffered() const {
  return deterministic_ ? ordered_.contains(cursor_) : !fifo_.empty();
}

void IteratorState::CountFullyReturned(uint64_t epoch) { ++fully_returned_[epoch]; }

bool IteratorState::EpochFullyReturned(uint64_t epoch) const {
  auto n = num_positions_.find(epoch);
  auto returned = fully_returned_.find(epoch);
  return n != num_positions_.end() && returned != fully_returned_.end() &&
         returned->second >= n->second;
}

uint64_t IteratorState::ReleaseEpoch() const {
  uint64_t epoch = epoch_;
  while (EpochFullyReturned(epoch)) ++epoch;
  return epoch;
}

void IteratorState::ReleaseLater() {
  if (later_.empty()) return;
  const uint64_t release = ReleaseEpoch();
  while (!later_.empty() && later_.begin()->first <= release) {
    for (Batch& batch : later_.begin()->second) fifo_.push_back(std::move(batch));
    later_.erase(later_.begin());
  }
}

IteratorState::Admit IteratorState::Check(uint64_t epoch, uint64_t position, uint64_t index,
                                          bool marker) const {
  if (track_splits_) {
    if (started_ && epoch < epoch_) return Admit::kDuplicate;
    if (deterministic_ && epoch < std::get<0>(cursor_)) return Admit::kDuplicate;
    auto it = slots_.find({epoch, position});
    const uint64_t received = it == slots_.end() ? 0 : it->second.received;
    if (it != slots_.end() && it->second.complete) return Admit::kDuplicate;
    if (index < received) return Admit::kDuplicate;
    if (index > received) return Admit::kAhead;
    if (marker) return Admit::kAccept;  // holds no memory
  } else if (marker) {
    return Admit::kDuplicate;  // parallel epochs: nothing to track
  }
  if (buffered() < prefetch_) return Admit::kAccept;
  if (!track_splits_ || NextBuffered()) return Admit::kWait;
  // The trainer waits for a batch that may be queued behind this one on its worker stream.
  const bool next =
      deterministic_ ? BatchKey{epoch, position, index} == cursor_ : epoch <= ReleaseEpoch();
  if (next) return Admit::kAccept;
  return buffered() < 4 * prefetch_ + 4 ? Admit::kAccept : Admit::kDrop;
}

void IteratorState::Accept(Batch batch) {
  if (!track_splits_) {
    fifo_.push_back(std::move(batch));
    return;
  }
  Slot& slot = slots_[{batch.epoch, batch.position}];
  ++slot.received;
  if (deterministic_) {
    const BatchKey key{batch.epoch, batch.position, batch.batch_index};
    ordered_.emplace(key, std::move(batch));
  } else if (batch.epoch <= ReleaseEpoch()) {
    fifo_.push_back(std::move(batch));
  } else {
    const uint64_t epoch = batch.epoch;
    later_[epoch].push_back(std::move(batch));
  }
}

void IteratorState::AcceptMarker(uint64_t epoch, uint64_t position, uint64_t /*count*/) {
  Slot& slot = slots_[{epoch, position}];
  slot.complete = true;
  if (slot.FullyReturned()) {
    progress_due_ = true;
    CountFullyReturned(epoch);
  }
  if (deterministic_) AdvanceCursor();
  ReleaseLater();
}

std::optional<Batch> IteratorState::Pop() {
  std::optional<Batch> batch;
  if (!deterministic_) {
    if (fifo_.empty()) return std::nullopt;
    batch = std::move(fifo_.front());
    fifo_.pop_front();
  } else {
    auto it = ordered_.find(cursor_);
    if (it == ordered_.end()) return std::nullopt;
    batch = std::move(it->second);
    ordered_.erase(it);
    std::get<2>(cursor_) += 1;
  }
  if (track_splits_) {
    auto slot = slots_.find({batch->epoch, batch->position});
    if (slot != slots_.end()) {
      ++slot->second.returned;
      if (slot->second.FullyReturned()) {
        progress_due_ = true;
        CountFullyReturned(batch->epoch);
      }
    }
  }
  if (deterministic_) AdvanceCursor();
  ReleaseLater();
  return batch;
}

bool IteratorState::TakeProgressDue() {
  const bool due = progress_due_;
  progress_due_ = false;
  return due;
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
    if (slot == slots_.end()) return;
    index = std::max(index, slot->second.returned);  // released before a Restore()
    if (!slot->second.complete) return;
    if (index < slot->second.received) return;  // the slot still has batches to release
    ++position;
    index = 0;
  }
}

void IteratorState::Forget(uint64_t below_epoch) {
  slots_.erase(slots_.begin(), slots_.lower_bound({below_epoch, 0}));
  num_positions_.erase(num_positions_.begin(), num_positions_.lower_bound(below_epoch));
  fully_returned_.erase(fully_returned_.begin(), fully_returned_.lower_bound(below_epoch));
}

void IteratorState::ApplyHeartbeat(uint64_t epoch, uint64_t num_positions,
                                   const std::vector<uint64_t>& done_positions, bool finished) {
  finished_ = finished;
  if (!track_splits_) return;
  if (!started_) {
    started_ = true;
    cursor_ = {epoch, 0, 0};
  }
  if (finished) return;        // `epoch` is past the last one; nothing more arrives
  if (epoch < epoch_) return;  // a stale answer
  epoch_ = epoch;
  num_positions_[epoch] = num_positions;
  for (uint64_t p : done_positions) {
    Slot& slot = slots_[{epoch, p}];
    if (!slot.complete) {
      slot.complete = true;
      slot.done_elsewhere = slot.received == 0;
      if (slot.FullyReturned()) CountFullyReturned(epoch);
    }
    slot.acknowledged = true;
  }
  // Older epochs are done; deterministic mode still needs their slots until the cursor passed.
  Forget(deterministic_ ? std::min(epoch, std::get<0>(cursor_)) : epoch);
  if (deterministic_) AdvanceCursor();
  ReleaseLater();
}

void IteratorState::Restore(uint64_t epoch, const std::vector<SlotProgress>& returned) {
  epoch_ = epoch;
  cursor_ = {epoch, 0, 0};
  for (const SlotProgress& p : returned) {
    if (p.epoch != epoch) continue;
    Slot& slot = slots_[{p.epoch, p.position}];
    slot.received = slot.returned = p.batches;
    slot.complete = p.complete;
    if (slot.complete) CountFullyReturned(p.epoch);
  }
  // The cursor moves on once the first heartbeat tells how many positions the epoch has.
}

IteratorState::Returned IteratorState::EpochReturned(uint64_t epoch) const {
  auto n = num_positions_.find(epoch);
  if (n == num_positions_.end()) return Returned::kNo;
  Returned out = Returned::kYes;
  for (uint64_t p = 0; p < n->second; ++p) {
    auto it = slots_.find({epoch, p});
    if (it == slots_.end()) return Returned::kNo;  // not started
    const Slot& slot = it->second;
    if (slot.returned < slot.received) return Returned::kNo;
    if (slot.complete) continue;
    if (slot.received == 0) return Returned::kNo;  // not started
    out = Returned::kMaybe;                        // its marker may be on its way
  }
  return out;
}

std::vector<SlotProgress> IteratorState::Progress(bool acknowledged) const {
  std::vector<SlotProgress> out;
  if (!track_splits_) return out;
  for (auto it = slots_.lower_bound({epoch_, 0}); it != slots_.end(); ++it) {
    if (it->second.done_elsewhere) continue;
    if (it->second.acknowledged && !acknowledged) continue;
    out.push_back({.epoch = std::get<0>(it->first),
                   .position = std::get<1>(it->first),
                   .batches = it->second.returned,
                   .complete = it->second.FullyReturned()});
  }
  return out;
}

std::vector<SlotProgress> IteratorState::Held() const {
  std::vector<SlotProgress> out;
  if (!track_splits_) return out;
  for (auto it = slots_.lower_bound({epoch_, 0}); it != slots_.end(); ++it) {
    if (it->second.done_elsewhere) continue;
    out.push_back({.epoch = std::get<0>(it->first),
                   .position = std::get<1>(it->first),
                   .batches = it->second.received,
                   .complete = it->second.complete});
  }
  return out;
}

void HeldLists::Apply(uint64_t sent_tasks, uint64_t sent_splits, Response response) {
  const bool tasks_unchanged = response.tasks_version != 0 &&
                               response.tasks_version == sent_tasks && response.addresses.empty();
  if (!tasks_unchanged) {
    addresses_ = std::set<std::string>(std::make_move_iterator(response.addresses.begin()),
                                       std::make_move_iterator(response.addresses.end()));
  }
  tasks_version_ = response.tasks_version;
  const bool splits_unchanged = response.splits_version != 0 &&
                                response.splits_version == sent_splits && response.num_splits == 0;
  if (!splits_unchanged) num_splits_ = response.num_splits;
  splits_version_ = response.splits_version;
}

}  // namespace sluice::client
