// Re-partition: the remaining work of one epoch that N consumers saved at the same step, divided
// into M equal shares (a mid-epoch resume on another number of trainers; docs/delivery.md).
//
// A slot is a SlotSource: the pieces it reads and, of the batches they make, the range
// [first_batch, end_batch) it delivers (end 0: to the end). An ordinary slot reads its pieces
// whole (0, 0); a slot of a re-partitioned epoch is a batch range of a slot of the old layout, so
// its batches are the very batches the uninterrupted run would have made, filters included.
//
// The epoch's global order is the old layout read consumer by consumer, each consumer's slots in
// position order, each slot's batches in order (the sequence DistributedSampler cuts into
// contiguous shares). Repartition() keeps it: the batches not yet returned, in that order, are
// cut into M contiguous runs of ceil or floor (T / M) batches (the first T mod M runs get one
// more), run j is new consumer j's slots. A slot's batch count is taken from its records,
// ceil(records / batch_size); with a filter that drops records a slot makes fewer, so a range
// reaching a slot's end has end_batch 0 ("whatever remains") and every real batch lies in
// exactly one range whatever the filter kept.
//
// Example: 3 old consumers, batch 2, each with two slots of 4 records (2 batches), each saved
// after its first batch (c0p0 = old consumer 0's position 0; [a, e) = from batch a to the end):
//   remaining, in global order: c0p0[1,e) c0p1[0,e) c1p0[1,e) c1p1[0,e) c2p0[1,e) c2p1[0,e)
//                               1          2          1          2          1          2   = 9
//   2 new consumers, 5 and 4 batches:
//   new 0: c0p0[1,e) c0p1[0,e) c1p0[1,e) c1p1[0,1)      new 1: c1p1[1,e) c2p0[1,e) c2p1[0,e)
//
// The layout is never listed in a message, journal record or saved state (at ~30 bytes a slot,
// 200,000 slots passed gRPC's 4 MB): what is sent is what decides it, proto::ResizedEpoch's
// computed form, and the dispatcher computes the slots again (DispatcherState::ResizedLayout).
// The example is {from_consumers 3, num_consumers 2, returned [{partial [{position 0,
// delivered_batches 1}]} x 3]}; an old consumer that returned its first 100,000 slots whole
// and slot 100,001 too has {complete_ranges [0, 100000, 100001, 100002]}.
#ifndef SLUICE_DISPATCHER_REPARTITION_H_
#define SLUICE_DISPATCHER_REPARTITION_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/record/sharding.h"
#include "proto/dispatcher.pb.h"

namespace sluice::dispatcher {

struct SlotSource {
  record::SlotPieces pieces;
  uint64_t first_batch = 0;
  uint64_t end_batch = 0;  // 0: to the end of what the pieces make

  bool operator==(const SlotSource&) const = default;
};
// [consumer][position]
using Layout = std::vector<std::vector<SlotSource>>;

// What a consumer's state says of one slot: batches returned (counted from the slot's first
// batch), and whether all were.
struct ReturnedSlot {
  uint64_t batches = 0;
  bool complete = false;
};
// [old consumer] -> position -> returned; a position not listed returned nothing.
using Returned = std::vector<std::map<uint64_t, ReturnedSlot>>;

// The batches `source` is expected to make: ceil(records / batch_size) - first_batch, or
// end_batch - first_batch. REQUIRES: batch_size > 0.
uint64_t NominalBatches(const SlotSource& source, uint64_t batch_size);

// The layout of M = `num_consumers` consumers over what `returned` leaves of `old`, in global
// order (see above). InvalidArgument if returned.size() != old.size(), a position is past its
// consumer's slots, or num_consumers or batch_size is 0. A new consumer may get no slot
// (fewer batches left than consumers).
absl::StatusOr<Layout> Repartition(const Layout& old, const Returned& returned,
                                   uint32_t num_consumers, uint64_t batch_size);

// The computed form of proto::ResizedEpoch (what is journaled, answered and saved): `returned`
// as runs, O(N + runs) whatever the number of slots; the layout is Repartition() of the old
// layout and these (DispatcherState::ResizedLayout). A complete slot's batch count is not kept
// (Repartition skips complete slots whatever their count).
void ReturnedToProto(const Returned& returned, proto::ResizedEpoch* out);
// InvalidArgument if `in` does not name one entry per consumer of `old`, or a position is past
// its consumer's slots, or its ranges are not ascending.
absl::StatusOr<Returned> ReturnedFromProto(const proto::ResizedEpoch& in, const Layout& old);

// The consumers of `resized`'s layout: num_consumers in the computed form, the listed ones else.
uint32_t LayoutConsumers(const proto::ResizedEpoch& resized);

// The listed form, of states and journals written before the computed form (pieces carry
// split_id, offset, count): read only, and written by tests that check it is still read.
void LayoutToProto(const Layout& layout, proto::ResizedEpoch* out);
Layout LayoutFromProto(const proto::ResizedEpoch& in);

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_REPARTITION_H_
