#include "dispatcher/dispatcher_impl.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/record/sharding.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace sluice::dispatcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

struct Produced {
  SlotKey key;
  uint64_t batches = 0;
  bool finished = false;
};

struct Delivered {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t batches = 0;
  bool complete = false;
};

class DispatcherImplTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(std::make_shared<InMemoryJournal>()); }

  void Restart(std::shared_ptr<Journal> journal) {
    impl_.reset();
    journal_ = journal;
    DispatcherOptions options;
    options.clock = &clock_;
    options.registry = &registry_;
    options.journal = journal;
    options.worker_timeout = absl::Seconds(10);
    options.limits = limits_;
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
  }

  uint64_t Dataset(std::vector<uint64_t> counts, uint64_t batch,
                   std::string pipeline = "pipe") {
    proto::RegisterDatasetRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_pipeline(pipeline);
    for (uint64_t c : counts) request.add_shard_record_counts(c);
    request.set_batch_size(batch);
    proto::RegisterDatasetResponse response;
    EXPECT_TRUE(impl_->RegisterDataset(request, &response).ok());
    return response.dataset_id();
  }

  proto::GetOrCreateJobRequest JobRequest(const std::string& name,
                                          uint64_t dataset, uint32_t consumers,
                                          proto::RemainderMode remainder,
                                          uint64_t split_size,
                                          uint64_t epochs = 1) {
    proto::GetOrCreateJobRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_name(name);
    request.set_dataset_id(dataset);
    request.mutable_config()->set_seed(7);
    request.mutable_config()->set_num_epochs(epochs);
    request.mutable_config()->set_num_consumers(consumers);
    request.mutable_config()->set_remainder(remainder);
    request.mutable_config()->set_split_size(split_size);
    return request;
  }

  proto::GetOrCreateJobResponse Job(
      const proto::GetOrCreateJobRequest& request) {
    proto::GetOrCreateJobResponse response;
    absl::Status s = impl_->GetOrCreateJob(request, &response);
    EXPECT_TRUE(s.ok()) << s;
    return response;
  }

  uint64_t Worker(const std::string& address, uint32_t capacity) {
    proto::WorkerRegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_address(address);
    request.set_capacity(capacity);
    proto::WorkerRegisterResponse response;
    EXPECT_TRUE(impl_->WorkerRegister(request, &response).ok());
    return response.worker_id();
  }

  absl::StatusOr<proto::WorkerHeartbeatResponse> WorkerBeat(
      uint64_t worker, std::vector<Produced> splits = {}, double rate = 0) {
    proto::WorkerHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker);
    request.set_elements_per_second(rate);
    for (const Produced& p : splits) {
      auto* s = request.add_splits();
      *s->mutable_key() = p.key.ToProto();
      s->set_produced_batches(p.batches);
      s->set_finished_producing(p.finished);
    }
    proto::WorkerHeartbeatResponse response;
    absl::Status s = impl_->WorkerHeartbeat(request, &response);
    if (!s.ok()) return s;
    return response;
  }

  proto::ClientHeartbeatResponse ClientBeat(
      uint64_t job, uint32_t consumer, std::vector<Delivered> progress = {},
      double fill = 0.5, double wait_total = 0) {
    proto::ClientHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    request.set_consumer_index(consumer);
    request.set_buffer_fill(fill);
    request.set_wait_seconds_total(wait_total);
    for (const Delivered& d : progress) {
      auto* p = request.add_progress();
      p->set_epoch(d.epoch);
      p->set_position(d.position);
      p->set_delivered_batches(d.batches);
      p->set_complete(d.complete);
    }
    proto::ClientHeartbeatResponse response;
    absl::Status s = impl_->ClientHeartbeat(request, &response);
    EXPECT_TRUE(s.ok()) << s;
    return response;
  }

  proto::GetJobStateResponse State(uint64_t job) {
    proto::GetJobStateRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    proto::GetJobStateResponse response;
    EXPECT_TRUE(impl_->GetJobState(request, &response).ok());
    return response;
  }

  // The value of the unlabeled counter or gauge `name`; -1 if absent.
  double Metric(const std::string& name) {
    for (const auto& family : registry_.Collect()) {
      if (family.name != name || family.metric.empty()) continue;
      return family.type == prometheus::MetricType::Counter
                 ? family.metric[0].counter.value
                 : family.metric[0].gauge.value;
    }
    return -1;
  }

  static std::vector<uint64_t> Positions(
      const proto::WorkerHeartbeatResponse& r) {
    std::vector<uint64_t> out;
    for (const auto& a : r.start()) out.push_back(a.key().position());
    return out;
  }

  static std::vector<uint64_t> SplitIds(
      const proto::ClientHeartbeatResponse& r) {
    std::vector<uint64_t> out;
    for (const auto& a : r.splits()) out.push_back(a.split_id());
    return out;
  }

  FakeClock clock_;
  prometheus::Registry registry_;
  std::shared_ptr<Journal> journal_;
  service::ServiceLimits limits_;  // for Restart()
  std::unique_ptr<DispatcherImpl> impl_;
};

// The worked example of dispatcher_impl.h: shards of 1000 and 600 records,
// batch 64, split 250.
TEST_F(DispatcherImplTest, RoundsTheSplitSizeToAMultipleOfTheBatchSize) {
  const uint64_t dataset = Dataset({1000, 600}, 64);
  EXPECT_EQ(Job(JobRequest("a", dataset, 1, proto::REMAINDER_MODE_PAD, 250))
                .config()
                .split_size(),
            256u);
  EXPECT_EQ(Job(JobRequest("b", dataset, 1, proto::REMAINDER_MODE_PAD, 10))
                .config()
                .split_size(),
            64u);
  EXPECT_EQ(Job(JobRequest("c", dataset, 1, proto::REMAINDER_MODE_PAD, 0))
                .config()
                .split_size(),
            1024u);
  EXPECT_EQ(Job(JobRequest("d", dataset, 1, proto::REMAINDER_MODE_PAD, 250))
                .splits_per_epoch(),
            7u);
}

TEST_F(DispatcherImplTest, WorkedExampleSharesAreExact) {
  EXPECT_THAT(record::Permutation(7, 7, 0), ElementsAre(3, 1, 5, 2, 6, 0, 4));
  const uint64_t dataset = Dataset({1000, 600}, 64);
  const uint64_t pad =
      Job(JobRequest("pad", dataset, 3, proto::REMAINDER_MODE_PAD, 250))
          .job_id();
  EXPECT_THAT(SplitIds(ClientBeat(pad, 0)), ElementsAre(3, 2, 4));
  EXPECT_THAT(SplitIds(ClientBeat(pad, 1)), ElementsAre(1, 6, 3));
  EXPECT_THAT(SplitIds(ClientBeat(pad, 2)), ElementsAre(5, 0, 1));
  const uint64_t drop =
      Job(JobRequest("drop", dataset, 3, proto::REMAINDER_MODE_DROP, 250))
          .job_id();
  EXPECT_THAT(SplitIds(ClientBeat(drop, 0)), ElementsAre(3, 2));
  EXPECT_THAT(SplitIds(ClientBeat(drop, 1)), ElementsAre(1, 6));
  EXPECT_THAT(SplitIds(ClientBeat(drop, 2)),
              ElementsAre(5, 0));  // split 4 is dropped
  const proto::ClientHeartbeatResponse r = ClientBeat(drop, 2);
  EXPECT_EQ(r.splits(0).shard(), 1u);
  EXPECT_EQ(r.splits(0).begin(), 256u);
  EXPECT_EQ(r.splits(0).end(), 512u);
  EXPECT_EQ(r.splits(0).first_global(), 1256u);
  EXPECT_EQ(r.splits(0).key().position(), 0u);
}

TEST_F(DispatcherImplTest, SharesAreEqualAndDisjointFor1To3Consumers) {
  const uint64_t dataset = Dataset({1000, 600}, 64);  // 7 splits of 256
  for (uint32_t consumers = 1; consumers <= 3; ++consumers) {
    for (proto::RemainderMode mode :
         {proto::REMAINDER_MODE_PAD, proto::REMAINDER_MODE_DROP}) {
      SCOPED_TRACE(::testing::Message() << consumers << " consumers, " << mode);
      const auto job = Job(JobRequest(absl::StrCat("j", consumers, mode),
                                      dataset, consumers, mode, 256));
      const uint64_t share = mode == proto::REMAINDER_MODE_PAD
                                 ? (7 + consumers - 1) / consumers
                                 : 7 / consumers;
      EXPECT_EQ(job.splits_per_consumer(), share);
      std::multiset<uint64_t> all;
      for (uint32_t c = 0; c < consumers; ++c) {
        const std::vector<uint64_t> ids = SplitIds(ClientBeat(job.job_id(), c));
        EXPECT_THAT(ids, SizeIs(share));
        all.insert(ids.begin(), ids.end());
      }
      const std::set<uint64_t> distinct(all.begin(), all.end());
      if (mode == proto::REMAINDER_MODE_DROP) {
        EXPECT_EQ(distinct.size(), all.size());    // disjoint
        EXPECT_EQ(all.size(), 7 - 7 % consumers);  // the tail is dropped
      } else {
        EXPECT_EQ(distinct.size(), 7u);  // every split read
        EXPECT_EQ(all.size() - distinct.size(),
                  share * consumers - 7);  // the padding
      }
    }
  }
}

TEST_F(DispatcherImplTest, DropWithFewerSplitsThanConsumersIsInvalid) {
  const uint64_t dataset = Dataset({100}, 10);
  proto::GetOrCreateJobResponse response;
  absl::Status s = impl_->GetOrCreateJob(
      JobRequest("x", dataset, 3, proto::REMAINDER_MODE_DROP, 50), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lower the split size"));
}

TEST_F(DispatcherImplTest, OneWorkerGetsSplitsInOrderUpToItsCapacity) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 10))
          .job_id();
  const uint64_t w = Worker("w1:1", 2);
  auto r = WorkerBeat(w);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(Positions(*r), ElementsAre(0, 1));
  ASSERT_EQ(r->jobs_size(), 1);
  EXPECT_EQ(r->jobs(0).pipeline(), "pipe");
  EXPECT_EQ(r->jobs(0).batch_size(), 10u);
  // Full: nothing new while both are in production.
  r = WorkerBeat(w, {{{job, 0, 0, 0}, 0, false}, {{job, 0, 0, 1}, 0, false}});
  EXPECT_THAT(Positions(*r), IsEmpty());
  // Position 0 produced: room for one more.
  r = WorkerBeat(w, {{{job, 0, 0, 0}, 1, true}, {{job, 0, 0, 1}, 0, false}});
  EXPECT_THAT(Positions(*r), ElementsAre(2));
  // The consumer has all of position 0: the worker drops it.
  ClientBeat(job, 0, {{0, 0, 1, true}});
  r = WorkerBeat(w, {{{job, 0, 0, 0}, 1, true},
                     {{job, 0, 0, 1}, 1, true},
                     {{job, 0, 0, 2}, 0, false}});
  EXPECT_EQ(r->drop_size(), 1);
  EXPECT_EQ(r->drop(0).position(), 0u);
  EXPECT_THAT(Positions(*r), ElementsAre(3));
}

TEST_F(DispatcherImplTest,
       ThreeWorkersShareTwoConsumersAndFinishTheEpochsExactlyOnce) {
  const uint64_t job = Job(JobRequest("j", Dataset({60, 40}, 10), 2,
                                      proto::REMAINDER_MODE_PAD, 20, 2))
                           .job_id();
  // 5 splits -> 3 slots per consumer per epoch.
  std::vector<uint64_t> workers = {Worker("a:1", 1), Worker("b:1", 1),
                                   Worker("c:1", 1)};
  std::map<uint64_t, std::vector<Produced>> held;  // worker -> splits it holds
  std::map<SlotKey, int> produced;
  for (int round = 0; round < 50; ++round) {
    for (uint64_t w : workers) {
      auto r = WorkerBeat(w, held[w]);
      ASSERT_TRUE(r.ok());
      for (const auto& d : r->drop()) {
        std::erase_if(held[w], [&](const Produced& p) {
          return p.key == SlotKey::FromProto(d);
        });
      }
      for (const auto& a : r->start()) {
        EXPECT_EQ(a.skip_batches(), 0u);
        held[w].push_back(
            {SlotKey::FromProto(a.key()), 2, true});  // produced at once
        ++produced[SlotKey::FromProto(a.key())];
      }
    }
    if (round == 0) {
      // One split each, alternating consumers (fewest in production first).
      std::set<uint32_t> consumers;
      for (uint64_t w : workers) consumers.insert(held[w][0].key.consumer);
      EXPECT_THAT(consumers, SizeIs(2));
    }
    // Each consumer receives everything the workers produced for it.
    for (uint32_t c = 0; c < 2; ++c) {
      std::vector<Delivered> progress;
      for (uint64_t w : workers) {
        for (const Produced& p : held[w]) {
          if (p.key.consumer == c)
            progress.push_back({p.key.epoch, p.key.position, 2, true});
        }
      }
      ClientBeat(job, c, progress);
    }
  }
  const proto::GetJobStateResponse final_state = State(job);
  for (const auto& c : final_state.consumers()) EXPECT_TRUE(c.finished());
  EXPECT_THAT(produced, SizeIs(2 * 2 * 3));  // consumers x epochs x slots
  for (const auto& [key, n] : produced) EXPECT_EQ(n, 1);
}

TEST_F(
    DispatcherImplTest,
    LostWorkersSplitIsReassignedOnlyAfterTheConsumerReportsAndSkipsItsPrefix) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 40))
          .job_id();
  const uint64_t w1 = Worker("w1:1", 1);
  auto r = WorkerBeat(w1);
  ASSERT_THAT(Positions(*r), ElementsAre(0));
  r = WorkerBeat(w1, {{{job, 0, 0, 0}, 3, false}});
  ClientBeat(job, 0, {{0, 0, 2, false}});

  clock_.Advance(absl::Seconds(6));
  const uint64_t w2 = Worker("w2:1", 1);
  ASSERT_TRUE(impl_->Tick().ok());  // w1 silent 6 s < 10 s: still alive
  EXPECT_EQ(State(job).consumers(0).splits(0).worker_id(), w1);
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(WorkerBeat(w2).ok());
  ASSERT_TRUE(impl_->Tick().ok());  // w1 silent 11 s: lost

  EXPECT_EQ(State(job).consumers(0).splits(0).status(),
            proto::SPLIT_STATUS_AWAITING_PROGRESS);
  EXPECT_EQ(WorkerBeat(w1).status().code(), absl::StatusCode::kNotFound);
  r = WorkerBeat(w2);
  EXPECT_THAT(Positions(*r),
              IsEmpty());  // not before the consumer said how far it got

  const proto::ClientHeartbeatResponse client =
      ClientBeat(job, 0, {{0, 0, 3, false}});
  ASSERT_EQ(client.tasks_size(), 1);
  EXPECT_EQ(client.tasks(0).address(), "w2:1");
  r = WorkerBeat(w2);
  ASSERT_THAT(Positions(*r), ElementsAre(0));
  EXPECT_EQ(r->start(0).skip_batches(), 3u);
  const auto state = State(job).consumers(0).splits(0);
  EXPECT_EQ(state.status(), proto::SPLIT_STATUS_ASSIGNED);
  EXPECT_EQ(state.worker_id(), w2);
  EXPECT_EQ(state.assignments(), 2u);
  EXPECT_EQ(Metric("sluice_dispatcher_splits_assigned_total"), 1);
  EXPECT_EQ(Metric("sluice_dispatcher_splits_reassigned_total"), 1);
  EXPECT_EQ(Metric("sluice_dispatcher_workers_lost_total"), 1);
  EXPECT_EQ(Metric("sluice_dispatcher_workers"), 1);

  ClientBeat(job, 0, {{0, 0, 4, true}});
  EXPECT_EQ(Metric("sluice_dispatcher_splits_done_total"), 1);
  EXPECT_TRUE(ClientBeat(job, 0).finished());
}

TEST_F(DispatcherImplTest, SplitAWorkerStopsReportingIsHandedBack) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 20))
          .job_id();
  const uint64_t w = Worker("w:1", 2);
  ASSERT_THAT(Positions(*WorkerBeat(w)), ElementsAre(0, 1));
  // The response was lost: the worker only knows position 1.
  auto r = WorkerBeat(w, {{{job, 0, 0, 1}, 0, false}});
  EXPECT_THAT(Positions(*r), IsEmpty());
  EXPECT_EQ(State(job).consumers(0).splits(0).status(),
            proto::SPLIT_STATUS_AWAITING_PROGRESS);
  ClientBeat(job, 0, {});
  r = WorkerBeat(w, {{{job, 0, 0, 1}, 0, false}});
  ASSERT_THAT(Positions(*r), ElementsAre(0));
  EXPECT_EQ(r->start(0).skip_batches(), 0u);
}

TEST_F(DispatcherImplTest,
       DrainingWorkerHandsBackUnfinishedSplitsAndMayExitWhenEmpty) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 20))
          .job_id();
  const uint64_t w1 = Worker("w1:1", 2);
  ASSERT_THAT(Positions(*WorkerBeat(w1)), ElementsAre(0, 1));
  ASSERT_TRUE(
      WorkerBeat(w1, {{{job, 0, 0, 0}, 2, true}, {{job, 0, 0, 1}, 1, false}})
          .ok());

  proto::DrainWorkerRequest drain;
  drain.set_protocol_version(kProtocolVersion);
  drain.set_worker_id(w1);
  proto::DrainWorkerResponse drained;
  ASSERT_TRUE(impl_->DrainWorker(drain, &drained).ok());
  EXPECT_EQ(drained.handed_back(), 1u);

  auto r =
      WorkerBeat(w1, {{{job, 0, 0, 0}, 2, true}, {{job, 0, 0, 1}, 1, false}});
  EXPECT_TRUE(r->draining());
  EXPECT_FALSE(r->may_exit());
  ASSERT_EQ(r->drop_size(), 1);
  EXPECT_EQ(r->drop(0).position(), 1u);
  EXPECT_THAT(Positions(*r), IsEmpty());

  const uint64_t w2 = Worker("w2:1", 2);
  EXPECT_THAT(Positions(*WorkerBeat(w2)),
              IsEmpty());  // awaits the consumer's report
  ClientBeat(job, 0, {{0, 1, 1, false}});
  r = WorkerBeat(w2);
  ASSERT_THAT(Positions(*r), ElementsAre(1));
  EXPECT_EQ(r->start(0).skip_batches(), 1u);

  ClientBeat(job, 0, {{0, 0, 2, true}});
  r = WorkerBeat(w1, {{{job, 0, 0, 0}, 2, true}});
  EXPECT_TRUE(r->may_exit());
}

TEST_F(DispatcherImplTest, RestartedOrUnregisteredWorkerLosesItsSplits) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 20))
          .job_id();
  const uint64_t old_id = Worker("w:1", 1);
  ASSERT_THAT(Positions(*WorkerBeat(old_id)), ElementsAre(0));
  const uint64_t new_id = Worker("w:1", 1);  // same address: a restart
  EXPECT_NE(new_id, old_id);
  EXPECT_EQ(WorkerBeat(old_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(State(job).consumers(0).splits(0).status(),
            proto::SPLIT_STATUS_AWAITING_PROGRESS);

  ASSERT_THAT(Positions(*WorkerBeat(new_id)), ElementsAre(1));
  proto::WorkerUnregisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_worker_id(new_id);
  proto::WorkerUnregisterResponse response;
  ASSERT_TRUE(impl_->WorkerUnregister(request, &response).ok());
  EXPECT_EQ(State(job).consumers(0).splits(1).status(),
            proto::SPLIT_STATUS_AWAITING_PROGRESS);
  EXPECT_EQ(impl_->WorkerUnregister(request, &response).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(DispatcherImplTest,
       ProtocolVersionMismatchIsFailedPreconditionWithAHint) {
  proto::RegisterDatasetRequest request;
  request.set_protocol_version(99);
  proto::RegisterDatasetResponse response;
  absl::Status s = impl_->RegisterDataset(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("client protocol version 99, dispatcher 2: upgrade"));
  proto::WorkerHeartbeatRequest beat;  // version 0
  proto::WorkerHeartbeatResponse beat_response;
  EXPECT_EQ(impl_->WorkerHeartbeat(beat, &beat_response).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(DispatcherImplTest, LimitsAreRefusedNamingTheirFlags) {
  limits_ = {
      .max_pipeline_bytes = 8, .max_jobs = 1, .max_consumers_per_job = 2};
  Restart(std::make_shared<InMemoryJournal>());

  proto::RegisterDatasetRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_pipeline("nine byte");
  request.add_shard_record_counts(100);
  request.set_batch_size(10);
  proto::RegisterDatasetResponse response;
  absl::Status s = impl_->RegisterDataset(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            "RegisterDataset: pipeline spec is 9 bytes, more than "
            "--max-pipeline-bytes 8");

  const uint64_t dataset = Dataset({100}, 10, "8 bytes!");
  proto::GetOrCreateJobResponse job;
  s = impl_->GetOrCreateJob(
      JobRequest("three", dataset, 3, proto::REMAINDER_MODE_PAD, 10), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            "num_consumers 3 is more than --max-consumers-per-job 2");

  Job(JobRequest("first", dataset, 2, proto::REMAINDER_MODE_PAD, 10));
  s = impl_->GetOrCreateJob(
      JobRequest("second", dataset, 1, proto::REMAINDER_MODE_PAD, 10), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("(--max-jobs 1)"));
}

TEST_F(DispatcherImplTest, UnknownJobIsNotFound) {
  proto::ClientHeartbeatRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_job_id(42);
  proto::ClientHeartbeatResponse response;
  EXPECT_EQ(impl_->ClientHeartbeat(request, &response).code(),
            absl::StatusCode::kNotFound);
  proto::GetJobStateRequest state;
  state.set_protocol_version(kProtocolVersion);
  state.set_job_id(42);
  proto::GetJobStateResponse state_response;
  EXPECT_EQ(impl_->GetJobState(state, &state_response).code(),
            absl::StatusCode::kNotFound);
  proto::GetOrCreateJobResponse job;
  EXPECT_EQ(impl_
                ->GetOrCreateJob(
                    JobRequest("x", 5, 1, proto::REMAINDER_MODE_PAD, 1), &job)
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(DispatcherImplTest, JobNameIsIdempotentForTheSameConfigOnly) {
  const uint64_t dataset = Dataset({100}, 10);
  const auto first =
      Job(JobRequest("train", dataset, 2, proto::REMAINDER_MODE_PAD, 20));
  EXPECT_TRUE(first.created());
  // 19 rounds to the same 20-record split size: the same normalized config.
  const auto again =
      Job(JobRequest("train", dataset, 2, proto::REMAINDER_MODE_PAD, 19));
  EXPECT_FALSE(again.created());
  EXPECT_EQ(again.job_id(), first.job_id());

  proto::GetOrCreateJobResponse response;
  absl::Status s = impl_->GetOrCreateJob(
      JobRequest("train", dataset, 3, proto::REMAINDER_MODE_PAD, 20),
      &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("use another job name"));
  // Anonymous jobs are always new.
  EXPECT_NE(
      Job(JobRequest("", dataset, 1, proto::REMAINDER_MODE_PAD, 20)).job_id(),
      Job(JobRequest("", dataset, 1, proto::REMAINDER_MODE_PAD, 20)).job_id());
}

TEST_F(DispatcherImplTest, RegisterDatasetIsIdempotentAndValidates) {
  EXPECT_EQ(Dataset({10, 20}, 5), Dataset({10, 20}, 5));
  EXPECT_NE(Dataset({10, 20}, 5), Dataset({10, 21}, 5));
  EXPECT_NE(Dataset({10, 20}, 5), Dataset({10, 20}, 5, "other"));
  proto::RegisterDatasetRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_pipeline("p");
  request.add_shard_record_counts(10);
  proto::RegisterDatasetResponse response;
  EXPECT_EQ(impl_->RegisterDataset(request, &response).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DispatcherImplTest, ParallelEpochsGivesEveryWorkerEveryConsumer) {
  auto request =
      JobRequest("p", Dataset({100}, 10), 2, proto::REMAINDER_MODE_PAD, 20);
  request.mutable_config()->set_mode(proto::PROCESSING_MODE_PARALLEL_EPOCHS);
  const uint64_t job = Job(request).job_id();
  for (const char* address : {"a:1", "b:1"}) {
    auto r = WorkerBeat(Worker(address, 1));
    EXPECT_EQ(r->start_size(), 0);
    ASSERT_EQ(r->start_parallel_size(), 2);
    EXPECT_EQ(r->start_parallel(1).job_id(), job);
    EXPECT_EQ(r->start_parallel(1).consumer_index(), 1u);
    EXPECT_EQ(r->jobs_size(), 1);
  }
}

// The autoscaling signal is tested in dispatcher_autoscale_test.cc.

TEST_F(DispatcherImplTest, ARestartedDispatcherReplaysItsJournal) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 10))
          .job_id();
  const uint64_t w = Worker("w:1", 2);
  ASSERT_TRUE(WorkerBeat(w).ok());
  ClientBeat(job, 0, {{0, 0, 1, true}});
  const std::string before = State(job).SerializeAsString();
  Restart(journal_);
  EXPECT_EQ(State(job).SerializeAsString(), before);
  EXPECT_TRUE(WorkerBeat(w).ok());  // the worker is still known
}

}  // namespace
}  // namespace sluice::dispatcher
