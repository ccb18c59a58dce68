// libFuzzer target for the dispatcher's handlers, called on DispatcherImpl
// directly (no gRPC) on a FakeClock and an InMemoryJournal. The input is a
// sequence of calls, each
//
//   u8 call | u16 little-endian length | length bytes of the request proto
//
// call % 9 picks RegisterDataset, GetOrCreateJob, ClientHeartbeat,
// WorkerRegister, WorkerHeartbeat, WorkerUnregister, DrainWorker, GetJobState,
// or (8) advance the clock by bytes[0] seconds and Tick(). The protocol version
// is set right so that calls reach the logic. Any request must give a response
// or a Status, never a crash, and never Internal (an update the dispatcher
// validated but could not apply). At the end, a new dispatcher must replay the
// journal the calls left. Seeds: tests/fuzz/corpus/dispatcher_fuzzer/, written
// by tests/fuzz/make_seeds.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "dispatcher/dispatcher_impl.h"
#include "dispatcher/journal.h"
#include "proto/dispatcher.pb.h"
#include "proto/worker.pb.h"
#include "tests/testing/sync_dispatcher.h"

namespace sluice::dispatcher {

using ::sluice::testonly::Sync;
namespace {

void Check(const absl::Status& status) {
  if (absl::IsInternal(status)) {
    std::fprintf(stderr, "Internal: %s\n", status.ToString().c_str());
    std::abort();
  }
}

template <typename Request, typename Response, typename Handler>
void Call(const std::string& bytes, Handler handler) {
  Request request;
  if (!request.ParseFromString(bytes)) return;
  request.set_protocol_version(kProtocolVersion);
  Response response;
  Check(handler(request, &response));
}

void Run(const uint8_t* data, size_t size) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  auto journal = std::make_shared<InMemoryJournal>();
  DispatcherOptions options{.clock = &clock, .journal = journal};
  options.snapshot_every = 8;  // exercises compaction too
  auto dispatcher = DispatcherImpl::Create(options);
  if (!dispatcher.ok()) std::abort();
  DispatcherImpl& d = **dispatcher;
  size_t i = 0;
  while (i + 3 <= size) {
    const int call = data[i] % 9;
    size_t n = data[i + 1] | (size_t{data[i + 2]} << 8);
    i += 3;
    if (n > size - i) n = size - i;
    const std::string bytes(reinterpret_cast<const char*>(data + i), n);
    i += n;
    switch (call) {
      case 0:
        Call<proto::RegisterDatasetRequest, proto::RegisterDatasetResponse>(
            bytes, [&](auto& q, auto* r) { return Sync(d).RegisterDataset(q, r); });
        break;
      case 1:
        Call<proto::GetOrCreateJobRequest, proto::GetOrCreateJobResponse>(
            bytes, [&](auto& q, auto* r) { return Sync(d).GetOrCreateJob(q, r); });
        break;
      case 2:
        Call<proto::ClientHeartbeatRequest, proto::ClientHeartbeatResponse>(
            bytes, [&](auto& q, auto* r) { return Sync(d).ClientHeartbeat(q, r); });
        break;
      case 3:
        Call<proto::WorkerRegisterRequest, proto::WorkerRegisterResponse>(
            bytes, [&](auto& q, auto* r) { return Sync(d).WorkerRegister(q, r); });
        break;
      case 4:
        Call<proto::WorkerHeartbeatRequest, proto::WorkerHeartbeatResponse>(
            bytes, [&](auto& q, auto* r) { return Sync(d).WorkerHeartbeat(q, r); });
        break;
      case 5:
        Call<proto::WorkerUnregisterRequest, proto::WorkerUnregisterResponse>(
            bytes, [&](auto& q, auto* r) { return Sync(d).WorkerUnregister(q, r); });
        break;
      case 6:
        Call<proto::DrainWorkerRequest, proto::DrainWorkerResponse>(
            bytes, [&](auto& q, auto* r) { return Sync(d).DrainWorker(q, r); });
        break;
      case 7:
        Call<proto::GetJobStateRequest, proto::GetJobStateResponse>(
            bytes, [&](auto& q, auto* r) { return Sync(d).GetJobState(q, r); });
        break;
      default:
        clock.Advance(absl::Seconds(bytes.empty() ? 1 : uint8_t(bytes[0])));
        Check(d.Tick());
        break;
    }
  }
  dispatcher->reset();
  options.journal = journal;
  auto replayed = DispatcherImpl::Create(options);
  if (!replayed.ok()) {
    std::fprintf(stderr, "replay: %s\n", replayed.status().ToString().c_str());
    std::abort();
  }
}

}  // namespace
}  // namespace sluice::dispatcher

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::dispatcher::Run(data, size);
  return 0;
}
