#include "data_worker/ops/synthetic_load.h"

#include <time.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice::data_worker {
namespace {

int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

class SpinOpImpl final : public Op {
 public:
  SpinOpImpl(OpLabel label, int64_t cpu_micros)
      : label_(std::move(label)), cpu_nanos_(cpu_micros * 1000) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    // Thread CPU time, not wall time: a descheduled thread does not count as
    // spinning.
    const int64_t end = ThreadCpuNanos() + cpu_nanos_;
    volatile uint64_t sink = 0;
    while (ThreadCpuNanos() < end) {
      for (int i = 0; i < 64; ++i) sink = sink + i;
    }
    return input;
  }

 private:
  OpLabel label_;
  int64_t cpu_nanos_;
};

class SleepOpImpl final : public Op {
 public:
  SleepOpImpl(OpLabel label, int64_t micros) : label_(std::move(label)), micros_(micros) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    absl::SleepFor(absl::Microseconds(micros_));
    return input;
  }

 private:
  OpLabel label_;
  int64_t micros_;
};

// One element should never take more than a minute of synthetic load.
constexpr int64_t kMaxMicros = 60'000'000;

}  // namespace

absl::StatusOr<std::unique_ptr<Op>> MakeSpin(const proto::SpinOp& spec, OpLabel label) {
  if (spec.cpu_micros() < 0 || spec.cpu_micros() > kMaxMicros) {
    return label.FieldError(
        "cpu_micros", absl::StrCat("must be in [0, ", kMaxMicros, "], got ", spec.cpu_micros()));
  }
  return std::make_unique<SpinOpImpl>(std::move(label), spec.cpu_micros());
}

absl::StatusOr<std::unique_ptr<Op>> MakeSleep(const proto::SleepOp& spec, OpLabel label) {
  if (spec.micros() < 0 || spec.micros() > kMaxMicros) {
    return label.FieldError("micros",
                            absl::StrCat("must be in [0, ", kMaxMicros, "], got ", spec.micros()));
  }
  return std::make_unique<SleepOpImpl>(std::move(label), spec.micros());
}

}  // namespace sluice::data_worker
