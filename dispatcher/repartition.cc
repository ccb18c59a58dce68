#include "dispatcher/repartition.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/service/position_runs.h"

namespace sluice::dispatcher {

uint64_t NominalBatches(const SlotSource& source, uint64_t batch_size) {
  if (source.end_batch != 0) {
    return source.end_batch > source.first_batch ? source.end_batch - source.first_batch : 0;
  }
  uint64_t records = 0;
  for (const record::SplitPiece& piece : source.pieces) records += piece.count;
  const uint64_t batches = (records + batch_size - 1) / batch_size;
  return batches > source.first_batch ? batches - source.first_batch : 0;
}

absl::StatusOr<Layout> Repartition(const Layout& old, const Returned& returned,
                                   uint32_t num_consumers, uint64_t batch_size) {
  if (num_consumers == 0 || batch_size == 0) {
    return absl::InvalidArgumentError("Repartition: num_consumers and batch_size must be > 0");
  }
  if (returned.size() != old.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Repartition: ", returned.size(), " states for ", old.size(), " consumers"));
  }
  // The remaining batches in global order: (old slot, from, to) relative to the slot's first
  // batch; `to_end`: the run reaches the slot's end.
  struct Run {
    const SlotSource* slot;
    uint64_t from;
    uint64_t to;
  };
  std::vector<Run> runs;
  uint64_t total = 0;
  for (size_t k = 0; k < old.size(); ++k) {
    for (const auto& [position, r] : returned[k]) {
      if (position >= old[k].size()) {
        return absl::InvalidArgumentError(absl::StrCat("Repartition: consumer ", k, " position ",
                                                       position, " is past its ", old[k].size(),
                                                       " slots"));
      }
    }
    for (uint64_t p = 0; p < old[k].size(); ++p) {
      auto it = returned[k].find(p);
      const uint64_t n = NominalBatches(old[k][p], batch_size);
      if (it != returned[k].end() && it->second.complete) continue;
      const uint64_t from = it == returned[k].end() ? 0 : it->second.batches;
      if (from >= n) continue;
      runs.push_back({&old[k][p], from, n});
      total += n - from;
    }
  }
  Layout out(num_consumers);
  const uint64_t base = total / num_consumers;
  const uint64_t extra = total % num_consumers;
  size_t run = 0;
  for (uint32_t j = 0; j < num_consumers; ++j) {
    uint64_t want = base + (j < extra ? 1 : 0);
    while (want > 0) {
      Run& r = runs[run];
      const uint64_t take = std::min(want, r.to - r.from);
      const SlotSource& s = *r.slot;
      SlotSource piece{.pieces = s.pieces, .first_batch = s.first_batch + r.from};
      const bool to_end = r.from + take == r.to;
      piece.end_batch = to_end ? s.end_batch : s.first_batch + r.from + take;
      out[j].push_back(std::move(piece));
      r.from += take;
      want -= take;
      if (to_end) ++run;
    }
  }
  return out;
}

void ReturnedToProto(const Returned& returned, proto::ResizedEpoch* out) {
  out->clear_returned();
  for (const std::map<uint64_t, ReturnedSlot>& consumer : returned) {
    proto::ReturnedRuns* runs = out->add_returned();
    for (const auto& [position, slot] : consumer) {
      if (slot.complete) {
        service::AppendToRuns(runs->mutable_complete_ranges(), position);
      } else if (slot.batches > 0) {
        proto::ClientSplitProgress* p = runs->add_partial();
        p->set_position(position);
        p->set_delivered_batches(slot.batches);
      }
    }
  }
}

absl::StatusOr<Returned> ReturnedFromProto(const proto::ResizedEpoch& in, const Layout& old) {
  if (static_cast<size_t>(in.returned_size()) != old.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a re-partitioned epoch names what ", in.returned_size(),
                     " old consumers returned, but the old layout has ", old.size()));
  }
  Returned out(old.size());
  for (size_t k = 0; k < old.size(); ++k) {
    const proto::ReturnedRuns& runs = in.returned(static_cast<int>(k));
    const uint64_t slots = old[k].size();
    auto past = [&](uint64_t position) {
      return absl::InvalidArgumentError(absl::StrCat("a re-partitioned epoch: old consumer ", k,
                                                     " position ", position, " is past its ", slots,
                                                     " slots"));
    };
    if (runs.complete_ranges_size() % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("a re-partitioned epoch: old consumer ", k,
                                                     "'s complete ranges are not pairs"));
    }
    uint64_t floor = 0;
    for (int i = 0; i < runs.complete_ranges_size(); i += 2) {
      const uint64_t begin = runs.complete_ranges(i), end = runs.complete_ranges(i + 1);
      if (begin < floor || end <= begin) {
        return absl::InvalidArgumentError(absl::StrCat("a re-partitioned epoch: old consumer ", k,
                                                       "'s complete ranges are not ascending"));
      }
      if (end > slots) return past(end - 1);
      for (uint64_t p = begin; p < end; ++p)
        out[k].emplace_hint(out[k].end(), p, ReturnedSlot{.complete = true});
      floor = end;
    }
    for (const proto::ClientSplitProgress& p : runs.partial()) {
      if (p.position() >= slots) return past(p.position());
      if (!out[k].emplace(p.position(), ReturnedSlot{.batches = p.delivered_batches()}).second) {
        return absl::InvalidArgumentError(absl::StrCat("a re-partitioned epoch: old consumer ", k,
                                                       " position ", p.position(),
                                                       " is both complete and partial"));
      }
    }
  }
  return out;
}

uint32_t LayoutConsumers(const proto::ResizedEpoch& resized) {
  return resized.num_consumers() != 0 ? resized.num_consumers()
                                      : static_cast<uint32_t>(resized.consumers_size());
}

void LayoutToProto(const Layout& layout, proto::ResizedEpoch* out) {
  out->clear_consumers();
  for (const std::vector<SlotSource>& consumer : layout) {
    proto::ConsumerLayout* c = out->add_consumers();
    for (const SlotSource& slot : consumer) {
      proto::SlotRange* s = c->add_slots();
      s->set_first_batch(slot.first_batch);
      s->set_end_batch(slot.end_batch);
      for (const record::SplitPiece& piece : slot.pieces) {
        proto::SplitPiece* p = s->add_pieces();
        p->set_split_id(piece.split_id);
        p->set_offset(piece.offset);
        p->set_count(piece.count);
      }
    }
  }
}

Layout LayoutFromProto(const proto::ResizedEpoch& in) {
  Layout layout(static_cast<size_t>(in.consumers_size()));
  for (int k = 0; k < in.consumers_size(); ++k) {
    for (const proto::SlotRange& s : in.consumers(k).slots()) {
      SlotSource slot{.first_batch = s.first_batch(), .end_batch = s.end_batch()};
      for (const proto::SplitPiece& p : s.pieces())
        slot.pieces.push_back({p.split_id(), p.offset(), p.count()});
      layout[static_cast<size_t>(k)].push_back(std::move(slot));
    }
  }
  return layout;
}

}  // namespace sluice::dispatcher
