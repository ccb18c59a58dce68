#include "data_worker/pipeline/batch_assembler.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/record/schema.h"

namespace sluice::data_worker::pipeline {

BatchAssembler::BatchAssembler(Options options, EmitFn emit, EndFn set_end, WrapFn wrap)
    : options_(std::move(options)),
      emit_(std::move(emit)),
      set_end_(std::move(set_end)),
      wrap_(std::move(wrap)) {
  absl::MutexLock lock(&mu_);
  spare_nodes_.reserve(MaxSpareNodes());
}

bool BatchAssembler::Reserve() {
  absl::MutexLock lock(&mu_);
  auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || reserved_ < next_commit_ + options_.window;
  };
  mu_.Await(absl::Condition(&room));
  if (cancelled_) return false;
  ++reserved_;
  return true;
}

bool BatchAssembler::TryReserve() {
  absl::MutexLock lock(&mu_);
  if (cancelled_ || reserved_ >= next_commit_ + options_.window) return false;
  ++reserved_;
  return true;
}

void BatchAssembler::Unreserve() {
  absl::MutexLock lock(&mu_);
  --reserved_;
}

void BatchAssembler::Add(uint64_t seq, Item item) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    if (spare_nodes_.empty()) {
      pending_.emplace(seq, std::move(item));
    } else {
      auto node = std::move(spare_nodes_.back());
      spare_nodes_.pop_back();
      node.key() = seq;
      node.mapped() = std::move(item);
      pending_.insert(std::move(node));
    }
    Commit(&actions);
  }
  Run(&actions);
}

void BatchAssembler::SetInputEnd(uint64_t end) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    input_end_ = end;
    Commit(&actions);
  }
  Run(&actions);
}

void BatchAssembler::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

void BatchAssembler::Clear() {
  std::map<uint64_t, Item> pending;
  std::map<uint64_t, Batch> batches;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_);
    batches.swap(batches_);
  }
  for (auto& [k, b] : batches) AddLive(-b.counted);
}

void BatchAssembler::Commit(Actions* actions) {
  const int64_t B = options_.batch_size;
  while (!pending_.empty() && pending_.begin()->first == next_commit_) {
    auto node = pending_.extract(pending_.begin());
    Item item = std::move(node.mapped());
    if (spare_nodes_.size() < MaxSpareNodes()) spare_nodes_.push_back(std::move(node));
    ++next_commit_;
    if (options_.runs && item.element() != nullptr && item.element()->end_of_run) {
      const uint64_t marker = CutLastBatch(actions);
      actions->push_back(Action{Action::kMarker, marker, 0, std::move(item)});
      base_ = marker + 1;
      count_ = 0;
      stopped_ = false;
      continue;
    }
    if (stopped_ || item.is_hole()) continue;
    if (!item.status().ok()) {
      // The error takes the place of the rest of its batch and ends the
      // output (with runs: the run's output) after it.
      const uint64_t k = base_ + count_ / B;
      Batch& b = batches_[k];
      b.error = item.status();
      b.expected = b.assigned;
      stopped_ = true;
      if (!options_.runs) set_end_(k + 1);
      if (b.filled == b.expected) {
        actions->push_back(Action{Action::kFinish, k, 0, Item()});
      }
      continue;
    }
    const uint64_t pos = count_++;
    const uint64_t k = base_ + pos / B;
    Batch& b = batches_[k];
    if (b.expected == 0) b.expected = B;
    ++b.assigned;
    actions->push_back(
        Action{Action::kWrite, k, static_cast<int64_t>(pos % B), std::move(item), &b});
  }
  if (!input_end_ || next_commit_ < *input_end_) return;
  if (options_.runs) {
    // Every run ended with its marker: the markers counted the outputs.
    if (!ended_) set_end_(base_);
    ended_ = true;
  } else if (!stopped_) {
    set_end_(CutLastBatch(actions));
    stopped_ = true;
  }
}

uint64_t BatchAssembler::CutLastBatch(Actions* actions) {
  const int64_t B = options_.batch_size;
  if (stopped_) return base_ + count_ / B + 1;  // after the error's batch
  const uint64_t full = base_ + count_ / B;
  const uint64_t rem = count_ % B;
  if (rem == 0) return full;
  Batch& b = batches_[full];
  if (!options_.drop_remainder) {
    b.expected = rem;
    if (b.filled == b.expected) {
      actions->push_back(Action{Action::kFinish, full, 0, Item()});
    }
    return full + 1;
  }
  b.discard = true;
  if (b.filled == b.assigned) {
    AddLive(-b.counted);
    batches_.erase(full);
  }
  return full;
}

void BatchAssembler::Run(Actions* actions) {
  for (Action& a : *actions) {
    if (a.kind == Action::kFinish) {
      Finish(a.batch);
    } else if (a.kind == Action::kMarker) {
      emit_(a.batch, std::move(*a.item.Take()));
    } else {
      Write(a);
    }
  }
  actions->clear();
}

absl::StatusOr<BatchAssembler::Written> BatchAssembler::PrepareWrite(const StagePlan::SlotWrite& w,
                                                                     Element& e) const {
  if (w.slot < 0 || static_cast<size_t>(w.slot) >= e.columns.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an element has ", e.columns.size(), " columns, no column ", w.slot));
  }
  Written out;
  out.slot = w.slot;
  out.op = w.op.get();
  Tensor& t = e.columns[w.slot];
  const ElementContext ctx{options_.seed, e.epoch, e.global_indices[0]};
  if (w.mirror != nullptr && w.mirror->Mirrors(ctx)) {
    if (w.op->MirrorsInto(t)) {
      out.mirror = true;
    } else {
      absl::StatusOr<Tensor> r = w.mirror->Apply(std::move(t), ctx);
      if (!r.ok()) return r.status();
      t = *std::move(r);
    }
  }
  absl::StatusOr<TensorType> type = w.op->OutputType(t);
  if (!type.ok()) return type.status();
  out.type = *std::move(type);
  return out;
}

void BatchAssembler::Write(Action& a) {
  Element& e = *a.item.element();
  const int64_t B = options_.batch_size;
  // The written columns (batch write fusion) and their types in the batch.
  absl::InlinedVector<Written, 1> written;
  absl::Status shape_error;
  for (const StagePlan::SlotWrite& w : options_.writes) {
    absl::StatusOr<Written> r = PrepareWrite(w, e);
    if (!r.ok()) {
      shape_error = wrap_(r.status(), e.global_indices[0]);
      break;
    }
    written.push_back(*std::move(r));
  }
  auto written_of = [&](size_t c) -> const Written* {
    for (const Written& w : written) {
      if (static_cast<size_t>(w.slot) == c) return &w;
    }
    return nullptr;
  };
  // Column c as the batch holds it: its dtype, shape and bytes per element.
  auto dtype_of = [&](size_t c) {
    const Written* w = written_of(c);
    return w != nullptr ? w->type.dtype : e.columns[c].dtype();
  };
  auto shape_of = [&](size_t c) -> const std::vector<int64_t>& {
    const Written* w = written_of(c);
    return w != nullptr ? w->type.shape : e.columns[c].shape();
  };
  auto bytes_of = [&](size_t c) {
    int64_t n = static_cast<int64_t>(record::DTypeSize(dtype_of(c)));
    for (int64_t d : shape_of(c)) n *= d;
    return n;
  };
  Batch* b = a.target;
  if (shape_error.ok()) {
    // The first element written into the batch fixes its column types.
    absl::call_once(b->allocate, [&] {
      b->epoch = e.epoch;
      // Checked before anything is allocated: a batch size of 1e9 must fail
      // its job, not the worker.
      int64_t per_element = static_cast<int64_t>(sizeof(uint64_t));
      for (size_t c = 0; c < e.columns.size(); ++c) per_element += bytes_of(c);
      if (options_.max_buffer_bytes > 0 &&
          B > options_.max_buffer_bytes / std::max<int64_t>(1, per_element)) {
        b->alloc_error = absl::ResourceExhaustedError(absl::StrCat(
            "a batch of ", B, " elements of ", per_element,
            " bytes is more than this worker's memory budget of ", options_.max_buffer_bytes,
            " bytes (--memory-mb): use a smaller batch size or smaller "
            "images"));
        return;
      }
      b->buffer.ids.assign(B, 0);
      int64_t bytes = 0;
      for (size_t c = 0; c < e.columns.size(); ++c) {
        std::vector<int64_t> shape = {B};
        shape.insert(shape.end(), shape_of(c).begin(), shape_of(c).end());
        b->buffer.columns.push_back(Tensor::Allocate(dtype_of(c), shape));
        bytes += b->buffer.columns.back().num_bytes();
      }
      b->counted = bytes;
      AddLive(bytes);
    });
  }
  // Slots are disjoint: threads write one batch concurrently without the
  // lock.
  const bool unallocated =
      !shape_error.ok() || b->buffer.columns.size() != e.columns.size() || b->buffer.ids.empty();
  if (shape_error.ok() && unallocated && !b->buffer.ids.empty()) {
    shape_error = wrap_(absl::InvalidArgumentError(absl::StrCat("an element has ", e.columns.size(),
                                                                " columns but the batch holds ",
                                                                b->buffer.columns.size())),
                        e.global_indices[0]);
  }
  for (size_t c = 0; !unallocated && c < e.columns.size(); ++c) {
    const Tensor& t = e.columns[c];
    Tensor& dst = b->buffer.columns[c];
    const std::vector<int64_t>& shape = shape_of(c);
    const bool same = dtype_of(c) == dst.dtype() && shape.size() + 1 == dst.shape().size() &&
                      std::equal(shape.begin(), shape.end(), dst.shape().begin() + 1);
    if (!same) {
      std::vector<int64_t> want(dst.shape().begin() + 1, dst.shape().end());
      const std::string name = c < options_.column_names.size() ? options_.column_names[c] : "";
      shape_error =
          wrap_(absl::InvalidArgumentError(absl::StrCat(
                    "column '", name, "' is ", record::DTypeName(dtype_of(c)), ShapeToString(shape),
                    " but the batch holds ", record::DTypeName(dst.dtype()), ShapeToString(want),
                    "; resize or crop to a fixed size first")),
                e.global_indices[0]);
      break;
    }
    const int64_t bytes = bytes_of(c);
    uint8_t* slot = dst.data() + a.slot * bytes;
    if (const Written* w = written_of(c); w != nullptr) {
      w->op->ApplyInto(t, w->mirror, slot);
    } else {
      std::memcpy(slot, t.data(), bytes);
    }
  }
  if (!unallocated) b->buffer.ids[a.slot] = e.global_indices[0];
  if (options_.pool != nullptr) options_.pool->Put(a.item.Take());
  a.item = Item();
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    if (!shape_error.ok() && b->error.ok()) b->error = shape_error;
    ++b->filled;
    if (b->discard && b->filled == b->assigned) {
      AddLive(-b->counted);
      batches_.erase(a.batch);
    } else if (b->filled == b->expected && b->assigned == b->expected) {
      finish = true;
    }
  }
  if (finish) Finish(a.batch);
}

void BatchAssembler::Finish(uint64_t k) {
  std::map<uint64_t, Batch>::node_type node;
  {
    absl::MutexLock lock(&mu_);
    node = batches_.extract(k);
  }
  Batch& b = node.mapped();
  AddLive(-b.counted);
  if (!b.error.ok() || !b.alloc_error.ok()) {
    emit_(k, !b.error.ok() ? b.error : b.alloc_error);
    return;
  }
  Element e;
  e.epoch = b.epoch;
  const int64_t n = b.expected;
  b.buffer.ids.resize(n);
  e.global_indices = std::move(b.buffer.ids);
  for (Tensor& t : b.buffer.columns) {
    // The short last batch: its first n rows, without a copy.
    if (t.dim(0) != n) t.TruncateLeading(n);
    e.columns.push_back(std::move(t));
  }
  emit_(k, std::move(e));
}

}  // namespace sluice::data_worker::pipeline
