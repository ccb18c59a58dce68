// The C++ client against a fake dispatcher and fake workers over real gRPC: delivery exactly
// once, ordering, back-pressure, frames, errors with their codes, the dataset's description,
// timeouts on the client's clock. One file (~620 lines) around one set of fakes (fakes.h).
#include "sluice/client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/client/fakes.h"

namespace sluice::client::testing {
namespace {

using ::testing::HasSubstr;

using Origin = std::tuple<uint64_t, uint64_t, uint64_t>;  // (epoch, position, batch index)

proto::Pipeline SyntheticPipeline(int64_t records, int batch_size) {
  proto::Pipeline pipeline;
  pipeline.mutable_source()->mutable_synthetic()->set_num_records(records);
  pipeline.add_nodes()->mutable_batch()->set_size(batch_size);
  return pipeline;
}

ClientOptions Options(const std::string& address) {
  ClientOptions options;
  options.dispatcher_address = address;
  options.connect_timeout = absl::Seconds(5);
  options.rpc_timeout = absl::Seconds(5);
  options.heartbeat_interval = absl::Milliseconds(20);
  return options;
}

JobOptions Job(bool deterministic = false) {
  JobOptions job;
  job.job_name = "test";
  job.pipeline = SyntheticPipeline(/*records=*/100, /*batch_size=*/4);
  job.deterministic = deterministic;
  return job;
}

uint64_t IdOf(const Batch& batch) {
  uint64_t id = 0;
  EXPECT_EQ(batch.columns.at(0).name, "id");
  EXPECT_EQ(batch.columns.at(0).size, sizeof(id));
  std::memcpy(&id, batch.columns.at(0).data, sizeof(id));
  return id;
}

// Reads until the end, checking each batch's payload against its origin.
std::vector<Origin> ReadAll(BatchIterator& it) {
  std::vector<Origin> out;
  while (true) {
    absl::StatusOr<std::optional<Batch>> batch = it.GetNext();
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok() || !batch->has_value()) return out;
    const Batch& b = **batch;
    EXPECT_EQ(IdOf(b), BatchId(b.epoch, b.position, b.batch_index));
    EXPECT_THAT(b.global_indices, ::testing::ElementsAre(IdOf(b)));
    EXPECT_EQ(b.columns[0].dtype, DType::kInt64);
    out.emplace_back(b.epoch, b.position, b.batch_index);
  }
}

std::vector<Origin> AllOrigins(uint64_t epochs, uint64_t positions, uint64_t batches) {
  std::vector<Origin> out;
  for (uint64_t e = 0; e < epochs; ++e) {
    for (uint64_t p = 0; p < positions; ++p) {
      for (uint64_t i = 0; i < batches; ++i) out.emplace_back(e, p, i);
    }
  }
  return out;
}

// Polls `done` until it holds or `timeout` passes (synchronisation with the
// client's threads and the fakes' gRPC threads, not timing); false on timeout.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

TEST(DataServiceClient, DeliversEveryBatchOnceFromOneWorker) {
  FakeWorker worker;
  for (uint64_t p = 0; p < 3; ++p) worker.AddSplit(/*epoch=*/0, p, /*count=*/2);
  TestServer worker_server(&worker);
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/3);
  dispatcher.SetTasks({worker_server.address()});
  TestServer dispatcher_server(&dispatcher);

  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();

  std::vector<Origin> got = ReadAll(**it);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, AllOrigins(1, 3, 2));
  // The end stays the end.
  absl::StatusOr<std::optional<Batch>> again = (*it)->GetNext();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());

  const proto::RegisterDatasetRequest registered = dispatcher.registered();
  EXPECT_THAT(registered.shard_record_counts(), ::testing::ElementsAre(100));
  EXPECT_EQ(registered.batch_size(), 4u);
  EXPECT_EQ(dispatcher.job_request().job_name(), "test");
}

TEST(DataServiceClient, DeliversEveryBatchOnceFromTwoWorkersOverTwoEpochs) {
  FakeWorker a, b;
  for (uint64_t e = 0; e < 2; ++e) {
    for (uint64_t p = 0; p < 4; ++p) (p % 2 == 0 ? a : b).AddSplit(e, p, /*count=*/3);
  }
  TestServer a_server(&a), b_server(&b);
  FakeDispatcher dispatcher(/*num_epochs=*/2, /*positions=*/4);
  dispatcher.SetTasks({a_server.address(), b_server.address()});
  TestServer dispatcher_server(&dispatcher);

  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();

  std::vector<Origin> got = ReadAll(**it);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, AllOrigins(2, 4, 3));
  EXPECT_EQ((*it)->duplicate_batches(), 0u);
  EXPECT_EQ((*it)->epoch(), 1u);
}

TEST(DataServiceClient, KeepsTheListsADispatcherOmitsAndTakesChangedOnes) {
  FakeWorker a, b;
  for (uint64_t e = 0; e < 2; ++e) {
    for (uint64_t p = 0; p < 4; ++p) (p % 2 == 0 ? a : b).AddSplit(e, p, /*count=*/3);
  }
  TestServer a_server(&a), b_server(&b);
  FakeDispatcher dispatcher(/*num_epochs=*/2, /*positions=*/4);
  // Only `a` at first: the client streams from `b` only once a heartbeat
  // answer carries the changed list.
  dispatcher.SetTasks({a_server.address()});
  TestServer dispatcher_server(&dispatcher);

  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();
  std::thread later([&] {
    EXPECT_TRUE(Eventually([&] { return dispatcher.omitted_tasks() >= 3; }));
    dispatcher.SetTasks({a_server.address(), b_server.address()});
  });
  std::vector<Origin> got = ReadAll(**it);
  later.join();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, AllOrigins(2, 4, 3));
  EXPECT_EQ((*it)->duplicate_batches(), 0u);
}

TEST(DataServiceClient, DeliversEveryBatchFromADispatcherWithoutListVersions) {
  FakeWorker a, b;
  for (uint64_t e = 0; e < 2; ++e) {
    for (uint64_t p = 0; p < 4; ++p) (p % 2 == 0 ? a : b).AddSplit(e, p, /*count=*/3);
  }
  TestServer a_server(&a), b_server(&b);
  FakeDispatcher dispatcher(/*num_epochs=*/2, /*positions=*/4);
  dispatcher.SetVersionedLists(false);
  dispatcher.SetTasks({a_server.address(), b_server.address()});
  TestServer dispatcher_server(&dispatcher);

  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();
  std::vector<Origin> got = ReadAll(**it);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, AllOrigins(2, 4, 3));
  EXPECT_EQ(dispatcher.omitted_tasks(), 0);
}

TEST(DataServiceClient, DropsBatchesResentAfterReassignment) {
  // Worker A streams batches 0 and 1 of position 0, then dies. The dispatcher
  // hands the split to worker B with the consumer's prefix; B re-sends 0 and 1
  // (as an in-flight or restarted producer could) before 2 and 3.
  FakeWorker a, b;
  a.Add({0, 0, 0, false});
  a.Add({0, 0, 1, false});
  a.SetFinalStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died"));
  absl::Notification b_may_start;
  b.SetGate(&b_may_start);
  b.Add({0, 0, 1, false});
  b.Add({0, 0, 0, false});
  b.Add({0, 0, 2, false});
  b.Add({0, 0, 3, true});
  TestServer a_server(&a), b_server(&b);
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  dispatcher.SetTasks({a_server.address()});
  TestServer dispatcher_server(&dispatcher);

  prometheus::Registry registry;
  ClientOptions options = Options(dispatcher_server.address());
  options.registry = &registry;
  auto client = DataServiceClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();

  std::vector<Origin> got;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::optional<Batch>> batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok() && batch->has_value()) << batch.status();
    got.emplace_back((*batch)->epoch, (*batch)->position, (*batch)->batch_index);
  }
  // The dispatcher learns the prefix (2 batches) before it reassigns.
  ASSERT_TRUE(Eventually([&] {
    std::vector<proto::ClientSplitProgress> progress = dispatcher.last_progress();
    return progress.size() == 1 && progress[0].delivered_batches() == 2;
  }));
  dispatcher.SetTasks({b_server.address()});
  b_may_start.Notify();

  std::vector<Origin> rest = ReadAll(**it);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, AllOrigins(1, 1, 4));
  EXPECT_EQ((*it)->duplicate_batches(), 2u);

  std::map<std::string, double> metrics;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.metric.empty()) continue;
    const prometheus::ClientMetric& m = family.metric[0];
    metrics[family.name] =
        family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
  }
  EXPECT_EQ(metrics["sluice_client_batches_total"], 4);
  EXPECT_EQ(metrics["sluice_client_duplicate_batches_total"], 2);
  EXPECT_EQ(metrics["sluice_client_buffer_fill"], 0);
  EXPECT_TRUE(metrics.contains("sluice_client_wait_seconds_total"));
}

TEST(DataServiceClient, DeterministicModeReleasesInSequenceOrder) {
  // Worker A holds positions 1 and 3 and streams at once; worker B holds 0 and
  // 2 and starts only after A wrote everything, interleaving its two splits.
  // With a prefetch of 2 the client must buffer A's 6 batches anyway (the
  // sequence's head is behind them) and still release in order.
  FakeWorker a, b;
  a.AddSplit(0, 1, 3);
  a.AddSplit(0, 3, 3);
  absl::Notification b_may_start;
  b.SetGate(&b_may_start);
  for (uint64_t i = 0; i < 3; ++i) {
    b.Add({0, 2, i, i == 2});
    b.Add({0, 0, i, i == 2});
  }
  TestServer a_server(&a), b_server(&b);
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/4);
  dispatcher.SetTasks({a_server.address(), b_server.address()});
  TestServer dispatcher_server(&dispatcher);

  ClientOptions options = Options(dispatcher_server.address());
  options.prefetch_batches = 2;
  auto client = DataServiceClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job(/*deterministic=*/true));
  ASSERT_TRUE(it.ok()) << it.status();
  ASSERT_TRUE(Eventually([&] { return a.drained(); }));
  b_may_start.Notify();

  EXPECT_EQ(ReadAll(**it), AllOrigins(1, 4, 3));
}

TEST(DataServiceClient, FullBufferStallsTheWorkersStream) {
  constexpr int kBatches = 100;
  FakeWorker worker;
  worker.SetPayloadBytes(1 << 20);
  worker.AddSplit(0, 0, kBatches);
  TestServer worker_server(&worker);
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  dispatcher.SetTasks({worker_server.address()});
  TestServer dispatcher_server(&dispatcher);

  ClientOptions options = Options(dispatcher_server.address());
  options.prefetch_batches = 4;
  auto client = DataServiceClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();

  // The client's buffer fills, then the worker's stream waits in a Write for
  // flow-control credit that only the client's reads give back. A client that
  // kept reading would let the worker write all its batches and end the
  // stream (drained) instead.
  ASSERT_TRUE(Eventually(
      [&] { return worker.drained() || ((*it)->buffered_batches() == 4 && worker.in_write()); }));
  EXPECT_FALSE(worker.drained()) << "the worker was not stalled";
  EXPECT_EQ((*it)->buffered_batches(), 4);
  EXPECT_LT(worker.writes(), kBatches / 2) << "the worker was not stalled";

  std::vector<Origin> got = ReadAll(**it);
  EXPECT_EQ(got, AllOrigins(1, 1, kBatches));
}

TEST(DataServiceClient, HandsOverColumnBytesExactlyAsTheWorkerSentThem) {
  FakeWorker worker;
  worker.SetPayloadBytes(3 << 20);  // spans many received slices: one copy
  worker.AddSplit(0, 0, 2);
  TestServer worker_server(&worker);
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  dispatcher.SetTasks({worker_server.address()});
  TestServer dispatcher_server(&dispatcher);
  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();
  absl::StatusOr<std::optional<Batch>> batch = (*it)->GetNext();
  ASSERT_TRUE(batch.ok() && batch->has_value()) << batch.status();
  ASSERT_EQ((*batch)->columns.size(), 2u);
  const Column& id = (*batch)->columns[0];
  ASSERT_EQ(id.size, 8u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(id.data) % 8, 0u);
  uint64_t value;
  std::memcpy(&value, id.data, 8);
  EXPECT_EQ(value, BatchId(0, 0, (*batch)->batch_index));
  const Column& payload = (*batch)->columns[1];
  ASSERT_EQ(payload.size, size_t{3} << 20);
  EXPECT_EQ(payload.bytes(), std::string(size_t{3} << 20, 'x'));
  EXPECT_NE(payload.owner, nullptr);
}

// The status of the first GetNext of a one-split job whose worker sends `frame` first;
// `worker_address` gets the worker's address.
absl::Status FirstGetNextAfterFrame(const std::string& frame, std::string* worker_address) {
  FakeWorker worker;
  worker.AddSplit(0, 0, 1);
  worker.SetFirstFrame(frame);
  TestServer worker_server(&worker);
  *worker_address = worker_server.address();
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  dispatcher.SetTasks({worker_server.address()});
  TestServer dispatcher_server(&dispatcher);
  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  if (!client.ok()) return client.status();
  auto it = (*client)->Open(Job());
  if (!it.ok()) return it.status();
  absl::StatusOr<std::optional<Batch>> batch = (*it)->GetNext();
  EXPECT_FALSE(batch.ok());
  return batch.status();
}

TEST(DataServiceClient, AMalformedFrameIsDataLossNamingTheWorker) {
  std::string address;
  // A header length beyond the frame.
  const absl::Status status = FirstGetNextAfterFrame(std::string("\xff\x00\x00\x00"
                                                                 "abc",
                                                                 7),
                                                     &address);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("malformed batch: batch frame header length"));
  EXPECT_THAT(status.message(), ::testing::HasSubstr(address));
}

TEST(DataServiceClient, AFinishTheClientCannotRunIsDataLoss) {
  // A uint8 [1, 2, 2, 3] column whose finish names HWC2CHW alone.
  service::WireBatch wire;
  wire.header.mutable_key()->set_job_id(kJobId);
  wire.header.add_global_indices(0);
  auto pixels = std::make_shared<std::string>(12, '\x10');
  const int64_t shape[] = {1, 2, 2, 3};
  ASSERT_TRUE(service::AppendColumn("image", record::DType::kUint8, shape,
                                    {reinterpret_cast<const uint8_t*>(pixels->data()), 12, pixels},
                                    &wire)
                  .ok());
  proto::ColumnFinish* finish = wire.header.add_finish();
  finish->set_column(0);
  finish->add_ops()->mutable_hwc2chw();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(service::EncodeBatch(wire).Dump(&slices).ok());
  std::string frame;
  for (const grpc::Slice& slice : slices) {
    frame.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  std::string address;
  const absl::Status status = FirstGetNextAfterFrame(frame, &address);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("cannot finish: finish ops are not a tail"));
}

TEST(DataServiceClient, SurfacesAWorkersInvalidArgumentWithItsAddress) {
  FakeWorker worker;
  worker.SetFinalStatus(
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "map[0].ops[1] (Resize): size must be > 0"));
  TestServer worker_server(&worker);
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  dispatcher.SetTasks({worker_server.address()});
  TestServer dispatcher_server(&dispatcher);

  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();
  absl::StatusOr<std::optional<Batch>> batch = (*it)->GetNext();
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batch.status().message(), HasSubstr(worker_server.address()));
  EXPECT_THAT(batch.status().message(), HasSubstr("size must be > 0"));
  // Final: the same error again.
  EXPECT_EQ((*it)->GetNext().status(), batch.status());
}

TEST(DataServiceClient, RetriesAWorkerThatDoesNotKnowTheJobYet) {
  FakeWorker worker;
  worker.SetFinalStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "job 7 unknown"));
  TestServer worker_server(&worker);
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  dispatcher.SetTasks({worker_server.address()});
  TestServer dispatcher_server(&dispatcher);

  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();
  // The client opens the stream again after each NOT_FOUND.
  ASSERT_TRUE(Eventually([&] { return worker.failed_streams() >= 3; }))
      << worker.failed_streams() << " NOT_FOUND streams";
  worker.SetFinalStatus(grpc::Status::OK);
  worker.AddSplit(0, 0, 2);
  EXPECT_EQ(ReadAll(**it), AllOrigins(1, 1, 2));
  EXPECT_GE(worker.streams(), 4);  // three refused, at least one served
}

int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(DataServiceClient, CreateFailsClearlyWhenNobodyListens) {
  const std::string address = "127.0.0.1:" + std::to_string(UnusedPort());
  ClientOptions options = Options(address);
  options.connect_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<DataServiceClient>> client = DataServiceClient::Create(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(),
              HasSubstr("cannot reach the sluice dispatcher at " + address));
}

// A TCP listener that answers every connection with an HTTP/1.1 error and
// closes it.
class NonGrpcListener {
 public:
  NonGrpcListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    listen(fd_, 16);
    thread_ = std::thread([this] {
      while (true) {
        int conn = accept(fd_, nullptr, nullptr);
        if (conn < 0) return;
        const char kReply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        (void)!write(conn, kReply, sizeof(kReply) - 1);
        close(conn);
      }
    });
  }
  ~NonGrpcListener() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(DataServiceClient, CreateFailsClearlyOnANonGrpcServer) {
  NonGrpcListener listener;
  ClientOptions options = Options(listener.address());
  options.connect_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<DataServiceClient>> client = DataServiceClient::Create(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(),
              HasSubstr("cannot reach the sluice dispatcher at " + listener.address()));
}

TEST(DataServiceClient, CreateReportsAProtocolVersionMismatch) {
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  dispatcher.SetVersion(service::kProtocolVersion + 1);
  TestServer dispatcher_server(&dispatcher);
  absl::StatusOr<std::unique_ptr<DataServiceClient>> client =
      DataServiceClient::Create(Options(dispatcher_server.address()));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("upgrade the client"));
}

TEST(DataServiceClient, OpenReportsAJobTheDispatcherDoesNotKnow) {
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  dispatcher.SetHeartbeatError(grpc::Status(grpc::StatusCode::NOT_FOUND, "job 7 not found"));
  TestServer dispatcher_server(&dispatcher);
  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  EXPECT_EQ(it.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(it.status().message(), HasSubstr("job 7 not found"));
}

TEST(DataServiceClient, GetNextReportsAJobLostLater) {
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  TestServer dispatcher_server(&dispatcher);
  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());
  ASSERT_TRUE(it.ok()) << it.status();
  dispatcher.SetHeartbeatError(grpc::Status(grpc::StatusCode::NOT_FOUND, "job 7 not found"));
  EXPECT_EQ((*it)->GetNext().status().code(), absl::StatusCode::kNotFound);
}

// dispatcher_lost_timeout (10 minutes by default: a trainer outlasts a paused or restarting
// dispatcher) is measured on the injected clock: no test waits ten minutes.
TEST(DataServiceClient, GivesUpOnALostDispatcherAfterTheTimeoutOnItsClock) {
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  TestServer dispatcher_server(&dispatcher);
  FakeClock clock(absl::Now());
  ClientOptions options = Options(dispatcher_server.address());
  options.clock = &clock;
  auto client = DataServiceClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(Job());  // no worker listed: GetNext waits
  ASSERT_TRUE(it.ok()) << it.status();
  dispatcher.SetHeartbeatError(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "dispatcher restarting"));
  // Failed heartbeats, but the client's clock has not moved: not yet lost.
  ASSERT_TRUE(Eventually([&] { return dispatcher.failed_heartbeats() >= 3; }));
  clock.Advance(options.dispatcher_lost_timeout + absl::Seconds(1));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<Batch>> batch = (*it)->GetNext();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(batch.status().message(),
              HasSubstr(absl::StrCat("no answer from the sluice dispatcher at ",
                                     dispatcher_server.address(), " for 10m: ")));
  EXPECT_THAT(batch.status().message(), HasSubstr("dispatcher restarting"));
}

// A dataset's shard sizes come from a data worker (DescribeDataset, tested with the worker),
// not from the trainer's file system: with no worker registered, Open waits connect_timeout
// and says what it waited for. An image folder is refused before anything is asked.
TEST(DataServiceClient, OpenAsksADataWorkerForTheDatasetsShardSizes) {
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  TestServer dispatcher_server(&dispatcher);
  ClientOptions options = Options(dispatcher_server.address());
  options.connect_timeout = absl::Milliseconds(300);
  auto client = DataServiceClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();

  const std::string dir = ::testing::TempDir() + "/not_mounted_here";
  JobOptions job = Job();
  job.pipeline.mutable_source()->mutable_dataset()->set_path(dir);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<BatchIterator>> it = (*client)->Open(job);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(it.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(
      it.status().message(),
      HasSubstr(absl::StrCat("no data worker of the dispatcher at ", dispatcher_server.address(),
                             " read the manifest of dataset '", dir, "' within 300ms")));
  EXPECT_THAT(it.status().message(), HasSubstr("no data worker is registered"));
  EXPECT_GT(dispatcher.status_calls(), 2);  // asked again while waiting
  EXPECT_TRUE(dispatcher.registered().pipeline().empty());

  job.pipeline.mutable_source()->mutable_image_folder()->set_path(dir);
  it = (*client)->Open(job);
  EXPECT_EQ(it.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(it.status().message(), HasSubstr("sluice record convert"));
}

TEST(DataServiceClient, OpenRejectsAConsumerIndexOutOfRange) {
  FakeDispatcher dispatcher(/*num_epochs=*/1, /*positions=*/1);
  TestServer dispatcher_server(&dispatcher);
  auto client = DataServiceClient::Create(Options(dispatcher_server.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  JobOptions job = Job();
  job.num_consumers = 2;
  job.consumer_index = 2;
  EXPECT_EQ((*client)->Open(job).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::client::testing
