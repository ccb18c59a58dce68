// DispatcherImpl's protocol on a FakeClock, without gRPC: datasets and jobs, split hand-out and
// progress, lost and draining workers, durability of answers. One file (~850 lines) because
// the cases share one fixture of scripted workers and consumers.
#include "dispatcher/dispatcher_impl.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/record/sharding.h"
#include "dispatcher/sqlite_journal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/sync_dispatcher.h"
#include "tests/testing/temp_dir.h"

namespace sluice::dispatcher {

using ::sluice::testonly::Sync;
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

struct Produced {
  SlotKey key;
  uint64_t batches = 0;
  bool finished = false;
  bool detached = false;
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
    options.snapshot_every = snapshot_every_;
    options.limits = limits_;
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
  }

  uint64_t Dataset(std::vector<uint64_t> counts, uint64_t batch, std::string pipeline = "pipe") {
    proto::RegisterDatasetRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_pipeline(pipeline);
    for (uint64_t c : counts) request.add_shard_record_counts(c);
    request.set_batch_size(batch);
    proto::RegisterDatasetResponse response;
    EXPECT_TRUE(Sync(impl_).RegisterDataset(request, &response).ok());
    return response.dataset_id();
  }

  proto::GetOrCreateJobRequest JobRequest(const std::string& name, uint64_t dataset,
                                          uint32_t consumers, proto::RemainderMode remainder,
                                          uint64_t split_size, uint64_t epochs = 1) {
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

  proto::GetOrCreateJobResponse Job(const proto::GetOrCreateJobRequest& request) {
    proto::GetOrCreateJobResponse response;
    absl::Status s = Sync(impl_).GetOrCreateJob(request, &response);
    EXPECT_TRUE(s.ok()) << s;
    return response;
  }

  uint64_t Worker(const std::string& address, uint32_t capacity) {
    proto::WorkerRegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_address(address);
    request.set_capacity(capacity);
    proto::WorkerRegisterResponse response;
    EXPECT_TRUE(Sync(impl_).WorkerRegister(request, &response).ok());
    return response.worker_id();
  }

  absl::StatusOr<proto::WorkerHeartbeatResponse> WorkerBeat(uint64_t worker,
                                                            std::vector<Produced> splits = {},
                                                            double rate = 0) {
    proto::WorkerHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker);
    request.set_elements_per_second(rate);
    for (const Produced& p : splits) {
      auto* s = request.add_splits();
      *s->mutable_key() = p.key.ToProto();
      s->set_produced_batches(p.batches);
      s->set_finished_producing(p.finished);
      s->set_detached(p.detached);
    }
    proto::WorkerHeartbeatResponse response;
    absl::Status s = Sync(impl_).WorkerHeartbeat(request, &response);
    if (!s.ok()) return s;
    return response;
  }

  proto::ClientHeartbeatResponse ClientBeat(uint64_t job, uint32_t consumer,
                                            std::vector<Delivered> progress = {}, double fill = 0.5,
                                            double wait_total = 0) {
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
    absl::Status s = Sync(impl_).ClientHeartbeat(request, &response);
    EXPECT_TRUE(s.ok()) << s;
    return response;
  }

  proto::GetJobStateResponse State(uint64_t job) {
    proto::GetJobStateRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    proto::GetJobStateResponse response;
    EXPECT_TRUE(Sync(impl_).GetJobState(request, &response).ok());
    return response;
  }

  // The value of the unlabeled counter or gauge `name`; -1 if absent.
  double Metric(const std::string& name) {
    for (const auto& family : registry_.Collect()) {
      if (family.name != name || family.metric.empty()) continue;
      return family.type == prometheus::MetricType::Counter ? family.metric[0].counter.value
                                                            : family.metric[0].gauge.value;
    }
    return -1;
  }

  static std::vector<uint64_t> Positions(const proto::WorkerHeartbeatResponse& r) {
    std::vector<uint64_t> out;
    for (const auto& a : r.start()) out.push_back(a.key().position());
    return out;
  }

  // Each slot of the response as "split[offset,end)+split[offset,end)".
  static std::vector<std::string> Slots(const proto::ClientHeartbeatResponse& r) {
    std::vector<std::string> out;
    for (const auto& a : r.splits()) {
      std::string slot;
      for (const proto::SplitPiece& p : a.pieces()) {
        absl::StrAppend(&slot, slot.empty() ? "" : "+", p.split_id(), "[", p.offset(), ",",
                        p.offset() + p.count(), ")");
      }
      out.push_back(slot);
    }
    return out;
  }

  FakeClock clock_;
  prometheus::Registry registry_;
  uint64_t snapshot_every_ = 10000;
  std::shared_ptr<Journal> journal_;
  service::ServiceLimits limits_;  // for Restart()
  std::unique_ptr<DispatcherImpl> impl_;
};

// The worked example of dispatcher_impl.h: shards of 1000 and 600 records,
// batch 64, split 250.
TEST_F(DispatcherImplTest, RoundsTheSplitSizeToAMultipleOfTheBatchSize) {
  const uint64_t dataset = Dataset({1000, 600}, 64);
  EXPECT_EQ(Job(JobRequest("a", dataset, 1, proto::REMAINDER_MODE_PAD, 250)).config().split_size(),
            256u);
  EXPECT_EQ(Job(JobRequest("b", dataset, 1, proto::REMAINDER_MODE_PAD, 10)).config().split_size(),
            64u);
  EXPECT_EQ(Job(JobRequest("d", dataset, 1, proto::REMAINDER_MODE_PAD, 250)).splits_per_epoch(),
            7u);
}

TEST_F(DispatcherImplTest, TheDefaultSplitSizeGivesEveryConsumerSeveralSlots) {
  // A large share: the default 1024. A small one: about 4 slots per consumer, whole batches.
  EXPECT_EQ(Job(JobRequest("big", Dataset({100000}, 64), 2, proto::REMAINDER_MODE_PAD, 0))
                .config()
                .split_size(),
            1024u);
  const auto small = Job(JobRequest("small", Dataset({2000}, 16), 3, proto::REMAINDER_MODE_PAD, 0));
  EXPECT_EQ(small.config().split_size(),
            160u);  // share 667 / 4 = 166 -> 10 batches of 16
  EXPECT_EQ(small.records_per_consumer(), 667u);
  EXPECT_EQ(small.splits_per_consumer(), 5u);  // 4 x 160 + 27
  // Smaller than a batch per slot: one batch.
  EXPECT_EQ(Job(JobRequest("tiny", Dataset({10}, 4), 2, proto::REMAINDER_MODE_PAD, 0))
                .config()
                .split_size(),
            4u);
}

TEST_F(DispatcherImplTest, WorkedExampleSharesAreExact) {
  EXPECT_THAT(record::Permutation(7, 7, 0), ElementsAre(3, 1, 5, 2, 6, 0, 4));
  const uint64_t dataset = Dataset({1000, 600}, 64);
  const auto pad = Job(JobRequest("pad", dataset, 3, proto::REMAINDER_MODE_PAD, 250));
  EXPECT_EQ(pad.records_per_consumer(), 534u);
  EXPECT_EQ(pad.splits_per_consumer(), 3u);
  EXPECT_THAT(Slots(ClientBeat(pad.job_id(), 0)),
              ElementsAre("3[0,232)+1[0,24)", "1[24,256)+5[0,24)", "5[24,46)"));
  EXPECT_THAT(Slots(ClientBeat(pad.job_id(), 1)),
              ElementsAre("5[46,256)+2[0,46)", "2[46,256)+6[0,46)", "6[46,68)"));
  EXPECT_THAT(Slots(ClientBeat(pad.job_id(), 2)),
              ElementsAre("6[68,88)+0[0,236)", "0[236,256)+4[0,236)", "4[236,256)+3[0,2)"));
  const auto drop = Job(JobRequest("drop", dataset, 3, proto::REMAINDER_MODE_DROP, 250));
  EXPECT_EQ(drop.records_per_consumer(), 533u);
  EXPECT_THAT(Slots(ClientBeat(drop.job_id(), 2)),
              ElementsAre("6[66,88)+0[0,234)", "0[234,256)+4[0,234)",
                          "4[234,255)"));  // record 255 of split 4 is dropped
  const proto::ClientHeartbeatResponse r = ClientBeat(drop.job_id(), 2);
  EXPECT_EQ(r.splits(0).pieces(1).first_global(),
            0u);  // split 0 = shard 0 [0, 256)
  EXPECT_EQ(r.splits(0).pieces(1).records(), 256u);
  EXPECT_EQ(r.splits(0).pieces(0).first_global(),
            1512u);  // split 6 = shard 1 [512, 600)
  EXPECT_EQ(r.splits(0).pieces(0).records(), 88u);
  EXPECT_EQ(r.splits(0).key().position(), 0u);
}

TEST_F(DispatcherImplTest, SharesAreEqualInRecordsAndBatchesFor1To5Consumers) {
  const uint64_t dataset = Dataset({1000, 600}, 64);  // 7 splits of <= 256, 1600 records
  for (uint32_t consumers = 1; consumers <= 5; ++consumers) {
    for (proto::RemainderMode mode : {proto::REMAINDER_MODE_PAD, proto::REMAINDER_MODE_DROP}) {
      SCOPED_TRACE(::testing::Message() << consumers << " consumers, " << mode);
      const auto job =
          Job(JobRequest(absl::StrCat("j", consumers, mode), dataset, consumers, mode, 256));
      const uint64_t share =
          mode == proto::REMAINDER_MODE_PAD ? (1600 + consumers - 1) / consumers : 1600 / consumers;
      EXPECT_EQ(job.records_per_consumer(), share);
      std::map<uint64_t, int> times;  // global record -> how often read
      for (uint32_t c = 0; c < consumers; ++c) {
        const proto::ClientHeartbeatResponse r = ClientBeat(job.job_id(), c);
        EXPECT_EQ(static_cast<uint64_t>(r.splits_size()), job.splits_per_consumer());
        uint64_t records = 0;
        for (const auto& a : r.splits()) {
          uint64_t slot = 0;
          for (const proto::SplitPiece& p : a.pieces()) {
            slot += p.count();
            // Without a shuffle node the split's record order is the natural one.
            for (uint64_t i = p.offset(); i < p.offset() + p.count(); ++i)
              ++times[p.first_global() + i];
          }
          if (a.key().position() + 1 < static_cast<uint64_t>(r.splits_size())) {
            EXPECT_EQ(slot, 256u);  // whole batches: equal batch counts follow
          }
          records += slot;
        }
        EXPECT_EQ(records, share);
      }
      uint64_t twice = 0;
      for (const auto& [id, n] : times) {
        ASSERT_LT(id, 1600u);
        ASSERT_LE(n, 2);
        if (n == 2) ++twice;
      }
      if (mode == proto::REMAINDER_MODE_DROP) {
        EXPECT_EQ(twice, 0u);
        EXPECT_EQ(times.size(), share * consumers);  // 1600 mod C dropped
      } else {
        EXPECT_EQ(times.size(), 1600u);  // every record read
        EXPECT_EQ(twice, share * consumers - 1600);
      }
    }
  }
}

TEST_F(DispatcherImplTest, DropWithFewerRecordsThanConsumersIsInvalid) {
  const uint64_t dataset = Dataset({2}, 1);
  proto::GetOrCreateJobResponse response;
  absl::Status s = Sync(impl_).GetOrCreateJob(
      JobRequest("x", dataset, 3, proto::REMAINDER_MODE_DROP, 1), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("fewer than the 3 consumers"));
  // With fewer splits than consumers, DROP still gives everyone an equal share.
  const auto job = Job(JobRequest("y", Dataset({100}, 10), 3, proto::REMAINDER_MODE_DROP, 50));
  EXPECT_EQ(job.records_per_consumer(), 33u);
}

TEST_F(DispatcherImplTest, OneWorkerGetsSplitsInOrderUpToItsCapacity) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 10)).job_id();
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
  r = WorkerBeat(
      w, {{{job, 0, 0, 0}, 1, true}, {{job, 0, 0, 1}, 1, true}, {{job, 0, 0, 2}, 0, false}});
  EXPECT_EQ(r->drop_size(), 1);
  EXPECT_EQ(r->drop(0).position(), 0u);
  EXPECT_THAT(Positions(*r), ElementsAre(3));
}

TEST_F(DispatcherImplTest, ThreeWorkersShareTwoConsumersAndFinishTheEpochsExactlyOnce) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({60, 40}, 10), 2, proto::REMAINDER_MODE_PAD, 20, 2)).job_id();
  // 5 splits -> 3 slots per consumer per epoch.
  std::vector<uint64_t> workers = {Worker("a:1", 1), Worker("b:1", 1), Worker("c:1", 1)};
  std::map<uint64_t, std::vector<Produced>> held;  // worker -> splits it holds
  std::map<SlotKey, int> produced;
  for (int round = 0; round < 50; ++round) {
    for (uint64_t w : workers) {
      auto r = WorkerBeat(w, held[w]);
      ASSERT_TRUE(r.ok());
      for (const auto& d : r->drop()) {
        std::erase_if(held[w], [&](const Produced& p) { return p.key == SlotKey::FromProto(d); });
      }
      for (const auto& a : r->start()) {
        EXPECT_EQ(a.skip_batches(), 0u);
        held[w].push_back({SlotKey::FromProto(a.key()), 2, true});  // produced at once
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
          if (p.key.consumer == c) progress.push_back({p.key.epoch, p.key.position, 2, true});
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

TEST_F(DispatcherImplTest,
       LostWorkersSplitIsReassignedOnlyAfterTheConsumerReportsAndSkipsItsPrefix) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 40)).job_id();
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

  EXPECT_EQ(State(job).consumers(0).splits(0).status(), proto::SPLIT_STATUS_AWAITING_PROGRESS);
  EXPECT_EQ(WorkerBeat(w1).status().code(), absl::StatusCode::kNotFound);
  r = WorkerBeat(w2);
  EXPECT_THAT(Positions(*r),
              IsEmpty());  // not before the consumer said how far it got

  const proto::ClientHeartbeatResponse client = ClientBeat(job, 0, {{0, 0, 3, false}});
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
  std::map<std::string, double> lost;  // by reason
  for (const auto& family : registry_.Collect()) {
    if (family.name != "sluice_dispatcher_workers_lost_total") continue;
    for (const auto& metric : family.metric) {
      ASSERT_EQ(metric.label.size(), 1u);
      EXPECT_EQ(metric.label[0].name, "reason");
      lost[metric.label[0].value] = metric.counter.value;
    }
  }
  EXPECT_EQ(lost,
            (std::map<std::string, double>{{"restarted", 0}, {"timeout", 1}, {"unregistered", 0}}));
  EXPECT_EQ(Metric("sluice_dispatcher_workers"), 1);

  ClientBeat(job, 0, {{0, 0, 4, true}});
  EXPECT_EQ(Metric("sluice_dispatcher_splits_done_total"), 1);
  EXPECT_TRUE(ClientBeat(job, 0).finished());
}

// A name reused while its finished job is still kept for late readers joins that job, which
// has nothing left: the response says so, so the client can tell its user why it reads
// nothing (it said nothing and read 0 records before).
TEST_F(DispatcherImplTest, JoiningAFinishedJobSaysItIsAlreadyFinished) {
  const auto request = JobRequest("done", Dataset({10}, 10), 1, proto::REMAINDER_MODE_PAD, 10);
  const proto::GetOrCreateJobResponse first = Job(request);
  EXPECT_FALSE(first.already_finished());
  const uint64_t w = Worker("w:1", 1);
  auto r = WorkerBeat(w);
  ASSERT_THAT(Positions(*r), ElementsAre(0));
  ClientBeat(first.job_id(), 0);
  ClientBeat(first.job_id(), 0, {{0, 0, 1, true}});
  ASSERT_TRUE(ClientBeat(first.job_id(), 0).finished());
  const proto::GetOrCreateJobResponse again = Job(request);
  EXPECT_FALSE(again.created());
  EXPECT_EQ(again.job_id(), first.job_id());
  EXPECT_TRUE(again.already_finished());
}

// Job A (2 slots per epoch, 2 epochs) on a worker of capacity 3: once epoch 0 has nothing left to
// hand out, the third producer starts epoch 1's first slot, before epoch 0 is done. A new job
// B's slots of its current epoch then come before A's following epoch.
TEST_F(DispatcherImplTest, TheNextEpochsSlotsGoOutBeforeTheCurrentOneIsDoneAfterOtherJobsWork) {
  const uint64_t dataset = Dataset({40}, 10);
  const uint64_t a = Job(JobRequest("a", dataset, 1, proto::REMAINDER_MODE_PAD, 20, 2)).job_id();
  const uint64_t w = Worker("w:1", 3);
  auto r = WorkerBeat(w);
  ASSERT_TRUE(r.ok());
  std::vector<SlotKey> started;
  for (const auto& s : r->start()) started.push_back(SlotKey::FromProto(s.key()));
  EXPECT_THAT(started, ElementsAre(SlotKey{a, 0, 0, 0}, SlotKey{a, 0, 0, 1}, SlotKey{a, 0, 1, 0}));
  const uint64_t b = Job(JobRequest("b", dataset, 1, proto::REMAINDER_MODE_PAD, 20, 1)).job_id();
  r = WorkerBeat(w, {{{a, 0, 0, 0}, 2, true}, {{a, 0, 0, 1}, 2, true}, {{a, 0, 1, 0}, 2, true}});
  ASSERT_TRUE(r.ok());
  started.clear();
  for (const auto& s : r->start()) started.push_back(SlotKey::FromProto(s.key()));
  EXPECT_THAT(started, ElementsAre(SlotKey{b, 0, 0, 0}, SlotKey{b, 0, 0, 1}, SlotKey{a, 0, 1, 1}));
  // The consumer reads epoch 0 to its end and the first batch of epoch 1 in one report.
  proto::ClientHeartbeatResponse client =
      ClientBeat(a, 0, {{0, 0, 2, true}, {0, 1, 2, true}, {1, 0, 1, false}});
  EXPECT_EQ(client.epoch(), 1u);
  const proto::GetJobStateResponse state = State(a);
  ASSERT_EQ(state.consumers(0).splits_size(), 2);
  EXPECT_EQ(state.consumers(0).splits(0).status(), proto::SPLIT_STATUS_ASSIGNED);
  EXPECT_EQ(state.consumers(0).splits(0).delivered_batches(), 1u);
  EXPECT_EQ(state.consumers(0).splits(1).worker_id(), w);
}

// A slot of the following epoch handed back by a lost worker becomes assignable with the
// consumer's next report, which is journaled (a restart replays the reassignment).
TEST_F(DispatcherImplTest, AFollowingEpochsSlotOfALostWorkerIsReassignedAndReplayed) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 20, 3)).job_id();
  const uint64_t w1 = Worker("w1:1", 3);
  auto r = WorkerBeat(w1);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->start_size(), 3);
  EXPECT_EQ(SlotKey::FromProto(r->start(2).key()), (SlotKey{job, 0, 1, 0}));
  ClientBeat(job, 0, {{0, 0, 1, false}});
  clock_.Advance(absl::Seconds(11));
  const uint64_t w2 = Worker("w2:1", 3);
  ASSERT_TRUE(impl_->Tick().ok());  // w1 lost: all three slots wait for the consumer's report
  r = WorkerBeat(w2);
  EXPECT_EQ(r->start_size(), 0);
  ClientBeat(job, 0, {{0, 0, 1, false}});  // nothing of epoch 1 delivered
  r = WorkerBeat(w2);
  std::vector<SlotKey> started;
  for (const auto& s : r->start()) started.push_back(SlotKey::FromProto(s.key()));
  EXPECT_THAT(started,
              ElementsAre(SlotKey{job, 0, 0, 0}, SlotKey{job, 0, 0, 1}, SlotKey{job, 0, 1, 0}));
  EXPECT_EQ(r->start(0).skip_batches(), 1u);
  Restart(journal_);
  r = WorkerBeat(w2,
                 {{{job, 0, 0, 0}, 2, true}, {{job, 0, 0, 1}, 2, true}, {{job, 0, 1, 0}, 2, true}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->drop_size(), 0);
  // Epoch 0 returned, and epoch 1's first slot: epoch 1 is the consumer's, its slot 0 on w2.
  ClientBeat(job, 0, {{0, 0, 2, true}, {0, 1, 2, true}, {1, 0, 2, true}});
  const proto::GetJobStateResponse state = State(job);
  EXPECT_EQ(state.consumers(0).epoch(), 1u);
  EXPECT_EQ(state.consumers(0).splits(0).status(), proto::SPLIT_STATUS_DONE);
}

TEST_F(DispatcherImplTest, SplitAWorkerStopsReportingIsHandedBack) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 20)).job_id();
  const uint64_t w = Worker("w:1", 2);
  ASSERT_THAT(Positions(*WorkerBeat(w)), ElementsAre(0, 1));
  // The response was lost: the worker only knows position 1.
  auto r = WorkerBeat(w, {{{job, 0, 0, 1}, 0, false}});
  EXPECT_THAT(Positions(*r), IsEmpty());
  EXPECT_EQ(State(job).consumers(0).splits(0).status(), proto::SPLIT_STATUS_AWAITING_PROGRESS);
  ClientBeat(job, 0, {});
  r = WorkerBeat(w, {{{job, 0, 0, 1}, 0, false}});
  ASSERT_THAT(Positions(*r), ElementsAre(0));
  EXPECT_EQ(r->start(0).skip_batches(), 0u);
}

TEST_F(DispatcherImplTest, DrainingWorkerHandsBackUnfinishedSplitsAndMayExitWhenEmpty) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 20)).job_id();
  const uint64_t w1 = Worker("w1:1", 2);
  ASSERT_THAT(Positions(*WorkerBeat(w1)), ElementsAre(0, 1));
  ASSERT_TRUE(WorkerBeat(w1, {{{job, 0, 0, 0}, 2, true}, {{job, 0, 0, 1}, 1, false}}).ok());

  proto::DrainWorkerRequest drain;
  drain.set_protocol_version(kProtocolVersion);
  drain.set_worker_id(w1);
  proto::DrainWorkerResponse drained;
  ASSERT_TRUE(Sync(impl_).DrainWorker(drain, &drained).ok());
  EXPECT_EQ(drained.handed_back(), 1u);

  auto r = WorkerBeat(w1, {{{job, 0, 0, 0}, 2, true}, {{job, 0, 0, 1}, 1, false}});
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
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 20)).job_id();
  const uint64_t old_id = Worker("w:1", 1);
  ASSERT_THAT(Positions(*WorkerBeat(old_id)), ElementsAre(0));
  const uint64_t new_id = Worker("w:1", 1);  // same address: a restart
  EXPECT_NE(new_id, old_id);
  EXPECT_EQ(WorkerBeat(old_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(State(job).consumers(0).splits(0).status(), proto::SPLIT_STATUS_AWAITING_PROGRESS);

  ASSERT_THAT(Positions(*WorkerBeat(new_id)), ElementsAre(1));
  proto::WorkerUnregisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_worker_id(new_id);
  proto::WorkerUnregisterResponse response;
  ASSERT_TRUE(Sync(impl_).WorkerUnregister(request, &response).ok());
  EXPECT_EQ(State(job).consumers(0).splits(1).status(), proto::SPLIT_STATUS_AWAITING_PROGRESS);
  EXPECT_EQ(Sync(impl_).WorkerUnregister(request, &response).code(), absl::StatusCode::kNotFound);
}

TEST_F(DispatcherImplTest, ProtocolVersionMismatchIsFailedPreconditionWithAHint) {
  proto::RegisterDatasetRequest request;
  request.set_protocol_version(99);
  proto::RegisterDatasetResponse response;
  absl::Status s = Sync(impl_).RegisterDataset(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("client protocol version 99, dispatcher ",
                                                  kProtocolVersion, ": upgrade")));
  proto::WorkerHeartbeatRequest beat;  // version 0
  proto::WorkerHeartbeatResponse beat_response;
  EXPECT_EQ(Sync(impl_).WorkerHeartbeat(beat, &beat_response).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(DispatcherImplTest, LimitsAreRefusedNamingTheirFlags) {
  limits_ = {.max_pipeline_bytes = 8, .max_jobs = 1, .max_consumers_per_job = 2};
  Restart(std::make_shared<InMemoryJournal>());

  proto::RegisterDatasetRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_pipeline("nine byte");
  request.add_shard_record_counts(100);
  request.set_batch_size(10);
  proto::RegisterDatasetResponse response;
  absl::Status s = Sync(impl_).RegisterDataset(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            "RegisterDataset: pipeline spec is 9 bytes, more than "
            "--max-pipeline-bytes 8");

  const uint64_t dataset = Dataset({100}, 10, "8 bytes!");
  proto::GetOrCreateJobResponse job;
  s = Sync(impl_).GetOrCreateJob(JobRequest("three", dataset, 3, proto::REMAINDER_MODE_PAD, 10),
                                 &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "num_consumers 3 is more than --max-consumers-per-job 2");

  Job(JobRequest("first", dataset, 2, proto::REMAINDER_MODE_PAD, 10));
  s = Sync(impl_).GetOrCreateJob(JobRequest("second", dataset, 1, proto::REMAINDER_MODE_PAD, 10),
                                 &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("(--max-jobs 1)"));
}

TEST_F(DispatcherImplTest, AbsurdRecordCountsAndTooManySplitsAreRefused) {
  limits_.max_splits_per_job = 10;
  Restart(std::make_shared<InMemoryJournal>());
  proto::RegisterDatasetRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_pipeline("spec");
  request.add_shard_record_counts(uint64_t{1} << 47);
  request.add_shard_record_counts(uint64_t{1} << 47);
  request.add_shard_record_counts(1);
  request.set_batch_size(10);
  proto::RegisterDatasetResponse response;
  absl::Status s = Sync(impl_).RegisterDataset(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            "RegisterDataset: shard_record_counts add up to more than "
            "281474976710656 records, which no dataset has: send the counts "
            "the worker's DescribeDataset reports");
  // A count that wraps uint64 around is refused the same way.
  request.set_shard_record_counts(0, ~uint64_t{0});
  request.set_shard_record_counts(1, 2);
  EXPECT_EQ(Sync(impl_).RegisterDataset(request, &response).code(),
            absl::StatusCode::kInvalidArgument);

  // 10^12 records in splits of 20: refused before any split is enumerated.
  const uint64_t huge = Dataset({1000000000000ull}, 10);
  proto::GetOrCreateJobResponse job;
  s = Sync(impl_).GetOrCreateJob(JobRequest("huge", huge, 1, proto::REMAINDER_MODE_PAD, 20), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(),
            "the job would have 50000000000 splits of 20 records, more than "
            "--max-splits-per-job 10: set a larger split_size, or raise "
            "--max-splits-per-job");
  // 10 splits of 20 are allowed; 11 are not.
  const uint64_t small = Dataset({200}, 10, "small");
  Job(JobRequest("ten", small, 1, proto::REMAINDER_MODE_PAD, 20));
  s = Sync(impl_).GetOrCreateJob(
      JobRequest("eleven", Dataset({201}, 10, "eleven"), 1, proto::REMAINDER_MODE_PAD, 20), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST_F(DispatcherImplTest, JobsPerIdentityAreCappedByTheOwnerInTheirName) {
  limits_.max_jobs_per_identity = 2;
  Restart(std::make_shared<InMemoryJournal>());
  const uint64_t dataset = Dataset({100}, 10);
  Job(JobRequest("alice/a", dataset, 1, proto::REMAINDER_MODE_PAD, 20));
  Job(JobRequest("alice/b", dataset, 1, proto::REMAINDER_MODE_PAD, 20));
  proto::GetOrCreateJobResponse job;
  absl::Status s = Sync(impl_).GetOrCreateJob(
      JobRequest("alice/c", dataset, 1, proto::REMAINDER_MODE_PAD, 20), &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(),
            "alice already holds 2 jobs (--max-jobs-per-identity 2): wait for "
            "one to finish, or ask an operator to raise "
            "--max-jobs-per-identity");
  // An existing job is still answered; bob and unscoped (development) names are not counted.
  EXPECT_FALSE(Job(JobRequest("alice/a", dataset, 1, proto::REMAINDER_MODE_PAD, 20)).created());
  Job(JobRequest("bob/a", dataset, 1, proto::REMAINDER_MODE_PAD, 20));
  Job(JobRequest("x", dataset, 1, proto::REMAINDER_MODE_PAD, 20));
  Job(JobRequest("y", dataset, 1, proto::REMAINDER_MODE_PAD, 20));
  Job(JobRequest("z", dataset, 1, proto::REMAINDER_MODE_PAD, 20));
}

TEST_F(DispatcherImplTest, UnknownJobIsNotFound) {
  proto::ClientHeartbeatRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_job_id(42);
  proto::ClientHeartbeatResponse response;
  EXPECT_EQ(Sync(impl_).ClientHeartbeat(request, &response).code(), absl::StatusCode::kNotFound);
  proto::GetJobStateRequest state;
  state.set_protocol_version(kProtocolVersion);
  state.set_job_id(42);
  proto::GetJobStateResponse state_response;
  EXPECT_EQ(Sync(impl_).GetJobState(state, &state_response).code(), absl::StatusCode::kNotFound);
  proto::GetOrCreateJobResponse job;
  EXPECT_EQ(
      Sync(impl_).GetOrCreateJob(JobRequest("x", 5, 1, proto::REMAINDER_MODE_PAD, 1), &job).code(),
      absl::StatusCode::kNotFound);
}

// min_workers is a uint32 on the wire and an int in the allocation: 4294967295 is refused,
// naming the field (it was accepted and shown as a reservation of 2147483647).
TEST_F(DispatcherImplTest, MinWorkersAboveInt32IsRefusedNamingIt) {
  const uint64_t dataset = Dataset({100}, 10);
  proto::GetOrCreateJobRequest request =
      JobRequest("greedy", dataset, 1, proto::REMAINDER_MODE_PAD, 20);
  request.mutable_config()->set_min_workers(4294967295u);
  proto::GetOrCreateJobResponse response;
  const absl::Status s = Sync(impl_).GetOrCreateJob(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "min_workers 4294967295 is more than 2147483647");
  request.mutable_config()->set_min_workers(2147483647u);
  EXPECT_TRUE(Sync(impl_).GetOrCreateJob(request, &response).ok());
}

TEST_F(DispatcherImplTest, JobNameIsIdempotentForTheSameConfigOnly) {
  const uint64_t dataset = Dataset({100}, 10);
  const auto first = Job(JobRequest("train", dataset, 2, proto::REMAINDER_MODE_PAD, 20));
  EXPECT_TRUE(first.created());
  // 19 rounds to the same 20-record split size: the same normalized config.
  const auto again = Job(JobRequest("train", dataset, 2, proto::REMAINDER_MODE_PAD, 19));
  EXPECT_FALSE(again.created());
  EXPECT_EQ(again.job_id(), first.job_id());

  proto::GetOrCreateJobResponse response;
  absl::Status s = Sync(impl_).GetOrCreateJob(
      JobRequest("train", dataset, 3, proto::REMAINDER_MODE_PAD, 20), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("use another job name"));
  // The message shows what differs, the job options included.
  proto::GetOrCreateJobRequest urgent =
      JobRequest("train", dataset, 2, proto::REMAINDER_MODE_PAD, 20);
  urgent.mutable_config()->set_priority(5);
  urgent.mutable_config()->set_min_workers(3);
  s = Sync(impl_).GetOrCreateJob(urgent, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("split_size 20, priority 0, min_workers 0, sharing off"));
  EXPECT_THAT(s.message(), HasSubstr("split_size 20, priority 5, min_workers 3, sharing off"));
  EXPECT_THAT(s.message(), HasSubstr("slots_follow_splits false} (priority 0 -> 5, min_workers "
                                     "0 -> 3): use another job name or the same settings"));
  // Anonymous jobs are always new.
  EXPECT_NE(Job(JobRequest("", dataset, 1, proto::REMAINDER_MODE_PAD, 20)).job_id(),
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
  EXPECT_EQ(Sync(impl_).RegisterDataset(request, &response).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DispatcherImplTest, ParallelEpochsGivesEveryWorkerEveryConsumer) {
  auto request = JobRequest("p", Dataset({100}, 10), 2, proto::REMAINDER_MODE_PAD, 20);
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
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 10)).job_id();
  const uint64_t w = Worker("w:1", 2);
  ASSERT_TRUE(WorkerBeat(w).ok());
  ClientBeat(job, 0, {{0, 0, 1, true}});
  const std::string before = State(job).SerializeAsString();
  Restart(journal_);
  EXPECT_EQ(State(job).SerializeAsString(), before);
  EXPECT_TRUE(WorkerBeat(w).ok());  // the worker is still known
}

// A ClientHeartbeat that echoes list versions (ClientBeat sends none).
proto::ClientHeartbeatResponse VersionedBeat(DispatcherImpl& impl, uint64_t job,
                                             uint64_t tasks_version, uint64_t splits_version,
                                             std::vector<Delivered> progress = {}) {
  proto::ClientHeartbeatRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_job_id(job);
  request.set_tasks_version(tasks_version);
  request.set_splits_version(splits_version);
  for (const Delivered& d : progress) {
    auto* p = request.add_progress();
    p->set_epoch(d.epoch);
    p->set_position(d.position);
    p->set_delivered_batches(d.batches);
    p->set_complete(d.complete);
  }
  proto::ClientHeartbeatResponse response;
  absl::Status s = Sync(impl).ClientHeartbeat(request, &response);
  EXPECT_TRUE(s.ok()) << s;
  return response;
}

TEST_F(DispatcherImplTest, ClientHeartbeatOmitsTheListsTheClientHolds) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 10)).job_id();
  Worker("w1:1", 1);
  Worker("w2:1", 1);
  // A client without versions (also one that predates them) gets everything.
  const proto::ClientHeartbeatResponse first = ClientBeat(job, 0);
  EXPECT_EQ(first.tasks_size(), 2);
  EXPECT_EQ(first.splits_size(), 4);
  EXPECT_NE(first.tasks_version(), 0u);
  EXPECT_NE(first.splits_version(), 0u);
  EXPECT_EQ(ClientBeat(job, 0).tasks_size(), 2);

  // Echoing both versions: both lists omitted, the rest still answered.
  const proto::ClientHeartbeatResponse same =
      VersionedBeat(*impl_, job, first.tasks_version(), first.splits_version(), {{0, 0, 1, true}});
  EXPECT_EQ(same.tasks_size(), 0);
  EXPECT_EQ(same.splits_size(), 0);
  EXPECT_EQ(same.tasks_version(), first.tasks_version());
  EXPECT_EQ(same.splits_version(), first.splits_version());
  EXPECT_THAT(same.done_positions(), ElementsAre(0));
  EXPECT_EQ(same.epoch(), 0u);
}

TEST_F(DispatcherImplTest, ClientHeartbeatSendsAListAgainWhenItChanged) {
  const uint64_t job = Job(JobRequest("j", Dataset({20}, 10), 1, proto::REMAINDER_MODE_PAD, 10,
                                      /*epochs=*/2))
                           .job_id();
  Worker("w1:1", 1);
  const proto::ClientHeartbeatResponse first = ClientBeat(job, 0);
  ASSERT_EQ(first.tasks_size(), 1);

  // A worker registers: a new task list; the split sequence is unchanged.
  const uint64_t w2 = Worker("w2:1", 1);
  proto::ClientHeartbeatResponse r =
      VersionedBeat(*impl_, job, first.tasks_version(), first.splits_version());
  EXPECT_NE(r.tasks_version(), first.tasks_version());
  EXPECT_EQ(r.tasks_size(), 2);
  EXPECT_EQ(r.splits_size(), 0);
  const uint64_t two_workers = r.tasks_version();

  // The consumer completes epoch 0: the sequence of epoch 1 comes in full.
  r = VersionedBeat(*impl_, job, two_workers, first.splits_version(),
                    {{0, 0, 2, true}, {0, 1, 2, true}});
  EXPECT_EQ(r.epoch(), 1u);
  EXPECT_NE(r.splits_version(), first.splits_version());
  EXPECT_EQ(r.splits_size(), 2);
  EXPECT_EQ(r.splits(0).key().epoch(), 1u);
  EXPECT_EQ(r.tasks_size(), 0);

  // The worker leaves: the list shrinks, back to the one-worker contents but
  // under the version of those contents.
  proto::WorkerUnregisterRequest bye;
  bye.set_protocol_version(kProtocolVersion);
  bye.set_worker_id(w2);
  proto::WorkerUnregisterResponse bye_response;
  ASSERT_TRUE(Sync(impl_).WorkerUnregister(bye, &bye_response).ok());
  r = VersionedBeat(*impl_, job, two_workers, r.splits_version());
  EXPECT_EQ(r.tasks_size(), 1);
  EXPECT_EQ(r.tasks_version(), first.tasks_version());
}

TEST_F(DispatcherImplTest, AClientWithVersionsFromBeforeADispatcherRestartGetsTheWholeLists) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 10)).job_id();
  Worker("w1:1", 1);
  const proto::ClientHeartbeatResponse before = ClientBeat(job, 0);
  Restart(journal_);  // same state, replayed
  const proto::ClientHeartbeatResponse after =
      VersionedBeat(*impl_, job, before.tasks_version(), before.splits_version());
  EXPECT_NE(after.tasks_version(), before.tasks_version());
  EXPECT_NE(after.splits_version(), before.splits_version());
  ASSERT_EQ(after.tasks_size(), 1);
  EXPECT_EQ(after.tasks(0).address(), "w1:1");
  EXPECT_EQ(after.splits_size(), 4);
  // ... and from then on the new versions are omitted again.
  const proto::ClientHeartbeatResponse again =
      VersionedBeat(*impl_, job, after.tasks_version(), after.splits_version());
  EXPECT_EQ(again.tasks_size(), 0);
  EXPECT_EQ(again.splits_size(), 0);
}

TEST_F(DispatcherImplTest, RepeatedHeartbeatsThatChangeNothingAreNotJournaled) {
  const uint64_t job =
      Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 10)).job_id();
  const uint64_t w = Worker("w1:1", 2);
  ASSERT_TRUE(WorkerBeat(w).ok());  // assigns positions 0 and 1
  ClientBeat(job, 0, {{0, 0, 1, false}});
  const uint64_t journaled = journal_->updates_since_snapshot();
  for (int i = 0; i < 5; ++i) {
    // Counters move (or repeat), nothing finishes, completes or is assigned.
    ASSERT_TRUE(WorkerBeat(w, {{{job, 0, 0, 0}, 1, false},
                               {{job, 0, 0, 1}, static_cast<uint64_t>(i), false}})
                    .ok());
    ClientBeat(job, 0, {{0, 0, 1, false}}, /*fill=*/0.1 * i, /*wait_total=*/i);
  }
  EXPECT_EQ(journal_->updates_since_snapshot(), journaled);
  // A split finishing production is a real change.
  ASSERT_TRUE(WorkerBeat(w, {{{job, 0, 0, 0}, 1, true}, {{job, 0, 0, 1}, 1, false}}).ok());
  EXPECT_GT(journal_->updates_since_snapshot(), journaled);
}

TEST_F(DispatcherImplTest, ARestartReplaysSnapshotsThatLaterCommitsWrote) {
  // The SQLite journal writes a snapshot with the commit after the one that
  // crossed snapshot_every (Journal::EnqueueSnapshot), outside the mutex.
  testing::TempDir dir;
  snapshot_every_ = 3;
  auto journal = SqliteJournal::Open(dir.path());
  ASSERT_TRUE(journal.ok()) << journal.status();
  Restart(std::shared_ptr<Journal>(std::move(*journal)));
  const uint64_t job = Job(JobRequest("j", Dataset({40}, 10), 1, proto::REMAINDER_MODE_PAD, 10,
                                      /*epochs=*/2))
                           .job_id();
  const uint64_t w = Worker("w:1", 2);
  ASSERT_TRUE(WorkerBeat(w).ok());  // positions 0, 1
  ClientBeat(job, 0, {{0, 0, 1, true}});
  ASSERT_TRUE(WorkerBeat(w, {{{job, 0, 0, 0}, 1, true}, {{job, 0, 0, 1}, 1, true}}).ok());
  ClientBeat(job, 0, {{0, 1, 1, true}});
  const std::string before = State(job).SerializeAsString();
  EXPECT_LT(journal_->updates_since_snapshot(), 3u);  // snapshots were written

  impl_.reset();
  journal_.reset();
  auto reopened = SqliteJournal::Open(dir.path());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  Restart(std::shared_ptr<Journal>(std::move(*reopened)));
  EXPECT_EQ(State(job).SerializeAsString(), before);
  EXPECT_TRUE(WorkerBeat(w).ok());
}

// The state consumer `index` of 3 saved in epoch 0 of job "r": per position, (batches, complete).
proto::ConsumerCheckpoint State3(uint32_t index,
                                 std::vector<std::tuple<uint64_t, uint64_t, bool>> slots) {
  proto::ConsumerCheckpoint c;
  c.set_version(1);
  c.set_job_name("r");
  c.set_consumer_index(index);
  c.set_num_consumers(3);
  c.set_job_fingerprint(5);
  c.set_split_size(10);
  for (const auto& [position, batches, complete] : slots) {
    proto::ClientSplitProgress* p = c.add_splits();
    p->set_position(position);
    p->set_delivered_batches(batches);
    p->set_complete(complete);
  }
  return c;
}

TEST_F(DispatcherImplTest, ARestoringConsumerSendsTheSlotsItReturnedWholeAsRuns) {
  // 60 records, batch 5, slots of 10: one consumer of 6 slots of 2 batches.
  const uint64_t ds = Dataset({60}, 5);
  const proto::GetOrCreateJobResponse created =
      Job(JobRequest("j", ds, /*consumers=*/1, proto::REMAINDER_MODE_PAD, /*split_size=*/10));
  EXPECT_TRUE(created.restore_ranges());
  // The checkpoint returned slots 0, 1 and 3 whole and one batch of slot 4.
  auto restore = [&](std::vector<uint64_t> ranges, proto::ClientHeartbeatResponse* response) {
    proto::ClientHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(created.job_id());
    request.set_restore(true);
    request.set_restore_epoch(0);
    request.set_splits_count_only(true);
    request.set_done_as_ranges(true);
    for (uint64_t r : ranges) request.add_restore_complete_ranges(r);
    proto::ClientSplitProgress* p = request.add_progress();
    p->set_position(4);
    p->set_delivered_batches(1);
    return Sync(impl_).ClientHeartbeat(request, response);
  };
  proto::ClientHeartbeatResponse response;
  ASSERT_TRUE(restore({0, 2, 3, 4}, &response).ok());
  EXPECT_THAT(response.done_ranges(), ElementsAre(0, 2, 3, 4));
  const proto::GetJobStateResponse state = State(created.job_id());
  ASSERT_EQ(state.consumers_size(), 1);
  ASSERT_EQ(state.consumers(0).splits_size(), 6);
  std::vector<std::pair<proto::SplitStatus, uint64_t>> got;  // status, skip_batches
  for (const proto::SplitState& s : state.consumers(0).splits())
    got.emplace_back(s.status(), s.skip_batches());
  const std::vector<std::pair<proto::SplitStatus, uint64_t>> want = {
      {proto::SPLIT_STATUS_DONE, 0},    {proto::SPLIT_STATUS_DONE, 0},
      {proto::SPLIT_STATUS_PENDING, 0}, {proto::SPLIT_STATUS_DONE, 0},
      {proto::SPLIT_STATUS_PENDING, 1}, {proto::SPLIT_STATUS_PENDING, 0}};
  EXPECT_EQ(got, want);
  // The journaled state is compact: the runs, and only the slot returned in part.
  const Journal::Contents journaled = *journal_->Read();
  ASSERT_FALSE(journaled.updates.empty());
  const proto::Update& last = journaled.updates.back();
  ASSERT_TRUE(last.has_consumer_state());
  EXPECT_EQ(last.consumer_state().num_slots(), 6u);
  EXPECT_THAT(last.consumer_state().done_ranges(), ElementsAre(0, 2, 3, 4));
  ASSERT_EQ(last.consumer_state().slots_size(), 1);
  EXPECT_EQ(last.consumer_state().slots(0).position(), 4u);
  EXPECT_EQ(last.consumer_state().slots(0).skip_batches(), 1u);
  Restart(journal_);
  EXPECT_EQ(State(created.job_id()).SerializeAsString(), state.SerializeAsString());
  // Runs past the consumer's 6 slots, or not ascending pairs: refused.
  for (const std::vector<uint64_t>& bad :
       std::vector<std::vector<uint64_t>>{{0, 7}, {3, 4, 0, 1}, {2}}) {
    const absl::Status s = restore(bad, &response);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.size();
    EXPECT_THAT(std::string(s.message()), HasSubstr("restore_complete_ranges must be ascending"));
  }
}

TEST_F(DispatcherImplTest, ResumedStatesWhoseCompleteRunsAreDamagedAreRefused) {
  // 60 records, slots of 10: each of 3 old consumers has 2 slots.
  const uint64_t ds = Dataset({60}, 5);
  for (const std::vector<uint64_t>& ranges :
       std::vector<std::vector<uint64_t>>{{0, 3}, {1, 0}, {1, 2, 0, 1}, {0}}) {
    proto::GetOrCreateJobRequest request =
        JobRequest("r", ds, /*consumers=*/2, proto::REMAINDER_MODE_PAD, /*split_size=*/10);
    *request.add_resize_from() = State3(0, {});
    *request.add_resize_from() = State3(1, {});
    proto::ConsumerCheckpoint damaged = State3(2, {});
    for (uint64_t r : ranges) damaged.add_complete_ranges(r);
    *request.add_resize_from() = damaged;
    proto::GetOrCreateJobResponse response;
    const absl::Status s = Sync(impl_).GetOrCreateJob(request, &response);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << ranges.size();
    EXPECT_THAT(std::string(s.message()), HasSubstr("the restored state of consumer 2 has"));
  }
}

TEST_F(DispatcherImplTest, ThreeStatesResumeOnTwoConsumersAndARestartKeepsTheLayout) {
  // 60 records, batch 5, slots of 10: 3 consumers of 2 slots of 2 batches. Consumer 0 returned
  // its slot 0, consumer 1 one batch, consumer 2 nothing: 9 batches left, 5 + 4.
  const uint64_t ds = Dataset({60}, 5);
  proto::GetOrCreateJobRequest request =
      JobRequest("r", ds, /*consumers=*/2, proto::REMAINDER_MODE_PAD, /*split_size=*/10);
  *request.add_resize_from() = State3(2, {});
  *request.add_resize_from() = State3(0, {{0, 2, true}});
  *request.add_resize_from() = State3(1, {{0, 1, false}});
  const proto::GetOrCreateJobResponse created = Job(request);
  ASSERT_TRUE(created.created());
  // The old layout: what 3 consumers read (record::ConsumerSlots, not the code under test).
  proto::JobConfig old_config;
  old_config.set_seed(7);
  old_config.set_num_consumers(3);
  old_config.set_split_size(10);
  old_config.set_remainder(proto::REMAINDER_MODE_PAD);
  auto splits = record::EnumerateSplits({60}, 10);
  ASSERT_TRUE(splits.ok());
  auto old = [&](uint32_t k, uint64_t p) {
    return DispatcherState::ConsumerSlots(old_config, *splits, k, 0).value()[p];
  };
  struct Want {
    record::SlotPieces pieces;
    uint64_t first, end;
  };
  const std::vector<std::vector<Want>> want = {
      {{old(0, 1), 0, 0}, {old(1, 0), 1, 0}, {old(1, 1), 0, 0}},  // 2 + 1 + 2 batches
      {{old(2, 0), 0, 0}, {old(2, 1), 0, 0}}};                    // 2 + 2
  auto check = [&](const char* when) {
    proto::GetJobStateResponse state = State(created.job_id());
    ASSERT_EQ(state.consumers_size(), 2) << when;
    for (int j = 0; j < 2; ++j) {
      ASSERT_EQ(state.consumers(j).splits_size(), static_cast<int>(want[j].size())) << when;
      for (int p = 0; p < state.consumers(j).splits_size(); ++p) {
        const proto::SplitState& s = state.consumers(j).splits(p);
        record::SlotPieces pieces;
        for (const proto::SplitPiece& piece : s.pieces())
          pieces.push_back({piece.split_id(), piece.offset(), piece.count()});
        EXPECT_EQ(pieces, want[j][p].pieces) << when << " consumer " << j << " slot " << p;
        EXPECT_EQ(s.first_batch(), want[j][p].first) << when << " " << j << " " << p;
        EXPECT_EQ(s.end_batch(), want[j][p].end) << when << " " << j << " " << p;
      }
    }
  };
  check("created");
  Restart(journal_);
  check("after a restart");
  // The second consumer presents the same states (another order): the same job.
  std::swap(*request.mutable_resize_from(0), *request.mutable_resize_from(2));
  const proto::GetOrCreateJobResponse attached = Job(request);
  EXPECT_FALSE(attached.created());
  EXPECT_EQ(attached.job_id(), created.job_id());
  EXPECT_EQ(attached.resized().digest(), created.resized().digest());
  // Another set: consumer 2 had returned a batch.
  *request.mutable_resize_from(0) = State3(2, {{0, 1, false}});
  *request.mutable_resize_from(2) = State3(1, {{0, 1, false}});
  proto::GetOrCreateJobResponse response;
  absl::Status s = Sync(impl_).GetOrCreateJob(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("old consumer 2's state returned 1 batches of epoch 0 here, 0 in the "
                        "states the job was resumed from"));
  // One state twice: refused, naming it.
  *request.mutable_resize_from(0) = State3(1, {});
  s = Sync(impl_).GetOrCreateJob(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("state of consumer 1 is given twice"));

  // The 2 new consumers save in the resumed epoch (their states carry its layout; the job is
  // still there) and 3 continue: new 0 returned its slot 0 (2 batches), new 1 nothing. Left:
  // old c1p0 [1, e) and c1p1 (3 batches) of new 0, c2p0 and c2p1 (4) of new 1: 3 + 2 + 2.
  proto::GetOrCreateJobRequest again =
      JobRequest("r", ds, /*consumers=*/3, proto::REMAINDER_MODE_PAD, /*split_size=*/10);
  for (uint32_t k = 0; k < 2; ++k) {
    proto::ConsumerCheckpoint c = State3(k, {});
    c.set_num_consumers(2);
    *c.mutable_resized() = created.resized();
    if (k == 0) {
      proto::ClientSplitProgress* p = c.add_splits();
      p->set_delivered_batches(2);
      p->set_complete(true);
    }
    *again.add_resize_from() = c;
  }
  const proto::GetOrCreateJobResponse third = Job(again);
  ASSERT_TRUE(third.created());
  EXPECT_NE(third.job_id(), created.job_id());
  proto::GetJobStateResponse state = State(third.job_id());
  ASSERT_EQ(state.consumers_size(), 3);
  const std::vector<std::vector<Want>> want3 = {
      {{old(1, 0), 1, 0}, {old(1, 1), 0, 0}}, {{old(2, 0), 0, 0}}, {{old(2, 1), 0, 0}}};
  for (int j = 0; j < 3; ++j) {
    ASSERT_EQ(state.consumers(j).splits_size(), static_cast<int>(want3[j].size())) << j;
    for (int p = 0; p < state.consumers(j).splits_size(); ++p) {
      const proto::SplitState& st = state.consumers(j).splits(p);
      record::SlotPieces pieces;
      for (const proto::SplitPiece& piece : st.pieces())
        pieces.push_back({piece.split_id(), piece.offset(), piece.count()});
      EXPECT_EQ(pieces, want3[j][p].pieces) << j << " " << p;
      EXPECT_EQ(st.first_batch(), want3[j][p].first) << j << " " << p;
      EXPECT_EQ(st.end_batch(), want3[j][p].end) << j << " " << p;
    }
  }
}

// ---- Shared production (docs/sharing.md) ----

proto::GetOrCreateJobRequest Sharing(proto::GetOrCreateJobRequest request) {
  request.mutable_config()->set_sharing(proto::SHARING_MODE_AUTO);
  return request;
}

std::vector<std::string> Starts(const proto::WorkerHeartbeatResponse& r,
                                const std::map<uint64_t, std::string>& names) {
  std::vector<std::string> out;
  for (const proto::SplitAssignment& a : r.start()) {
    out.push_back(absl::StrCat(names.at(a.key().job_id()), a.key().position(),
                               a.share_group() != 0 ? "*" : ""));
  }
  return out;
}

std::vector<Produced> Producing(const proto::WorkerHeartbeatResponse& r, bool finished) {
  std::vector<Produced> out;
  for (const proto::SplitAssignment& a : r.start()) {
    out.push_back({.key = SlotKey::FromProto(a.key()), .finished = finished});
  }
  return out;
}

TEST_F(DispatcherImplTest, SharingJobsGetTheSameSlotTogetherCountedOnce) {
  const uint64_t ds = Dataset({64}, 8);
  const uint64_t a = Job(Sharing(JobRequest("a", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  const uint64_t b = Job(Sharing(JobRequest("b", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  const uint64_t c = Job(Sharing(JobRequest("c", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  // Not sharing, and sharing with another seed: their own production.
  const uint64_t d = Job(JobRequest("d", ds, 1, proto::REMAINDER_MODE_PAD, 16)).job_id();
  proto::GetOrCreateJobRequest other_seed =
      Sharing(JobRequest("e", ds, 1, proto::REMAINDER_MODE_PAD, 16));
  other_seed.mutable_config()->set_seed(8);
  const uint64_t e = Job(other_seed).job_id();
  const std::map<uint64_t, std::string> names = {{a, "a"}, {b, "b"}, {c, "c"}, {d, "d"}, {e, "e"}};

  const uint64_t w = Worker("w:1", /*capacity=*/2);
  auto first = WorkerBeat(w);
  ASSERT_TRUE(first.ok()) << first.status();
  // a's slot 0 takes b's and c's along: one production, one of the two.
  EXPECT_THAT(Starts(*first, names), ElementsAre("a0*", "b0*", "c0*", "d0"));
  ASSERT_EQ(first->start_size(), 4);
  const uint64_t group = first->start(0).share_group();
  EXPECT_EQ(first->start(1).share_group(), group);
  EXPECT_EQ(first->start(2).share_group(), group);
  // Still two productions: nothing more.
  auto second = WorkerBeat(w, Producing(*first, /*finished=*/false));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->start_size(), 0);
  // The group's slot is produced: its next slot, again together.
  std::vector<Produced> held = Producing(*first, /*finished=*/true);
  held.back().finished = false;  // d's slot 0 still in production
  auto third = WorkerBeat(w, held);
  ASSERT_TRUE(third.ok());
  EXPECT_THAT(Starts(*third, names), ElementsAre("a1*", "b1*", "c1*"));

  proto::GetStatusRequest request;
  request.set_protocol_version(kProtocolVersion);
  proto::GetStatusResponse status;
  ASSERT_TRUE(Sync(impl_).GetStatus(request, &status).ok());
  std::map<std::string, std::vector<uint64_t>> shares;
  std::map<std::string, uint64_t> groups;
  for (const proto::JobStatus& j : status.jobs()) {
    shares[j.job_name()] = {j.shares_with().begin(), j.shares_with().end()};
    groups[j.job_name()] = j.share_group();
  }
  EXPECT_THAT(shares["a"], ElementsAre(b, c));
  EXPECT_THAT(shares["b"], ElementsAre(a, c));
  EXPECT_EQ(groups["a"], group);
  EXPECT_EQ(groups["d"], 0u);
  EXPECT_NE(groups["e"], 0u);
  EXPECT_NE(groups["e"], group);
  EXPECT_THAT(shares["e"], IsEmpty());
}

TEST_F(DispatcherImplTest, ALateSharingJobStartsWhereTheGroupIsAndWrapsAround) {
  const uint64_t ds = Dataset({64}, 8);
  const uint64_t a = Job(Sharing(JobRequest("a", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  const uint64_t w = Worker("w:1", /*capacity=*/2);
  auto first = WorkerBeat(w);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->start_size(), 2);  // a0, a1
  const uint64_t b = Job(Sharing(JobRequest("b", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  const std::map<uint64_t, std::string> names = {{a, "a"}, {b, "b"}};
  auto second = WorkerBeat(w, Producing(*first, /*finished=*/true));
  ASSERT_TRUE(second.ok());
  // b joins at the group's position 2 (not its own 0), then 3 with it.
  EXPECT_THAT(Starts(*second, names), ElementsAre("a2*", "b2*", "a3*", "b3*"));
  // a is through its epoch; b wraps around to the slots it passed, alone.
  std::vector<Produced> done = Producing(*first, true);
  for (const Produced& p : Producing(*second, true)) done.push_back(p);
  auto third = WorkerBeat(w, done);
  ASSERT_TRUE(third.ok());
  EXPECT_THAT(Starts(*third, names), ElementsAre("b0*", "b1*"));
}

TEST_F(DispatcherImplTest, AConsumerWhoseSlotWasDetachedWaitsAndHoldsNoCapacity) {
  const uint64_t ds = Dataset({64}, 8);
  const uint64_t a = Job(Sharing(JobRequest("a", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  const uint64_t b = Job(Sharing(JobRequest("b", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  const std::map<uint64_t, std::string> names = {{a, "a"}, {b, "b"}};
  const uint64_t w = Worker("w:1", /*capacity=*/1);
  auto first = WorkerBeat(w);
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(Starts(*first, names), ElementsAre("a0*", "b0*"));
  // b's trainer stopped reading: the worker detached its slot 0, which waits for it.
  std::vector<Produced> held = Producing(*first, /*finished=*/true);
  held[1] = {.key = held[1].key, .batches = 2, .detached = true};
  auto second = WorkerBeat(w, held);
  ASSERT_TRUE(second.ok());
  // a goes on alone; b's waiting slot takes none of the worker's one production.
  EXPECT_THAT(Starts(*second, names), ElementsAre("a1*"));
  // b reads again: its slot is produced (one production), a's slot 1 too: no room.
  held[1].detached = false;
  held.push_back({.key = SlotKey::FromProto(second->start(0).key())});
  auto third = WorkerBeat(w, held);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->start_size(), 0);
}

TEST_F(DispatcherImplTest, APausedConsumerHoldsNoCapacityGetsNoSlotAndShowsPaused) {
  // Jobs that do not share: a's trainer stopped reading and its worker paused slot a0
  // (--pause-unread-after), reporting it detached.
  const uint64_t ds = Dataset({64}, 8);
  const uint64_t a = Job(JobRequest("a", ds, 1, proto::REMAINDER_MODE_PAD, 16)).job_id();
  const uint64_t b = Job(JobRequest("b", ds, 1, proto::REMAINDER_MODE_PAD, 16)).job_id();
  const std::map<uint64_t, std::string> names = {{a, "a"}, {b, "b"}};
  const uint64_t w = Worker("w:1", /*capacity=*/2);
  auto first = WorkerBeat(w);
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(Starts(*first, names), ElementsAre("a0", "b0"));
  std::vector<Produced> held = Producing(*first, /*finished=*/false);
  held[0] = {.key = held[0].key, .batches = 2, .detached = true};
  auto second = WorkerBeat(w, held);
  ASSERT_TRUE(second.ok());
  // a0 takes none of the two productions; the free one goes to b, not to a's next slot (which
  // would only fill the same unread queue).
  EXPECT_THAT(Starts(*second, names), ElementsAre("b1"));
  proto::GetStatusRequest request;
  request.set_protocol_version(kProtocolVersion);
  proto::GetStatusResponse status;
  ASSERT_TRUE(Sync(impl_).GetStatus(request, &status).ok());
  std::map<std::string, bool> paused;
  for (const proto::JobStatus& j : status.jobs()) {
    ASSERT_EQ(j.consumers_size(), 1);
    paused[j.job_name()] = j.consumers(0).paused();
  }
  EXPECT_EQ(paused, (std::map<std::string, bool>{{"a", true}, {"b", false}}));
  // a reads again: a0 resumed and finishes, b0 is done producing: a gets its next slot.
  held[0] = {.key = held[0].key, .batches = 8, .finished = true};
  held[1].finished = true;
  held.push_back({.key = SlotKey::FromProto(second->start(0).key())});
  auto third = WorkerBeat(w, held);
  ASSERT_TRUE(third.ok());
  EXPECT_THAT(Starts(*third, names), ElementsAre("a1"));
}

TEST_F(DispatcherImplTest, APausedConsumerStillGetsASlotBeforeTheOneThatWaits) {
  // A deterministic trainer releases slot 1's batches only after slot 0's: slot 1 paused on w2
  // (its queue full, unread) while slot 0, handed back by the lost w1, is pending again. Slot 0
  // must go out (or the trainer waits forever); slot 2 must not.
  const uint64_t ds = Dataset({64}, 8);
  const uint64_t a = Job(JobRequest("a", ds, 1, proto::REMAINDER_MODE_PAD, 16)).job_id();
  const std::map<uint64_t, std::string> names = {{a, "a"}};
  const uint64_t w1 = Worker("w:1", /*capacity=*/1);
  const uint64_t w2 = Worker("w:2", /*capacity=*/1);
  auto first = WorkerBeat(w1);
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(Starts(*first, names), ElementsAre("a0"));
  auto second = WorkerBeat(w2);
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(Starts(*second, names), ElementsAre("a1"));
  proto::WorkerUnregisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_worker_id(w1);
  proto::WorkerUnregisterResponse response;
  ASSERT_TRUE(Sync(impl_).WorkerUnregister(request, &response).ok());
  ClientBeat(a, 0, {{.epoch = 0, .position = 0, .batches = 0}});  // slot 0: pending again
  const Produced paused{
      .key = SlotKey::FromProto(second->start(0).key()), .batches = 2, .detached = true};
  auto third = WorkerBeat(w2, {paused});
  ASSERT_TRUE(third.ok());
  EXPECT_THAT(Starts(*third, names), ElementsAre("a0"));
  // Slot 0 producing, slot 1 still waiting: nothing more for w2, and slot 2 for nobody.
  const uint64_t w3 = Worker("w:3", /*capacity=*/1);
  auto fourth = WorkerBeat(w3);
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(fourth->start_size(), 0);
}

TEST_F(DispatcherImplTest, ProductionGroupsSurviveARestart) {
  const uint64_t ds = Dataset({64}, 8);
  const uint64_t a = Job(Sharing(JobRequest("a", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  const uint64_t b = Job(Sharing(JobRequest("b", ds, 1, proto::REMAINDER_MODE_PAD, 16))).job_id();
  const uint64_t w = Worker("w:1", /*capacity=*/1);
  auto first = WorkerBeat(w);
  ASSERT_TRUE(first.ok());
  const std::map<uint64_t, std::string> names = {{a, "a"}, {b, "b"}};
  EXPECT_THAT(Starts(*first, names), ElementsAre("a0*", "b0*"));
  Restart(journal_);  // the groups come from the journaled job configs
  auto second = WorkerBeat(w, Producing(*first, /*finished=*/true));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(Starts(*second, names), ElementsAre("a1*", "b1*"));
  EXPECT_EQ(second->start(0).share_group(), first->start(0).share_group());
}

TEST_F(DispatcherImplTest, SharingIsRefusedForParallelEpochs) {
  const uint64_t ds = Dataset({64}, 8);
  proto::GetOrCreateJobRequest request =
      Sharing(JobRequest("p", ds, 1, proto::REMAINDER_MODE_PAD, 16));
  request.mutable_config()->set_mode(proto::PROCESSING_MODE_PARALLEL_EPOCHS);
  proto::GetOrCreateJobResponse response;
  absl::Status s = Sync(impl_).GetOrCreateJob(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("sharing auto needs processing mode DISTRIBUTED_EPOCH"));
}

}  // namespace
}  // namespace sluice::dispatcher
