// The dispatcher's per-job series (label sluice_job): what the Prometheus
// rules in deploy/monitoring/ compute throughput and trainer wait per job from.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "dispatcher/dispatcher_impl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/sync_dispatcher.h"

namespace sluice::dispatcher {

using ::sluice::testonly::Sync;
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

class DispatcherJobMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DispatcherOptions options;
    options.clock = &clock_;
    options.registry = &registry_;
    options.worker_timeout = absl::Seconds(10);
    options.consumer_timeout = absl::Seconds(60);
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
    proto::RegisterDatasetRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_pipeline("pipe");
    request.add_shard_record_counts(40);
    request.set_batch_size(10);
    proto::RegisterDatasetResponse response;
    ASSERT_TRUE(Sync(impl_).RegisterDataset(request, &response).ok());
    dataset_ = response.dataset_id();
  }

  // A job of 4 splits of 10 records, one epoch.
  uint64_t Job(const std::string& name, uint32_t consumers) {
    proto::GetOrCreateJobRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_name(name);
    request.set_dataset_id(dataset_);
    request.mutable_config()->set_num_epochs(1);
    request.mutable_config()->set_num_consumers(consumers);
    request.mutable_config()->set_split_size(10);
    proto::GetOrCreateJobResponse response;
    absl::Status s = Sync(impl_).GetOrCreateJob(request, &response);
    EXPECT_TRUE(s.ok()) << s;
    return response.job_id();
  }

  void ClientBeat(uint64_t job, uint32_t consumer, uint64_t batches, double wait_total) {
    proto::ClientHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    request.set_consumer_index(consumer);
    request.set_batches_returned_total(batches);
    request.set_wait_seconds_total(wait_total);
    proto::ClientHeartbeatResponse response;
    absl::Status s = Sync(impl_).ClientHeartbeat(request, &response);
    EXPECT_TRUE(s.ok()) << s;
  }

  uint64_t Worker(const std::string& address) {
    proto::WorkerRegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_address(address);
    request.set_capacity(4);
    proto::WorkerRegisterResponse response;
    EXPECT_TRUE(Sync(impl_).WorkerRegister(request, &response).ok());
    return response.worker_id();
  }

  // Positions of the splits the heartbeat hands to `worker`.
  std::vector<uint64_t> WorkerBeat(uint64_t worker) {
    proto::WorkerHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker);
    proto::WorkerHeartbeatResponse response;
    absl::Status s = Sync(impl_).WorkerHeartbeat(request, &response);
    EXPECT_TRUE(s.ok()) << s;
    std::vector<uint64_t> out;
    for (const auto& a : response.start()) out.push_back(a.key().position());
    return out;
  }

  // sluice_job -> value of the family `name`; the unlabeled series under "".
  std::map<std::string, double> Series(const std::string& name) {
    std::map<std::string, double> out;
    for (const auto& family : registry_.Collect()) {
      if (family.name != name) continue;
      for (const auto& metric : family.metric) {
        std::string job;
        for (const auto& label : metric.label) {
          if (label.name == "sluice_job") job = label.value;
        }
        out[job] = family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                                  : metric.gauge.value;
      }
    }
    return out;
  }

  FakeClock clock_;
  prometheus::Registry registry_;
  uint64_t dataset_ = 0;
  std::unique_ptr<DispatcherImpl> impl_;
};

TEST_F(DispatcherJobMetricsTest, ClientHeartbeatsAddUpPerJob) {
  const uint64_t a = Job("a", /*consumers=*/2);
  const uint64_t b = Job("b", /*consumers=*/1);
  ClientBeat(a, /*consumer=*/0, /*batches=*/5, /*wait_total=*/1.5);
  ClientBeat(a, /*consumer=*/1, /*batches=*/3, /*wait_total=*/0.5);
  ClientBeat(a, /*consumer=*/0, /*batches=*/8, /*wait_total=*/2.0);
  ClientBeat(b, /*consumer=*/0, /*batches=*/4, /*wait_total=*/0.25);

  EXPECT_THAT(Series("sluice_dispatcher_job_batches_returned_total"),
              UnorderedElementsAre(Pair("a", 11), Pair("b", 4)));
  // Images: batches times the dataset's batch size (10).
  EXPECT_THAT(Series("sluice_dispatcher_job_elements_returned_total"),
              UnorderedElementsAre(Pair("a", 110), Pair("b", 40)));
  EXPECT_THAT(Series("sluice_dispatcher_job_consumer_wait_seconds_total"),
              UnorderedElementsAre(Pair("a", 2.5), Pair("b", 0.25)));
  EXPECT_THAT(Series("sluice_dispatcher_consumers"),
              UnorderedElementsAre(Pair("a", 2), Pair("b", 1)));
  EXPECT_THAT(Series("sluice_dispatcher_job_splits_reassigned_total"),
              UnorderedElementsAre(Pair("a", 0), Pair("b", 0)));
  // The namespace-wide counter is the sum over jobs.
  EXPECT_THAT(Series("sluice_dispatcher_consumer_wait_seconds_total"), ElementsAre(Pair("", 2.75)));
}

TEST_F(DispatcherJobMetricsTest, ARestartedClientCountsFromZeroAgain) {
  const uint64_t a = Job("a", /*consumers=*/1);
  ClientBeat(a, /*consumer=*/0, /*batches=*/10, /*wait_total=*/3);
  ClientBeat(a, /*consumer=*/0, /*batches=*/2, /*wait_total=*/1);
  EXPECT_THAT(Series("sluice_dispatcher_job_batches_returned_total"), ElementsAre(Pair("a", 12)));
  EXPECT_THAT(Series("sluice_dispatcher_job_consumer_wait_seconds_total"),
              ElementsAre(Pair("a", 4)));
}

TEST_F(DispatcherJobMetricsTest, AnUnnamedJobIsLabeledWithItsId) {
  const uint64_t job = Job("", /*consumers=*/1);
  ClientBeat(job, /*consumer=*/0, /*batches=*/1, /*wait_total=*/0);
  EXPECT_THAT(Series("sluice_dispatcher_job_batches_returned_total"),
              ElementsAre(Pair(absl::StrCat("id-", job), 1)));
}

TEST_F(DispatcherJobMetricsTest, ReassignedSplitsAreCountedForTheirJob) {
  const uint64_t a = Job("a", /*consumers=*/1);
  Job("b", /*consumers=*/1);
  const uint64_t w1 = Worker("w1:1");
  ASSERT_THAT(WorkerBeat(w1), ElementsAre(0, 0, 1, 1));  // 2 of a, 2 of b
  clock_.Advance(absl::Seconds(11));
  const uint64_t w2 = Worker("w2:1");
  ASSERT_TRUE(impl_->Tick().ok());  // w1 lost: its 4 splits wait for progress
  ClientBeat(a, /*consumer=*/0, /*batches=*/0, /*wait_total=*/0);
  // a's 2 lost splits (its consumer reported) and its 2 never assigned; b's lost
  // splits wait for b's consumer.
  EXPECT_THAT(WorkerBeat(w2), UnorderedElementsAre(0, 1, 2, 3));

  EXPECT_THAT(Series("sluice_dispatcher_job_splits_reassigned_total"),
              UnorderedElementsAre(Pair("a", 2), Pair("b", 0)));
  EXPECT_THAT(Series("sluice_dispatcher_splits_reassigned_total"), ElementsAre(Pair("", 2)));
}

TEST_F(DispatcherJobMetricsTest, ACollectedJobsSeriesGo) {
  const uint64_t a = Job("a", /*consumers=*/1);
  const uint64_t b = Job("b", /*consumers=*/1);
  ClientBeat(a, /*consumer=*/0, /*batches=*/1, /*wait_total=*/1);
  ClientBeat(b, /*consumer=*/0, /*batches=*/1, /*wait_total=*/1);
  clock_.Advance(absl::Seconds(40));
  ClientBeat(b, /*consumer=*/0, /*batches=*/2, /*wait_total=*/1);
  clock_.Advance(absl::Seconds(30));  // a silent 70 s > 60 s, b 30 s
  ASSERT_TRUE(impl_->Tick().ok());

  for (const char* name :
       {"sluice_dispatcher_job_batches_returned_total",
        "sluice_dispatcher_job_elements_returned_total",
        "sluice_dispatcher_job_consumer_wait_seconds_total",
        "sluice_dispatcher_job_splits_reassigned_total", "sluice_dispatcher_consumers"}) {
    SCOPED_TRACE(name);
    EXPECT_THAT(Series(name), ElementsAre(Pair("b", testing::_)));
  }
  clock_.Advance(absl::Seconds(61));
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_THAT(Series("sluice_dispatcher_consumers"), IsEmpty());
  EXPECT_THAT(Series("sluice_dispatcher_job_batches_returned_total"), IsEmpty());
  EXPECT_THAT(Series("sluice_dispatcher_job_elements_returned_total"), IsEmpty());

  // A new job of the same name starts its series again.
  const uint64_t again = Job("a", /*consumers=*/1);
  ClientBeat(again, /*consumer=*/0, /*batches=*/3, /*wait_total=*/0);
  EXPECT_THAT(Series("sluice_dispatcher_job_batches_returned_total"), ElementsAre(Pair("a", 3)));
}

}  // namespace
}  // namespace sluice::dispatcher
