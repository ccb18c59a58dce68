#include "dispatcher/autoscaler.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::dispatcher {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

constexpr absl::Duration kPeriod = absl::Seconds(2);

// One job (id 1, batch 64) whose consumer wants 512 elements/s (8 batches/s),
// served by workers that each produce 100 elements per busy second: need 5.12
// workers, 6 with 5% headroom. Each test changes one thing.
class AutoscalerTest : public ::testing::Test {
 protected:
  AutoscalerTest() : clock_(absl::FromUnixSeconds(1000)) {}

  WorkerSample Worker(uint64_t id, double capacity, uint64_t job_id = kAllJobs) {
    WorkerSample w;
    w.worker_id = id;
    w.registered = absl::FromUnixSeconds(0);
    w.last_heartbeat = clock_.Now();
    if (capacity > 0) w.capacity.push_back({job_id, capacity});
    w.queue_capacity = 8;
    return w;
  }

  // A consumer that wants `demand` batches/s and gets `served` of them.
  static ConsumerSample Consumer(uint64_t job, uint32_t index, double demand, double served) {
    ConsumerSample c;
    c.job_id = job;
    c.consumer_index = index;
    c.batches_per_second = std::min(demand, served);
    c.wait_fraction = 1.0 - c.batches_per_second / demand;
    return c;
  }

  AutoscalerInput Input(int workers, double capacity, double demand, double served) {
    AutoscalerInput in;
    in.now = clock_.Now();
    for (int i = 0; i < workers; ++i) {
      in.workers.push_back(Worker(static_cast<uint64_t>(i + 1), capacity));
    }
    in.consumers.push_back(Consumer(1, 0, demand, served));
    in.jobs.push_back({.job_id = 1, .batch_size = 64});
    return in;
  }

  // 16 workers around 100 elements per busy second and 4 trainers each waiting
  // 25% for 6 batches/s of 64 (demand 4 × 512 = 2048 el/s): need 20.48. The
  // headroom is 1 + 2 × need's relative standard error, within [1.01, 1.05].
  AutoscalerInput ManySamples(double low, double high, int workers = 16, double served = 6) {
    AutoscalerInput in;
    for (int i = 0; i < workers; ++i) {
      in.workers.push_back(Worker(static_cast<uint64_t>(i + 1), i % 2 == 0 ? low : high));
    }
    for (uint32_t c = 0; c < 4; ++c) {
      in.consumers.push_back(Consumer(1, c, 8, served));
    }
    in.jobs.push_back({.job_id = 1, .batch_size = 64});
    return in;
  }

  // `workers` registered workers at 97 and 103 elements per busy second
  // (noise 0.0131 with 22), 4 consumers returning `served` batches of 64 a
  // second without waiting (need = served x 2.56), a period after the
  // previous call.
  AutoscalerDecision DecideWithSpread(Autoscaler& scaler, double served, int workers = 22) {
    AutoscalerInput in = ManySamples(97, 103, workers);
    for (ConsumerSample& c : in.consumers) {
      c.batches_per_second = served;
      c.wait_fraction = 0;
    }
    in.now = absl::FromUnixSeconds(1000 + 2 * period_++);
    for (WorkerSample& w : in.workers) w.last_heartbeat = in.now;
    return scaler.Decide(in);
  }

  // The steady state: 6 workers serving the 512 elements/s.
  AutoscalerInput Steady() { return Input(6, 100, 8, 8); }

  AutoscalerDecision Next(const AutoscalerInput& in) {
    AutoscalerInput copy = in;
    copy.now = clock_.Now();
    for (WorkerSample& w : copy.workers) {
      if (w.last_heartbeat != absl::InfinitePast() &&
          w.last_heartbeat > absl::FromUnixSeconds(500)) {
        w.last_heartbeat = clock_.Now();
      }
    }
    AutoscalerDecision d = scaler_.Decide(copy);
    clock_.Advance(kPeriod);
    return d;
  }

  FakeClock clock_;
  // A restarted dispatcher's: no scale-down in the first window but for demand that left (the
  // tests below count periods from there; AFreshDispatcher... tests the other kind).
  Autoscaler scaler_{AutoscalerOptions{.min_workers = 1, .max_workers = 64, .restarted = true}};
  int period_ = 0;  // DecideWithSpread's clock, in periods of 2 s
};

TEST_F(AutoscalerTest, SteadyStateHolds) {
  AutoscalerDecision d = Next(Steady());
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_EQ(d.current_workers, 6);
  EXPECT_DOUBLE_EQ(d.need, 5.12);
  EXPECT_EQ(d.reason,
            "hold 6: need 5.12 workers (job 1: 512 el/s / 100 el/s per "
            "worker) x 1.05 headroom = 6");
  EXPECT_THAT(d.drain, IsEmpty());
  ASSERT_EQ(d.jobs.size(), 1u);
  EXPECT_EQ(d.jobs[0].consumers, 1);
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 512);
  EXPECT_DOUBLE_EQ(d.jobs[0].capacity, 100);
}

TEST_F(AutoscalerTest, WorkedExampleFromTheHeader) {
  AutoscalerInput in = Input(3, 128, 8, 4);
  in.consumers.push_back(Consumer(1, 1, 8, 4));
  WorkerSample warming = Worker(4, 40);
  warming.registered = clock_.Now() - absl::Seconds(1);
  in.workers.push_back(warming);
  in.workers.push_back(Worker(5, 20));
  AutoscalerDecision d = Next(in);
  // 5 current; 1024 el/s over 128 el/s = 8 workers, x 1.05 = 9.
  EXPECT_EQ(d.desired_workers, 9);
  EXPECT_DOUBLE_EQ(d.need, 8.0);
  EXPECT_THAT(d.reason, StartsWith("up 5 -> 9: need 8.00 workers (job 1: 1024 "
                                   "el/s / 128 el/s per worker)"));
  EXPECT_THAT(d.reason, HasSubstr("slow outlier counted as the median: worker 5"));
  EXPECT_THAT(d.reason, HasSubstr("1 warming up"));
  EXPECT_THAT(d.replace, ElementsAre(5));
}

TEST_F(AutoscalerTest, DemandDoublesScalesUpInOneStep) {
  Next(Steady());
  // The trainer now wants 16 batches/s; 6 workers serve 600 el/s = 9.375.
  AutoscalerDecision d = Next(Input(6, 100, 16, 9.375));
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 1024);
  EXPECT_EQ(d.desired_workers, 11);  // ceil(10.24 x 1.05)
  EXPECT_THAT(d.reason, StartsWith("up 6 -> 11:"));
  // Once the new workers run, the count stays.
  d = Next(Input(11, 100, 16, 16));
  EXPECT_EQ(d.desired_workers, 11);
  EXPECT_THAT(d.reason, StartsWith("hold 11:"));
}

TEST_F(AutoscalerTest, PipelineCostTriplesScalesUpInOneStep) {
  Next(Steady());
  const double capacity = 100.0 / 3;
  // 6 workers now serve 200 el/s = 3.125 batches/s.
  AutoscalerDecision d = Next(Input(6, capacity, 8, 6 * capacity / 64));
  EXPECT_NEAR(d.need, 15.36, 1e-9);
  EXPECT_EQ(d.desired_workers, 17);  // ceil(16.128)
  d = Next(Input(17, capacity, 8, 8));
  EXPECT_EQ(d.desired_workers, 17);
}

TEST_F(AutoscalerTest, LostWorkerIsReplaced) {
  Next(Steady());
  // 5 workers serve 500 of 512 el/s.
  AutoscalerDecision d = Next(Input(5, 100, 8, 500.0 / 64));
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_THAT(d.reason, StartsWith("up 5 -> 6:"));
}

// The need reads 5.75 right after a worker of the 6 was lost (noise: the 6
// held it, 5.75 <= 6): one replacement, not ceil(5.75 x 1.05) = 7.
TEST_F(AutoscalerTest, LostWorkerIsReplacedOneForOneWithinTheBand) {
  Next(Steady());
  AutoscalerDecision d = Next(Input(5, 100, 575.0 / 64, 500.0 / 64));
  EXPECT_DOUBLE_EQ(d.need, 5.75);
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_THAT(d.reason, StartsWith("up 5 -> 6: replace lost workers"));
  // Beyond the band (the need grew too: 6.5), the law rounds up as usual.
  d = Next(Input(5, 100, 650.0 / 64, 500.0 / 64));
  EXPECT_EQ(d.desired_workers, 7);
  EXPECT_THAT(d.reason, StartsWith("up 5 -> 7: need 6.50 workers"));
}

// A worker lost while the need sits inside the band of the count left (4.9
// workers of need on 5: no scale-up is due) is still replaced: the count was
// sized with the headroom, and holding 5 would give the headroom away for good
// (an HPA fed the desired count would cancel the Deployment's replacement pod).
TEST_F(AutoscalerTest, LostWorkerIsReplacedWhenTheNeedItWasSizedForStands) {
  Next(Steady());
  AutoscalerDecision d = Next(Input(6, 100, 490.0 / 64, 490.0 / 64));
  EXPECT_EQ(d.desired_workers, 6);  // the window's 5.12 x 1.05 still holds 6
  d = Next(Input(5, 100, 490.0 / 64, 490.0 / 64));
  EXPECT_DOUBLE_EQ(d.need, 4.9);
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_THAT(d.reason, StartsWith("up 5 -> 6: replace lost workers; need 4.90 workers"));
  // Then 5 are back: held.
  d = Next(Input(6, 100, 490.0 / 64, 490.0 / 64));
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_THAT(d.reason, StartsWith("hold 6"));
}

TEST_F(AutoscalerTest, SecondJobAddsItsNeed) {
  Next(Steady());
  // Job 2 (batch 32) arrives: its consumer wants 20 batches/s = 640 el/s and
  // gets half. No worker measured job 2 yet: it is assumed to cost what job 1
  // costs.
  AutoscalerInput in = Input(6, 0, 8, 8);
  for (WorkerSample& w : in.workers) w.capacity = {{1, 100}};
  in.jobs.push_back({.job_id = 2, .batch_size = 32});
  in.consumers.push_back(Consumer(2, 0, 20, 10));
  AutoscalerDecision d = Next(in);
  EXPECT_DOUBLE_EQ(d.need, 5.12 + 6.4);
  EXPECT_EQ(d.desired_workers, 13);  // ceil(11.52 x 1.05)
  // Next period the workers measured job 2: 50 elements per busy second.
  in.workers.clear();
  for (uint64_t id = 1; id <= 13; ++id) {
    WorkerSample w = Worker(id, 100, 1);
    w.capacity.push_back({2, 50});
    in.workers.push_back(w);
  }
  in.consumers[1] = Consumer(2, 0, 20, 20);
  d = Next(in);
  EXPECT_DOUBLE_EQ(d.need, 5.12 + 12.8);
  EXPECT_EQ(d.desired_workers, 19);  // ceil(18.816)
  ASSERT_EQ(d.jobs.size(), 2u);
  EXPECT_DOUBLE_EQ(d.jobs[1].capacity, 50);
}

// Two jobs of different cost on the same 14 workers: job 1 (batch 64) wants
// 512 el/s at 100 el per busy second (5.12 workers), job 2 (batch 10) 200 el/s
// at 25 (a pipeline 4x costlier: 8 workers). Σ need 13.12. Each job has one
// consumer (its demand's spread unreadable: the 2.5% the fixed headroom stands
// for) and workers that agree exactly; two independent errors partly cancel:
// headroom 1 + 2 × 2.5% × √(5.12² + 8²) / 13.12 = 1.036, 13.59 -> 14. Worker
// 14 has produced only job 1: it measures nothing for job 2.
TEST_F(AutoscalerTest, JobsOfDifferentCostSharingWorkersEachUseTheirOwnCapacity) {
  AutoscalerInput in = Input(13, 0, 8, 8);
  for (WorkerSample& w : in.workers) w.capacity = {{1, 100}, {2, 25}};
  in.workers.push_back(Worker(14, 100, 1));
  in.jobs.push_back({.job_id = 2, .batch_size = 10});
  in.consumers.push_back(Consumer(2, 0, 20, 20));
  AutoscalerDecision d = Next(in);
  EXPECT_DOUBLE_EQ(d.need, 5.12 + 8);
  EXPECT_EQ(d.desired_workers, 14);
  ASSERT_EQ(d.jobs.size(), 2u);
  EXPECT_DOUBLE_EQ(d.jobs[0].capacity, 100);
  EXPECT_DOUBLE_EQ(d.jobs[1].capacity, 25);
  EXPECT_EQ(d.reason,
            "hold 14: need 13.12 workers (job 1: 512 el/s / 100 el/s per "
            "worker; job 2: 200 el/s / 25 el/s per worker) x 1.04 headroom = "
            "14");
  EXPECT_NEAR(d.headroom, 1 + 0.05 * std::hypot(5.12, 8) / 13.12, 1e-12);
  // Job 2's trainer now wants twice as much and waits half the time: only
  // job 2's need doubles (16), Σ 21.12 x 1.0398 = 21.96 -> 22 in one step.
  in.consumers[1] = Consumer(2, 0, 40, 20);
  d = Next(in);
  EXPECT_DOUBLE_EQ(d.need, 5.12 + 16);
  EXPECT_NEAR(d.headroom, 1 + 0.05 * std::hypot(5.12, 16) / 21.12, 1e-12);
  EXPECT_EQ(d.desired_workers, 22);
  EXPECT_THAT(d.reason, StartsWith("up 14 -> 22:"));
}

TEST_F(AutoscalerTest, AllConsumersLeaveScalesToTheMinimumAtOnce) {
  Next(Steady());
  AutoscalerInput in = Steady();
  in.consumers.clear();
  // The worker holding the fewest splits goes first, then the fewest
  // undelivered batches, then the newest.
  const int splits[] = {3, 0, 2, 0, 1, 0};
  for (int i = 0; i < 6; ++i) in.workers[i].held_splits = splits[i];
  in.workers[1].undelivered_batches = 5;
  in.workers[3].registered = absl::FromUnixSeconds(10);
  AutoscalerDecision d = Next(in);
  EXPECT_EQ(d.desired_workers, 1);
  EXPECT_EQ(d.reason, "down 6 -> 1: no live consumer");
  EXPECT_THAT(d.drain, ElementsAre(4, 6, 2, 5, 3));
}

// A restarted dispatcher recovers a job whose trainers have not reported
// yet (they reconnect within their lease): its demand is unknown, not gone, so
// nothing is drained before the window; once they reported, their leaving is
// demand that left, and scales down at once.
TEST_F(AutoscalerTest, ARestartedDispatcherDoesNotTakeTrainersNotYetHeardFromForGone) {
  AutoscalerInput in = Steady();
  in.consumers.clear();
  AutoscalerDecision d = Next(in);
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_EQ(d.reason,
            "hold 6: need 0.00 workers (no consumer) x 1.05 headroom = 0; no scale-down before "
            "30s of measurements (no report yet from the trainers of job 1)");
  EXPECT_THAT(d.drain, IsEmpty());
  EXPECT_EQ(Next(Steady()).desired_workers, 6);  // they reported
  d = Next(in);                                  // and left
  EXPECT_EQ(d.desired_workers, 1);
  EXPECT_EQ(d.reason, "down 6 -> 1: no live consumer");
  // A fresh dispatcher has no such past: no consumer is no demand.
  Autoscaler fresh(AutoscalerOptions{.min_workers = 1, .max_workers = 64});
  in.now = clock_.Now();
  EXPECT_EQ(fresh.Decide(in).desired_workers, 1);
}

// The pool is bound only when the jobs' need exceeds max_workers: a first
// step capped at x4, or a count the hold band keeps a little below the need,
// divides nothing (the next decisions give every job its need), and a
// reservation that max_workers cannot hold is measured against max_workers.
TEST_F(AutoscalerTest, ThePoolIsBoundByMaxWorkersNotByAStepOnTheWay) {
  Autoscaler bounded(AutoscalerOptions{.min_workers = 1, .max_workers = 8});
  AutoscalerInput in = Input(1, 100, 8, 1);  // need 5.12 on 1 worker
  in.now = clock_.Now();
  AutoscalerDecision d = bounded.Decide(in);
  EXPECT_EQ(d.desired_workers, 4);
  EXPECT_THAT(d.reason, HasSubstr("capped at x4"));
  EXPECT_FALSE(d.pool_bound);
  ASSERT_EQ(d.jobs.size(), 1u);
  EXPECT_DOUBLE_EQ(d.jobs[0].allocated, 5.12 * 1.05);
  EXPECT_THAT(d.jobs[0].allocation_reason, Not(HasSubstr("the pool ran out")));
  // A reservation of 1000 on a pool of at most 8.
  in = Input(2, 100, 1, 1);  // need 0.64
  in.jobs[0].min_workers = 1000;
  in.now = clock_.Now() + kPeriod;
  d = bounded.Decide(in);
  EXPECT_FALSE(d.pool_bound);
  ASSERT_EQ(d.jobs.size(), 1u);
  EXPECT_THAT(d.jobs[0].allocation_reason,
              HasSubstr("min_workers 1000 not reserved: the jobs reserve 1000 of a pool of at "
                        "most 8.00"));
}

TEST_F(AutoscalerTest, MeasuredDemandDropScalesDownAfterTheWindowOneStep) {
  Next(Steady());
  // The trainer slows to 2 batches/s: need 1.28, target 2. Held for the
  // 30 s window (15 periods).
  AutoscalerInput low = Input(6, 100, 2, 2);
  int periods = 0;
  AutoscalerDecision d;
  do {
    d = Next(low);
    ++periods;
    ASSERT_LE(periods, 20);
  } while (d.desired_workers == 6);
  EXPECT_EQ(periods, 15);
  EXPECT_EQ(d.desired_workers, 2);
  EXPECT_THAT(d.reason, StartsWith("down 6 -> 2: largest need over the last "
                                   "30s 1.28 workers x 1.05"));
  EXPECT_THAT(d.drain.size(), 4u);
}

// Past the first window (a restarted dispatcher does not scale down before
// it), the steady state of 6 workers: 16 decisions, 32 s.
class AutoscalerAfterTheWindowTest : public AutoscalerTest {
 protected:
  void SetUp() override {
    for (int i = 0; i < 16; ++i) ASSERT_EQ(Next(Steady()).desired_workers, 6);
  }
};

// The pipeline got twice as cheap (200 el/s per worker): need 2.56, 3 with
// the headroom, at the next decision. The window holds the trainers' demand,
// which did not change; it is divided by the capacity measured now.
TEST_F(AutoscalerAfterTheWindowTest, CapacityRiseScalesDownAtTheNextDecision) {
  AutoscalerDecision d = Next(Input(6, 200, 8, 8));
  EXPECT_EQ(d.desired_workers, 3);
  EXPECT_EQ(d.reason,
            "down 6 -> 3: largest need over the last 30s 2.56 workers x 1.05 headroom; now need "
            "2.56 workers (job 1: 512 el/s / 200 el/s per worker) x 1.05 headroom");
  EXPECT_THAT(d.drain, ElementsAre(6, 5, 4));
}

// The shortfall rounding needs a measured spread. One consumer shows none: the
// 2.5% the fixed headroom stands for is a guess, and one worker's capacity read
// over a period moves by more (bench/autoscale.sh flapped 1 -> 2 -> 1 -> 2 at a
// need of 0.97-1.07 with it). So a need of 4.80 keeps ceil(4.80 x 1.05 = 5.04)
// = 6, where a spread of 2.5% would have allowed 5; a need of 4.50 goes to
// ceil(4.725) = 5. (Measured spreads: ScaleDownOnlyToACountThatKeepsItsNoiseMargin.)
TEST_F(AutoscalerAfterTheWindowTest, AScaleDownWithoutAMeasuredSpreadKeepsTheHeadroomsCeiling) {
  AutoscalerDecision d = Next(Input(6, 512 / 4.8, 8, 8));
  EXPECT_EQ(d.desired_workers, 6) << d.reason;
  d = Next(Input(6, 512 / 4.5, 8, 8));
  EXPECT_EQ(d.desired_workers, 5) << d.reason;
  EXPECT_THAT(d.reason, Not(HasSubstr("rather than")));
}

// Demand halves (4 batches/s: need 2.56): the first reading differs from the
// window, the second agrees with the first, so the drop is believed in the
// second decision instead of after the 30 s window.
TEST_F(AutoscalerAfterTheWindowTest, DemandDropThatTwoReadingsAgreeOnScalesDownAtTheSecond) {
  EXPECT_EQ(Next(Input(6, 100, 4, 4)).desired_workers, 6);
  AutoscalerDecision d = Next(Input(6, 100, 4.1, 4.1));
  EXPECT_EQ(d.desired_workers, 3);
  EXPECT_EQ(d.reason,
            "down 6 -> 3: demand of job 1 fell and two readings agree; need 2.62 workers (job 1: "
            "262 el/s / 100 el/s per worker) x 1.05 headroom");
}

// A drop of less than drop_tolerance (10%) is left to the window.
TEST_F(AutoscalerAfterTheWindowTest, SmallDemandDropWaitsForTheWindow) {
  // 7.4 batches/s: need 4.74 x 1.05 = 4.97 -> 5, 7.5% below 8: down once the
  // 30 s window (15 decisions) no longer holds a reading of 8.
  std::vector<int> counts;
  for (int i = 0; i < 16; ++i) counts.push_back(Next(Input(6, 100, 7.4, 7.4)).desired_workers);
  EXPECT_THAT(counts, ElementsAre(6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5, 5));
}

// The trainer's step slowed in the middle of a period: that period reads the
// mix of the two levels (6 batches/s, 25% below 8), the next one the new level
// (4 batches/s: need 2.56, 3 with the headroom), lower than the mix by more
// than drop_tolerance. Demand that fell in each of the last two readings is
// believed at the second: the whole new level, not the mix.
TEST_F(AutoscalerAfterTheWindowTest, DemandFallThatBeganInsideAPeriodScalesDownAtTheFirstWhole) {
  AutoscalerDecision mixed = Next(Input(6, 100, 6, 6));
  EXPECT_EQ(mixed.desired_workers, 6);
  EXPECT_EQ(mixed.reason,
            "hold 6: need 3.84 workers (job 1: 384 el/s / 100 el/s per worker) x 1.05 headroom = "
            "5 (5.12 x 1.05 seen in the last 30s)");
  AutoscalerDecision d = Next(Input(6, 100, 4, 4));
  EXPECT_EQ(d.desired_workers, 3);
  EXPECT_EQ(d.reason,
            "down 6 -> 3: demand of job 1 fell in each of the last two readings; need 2.56 workers "
            "(job 1: 256 el/s / 100 el/s per worker) x 1.05 headroom");
  EXPECT_THAT(d.drain, ElementsAre(6, 5, 4));
  // The new level holds.
  EXPECT_EQ(Next(Input(6 - 3, 100, 4.1, 4.1)).desired_workers, 3);
}

// A pause that begins in one period and ends in the next reads two falling
// partial rates (4, then 2 batches/s: the same as a fall), but each reading
// has an idle stretch (1.0 s, then 1.5 s without a batch or a wait) of more
// than pause_idle_steps (4) of the trainer's 0.125 s steps: they confirm
// nothing and the window holds the count. The same readings without the idle
// stretches are a fall, and scale down.
TEST_F(AutoscalerAfterTheWindowTest, APauseAcrossTwoPeriodsConfirmsNoFall) {
  auto reading = [&](double rate, double idle) {
    AutoscalerInput in = Steady();
    in.consumers[0].batches_per_second = rate;
    in.consumers[0].wait_fraction = 0;
    in.consumers[0].longest_idle_seconds = idle;
    return in;
  };
  EXPECT_EQ(Next(reading(4, 1.0)).desired_workers, 6);
  AutoscalerDecision d = Next(reading(2, 1.5));
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_EQ(d.reason,
            "hold 6: need 1.28 workers (job 1: 128 el/s / 100 el/s per worker) x 1.05 headroom = 2 "
            "(5.12 x 1.05 seen in the last 30s)");
  EXPECT_EQ(Next(reading(8, 0.125)).desired_workers, 6);

  Autoscaler fresh(AutoscalerOptions{.min_workers = 1, .max_workers = 64});
  scaler_ = fresh;
  for (int i = 0; i < 16; ++i) ASSERT_EQ(Next(Steady()).desired_workers, 6);
  EXPECT_EQ(Next(reading(4, 0.125)).desired_workers, 6);
  EXPECT_EQ(Next(reading(2, 0.125)).desired_workers, 2);
}

// A pause that begins and ends at the same point of two consecutive periods
// reads the same partial rate twice (4 batches/s), readings that agree on a
// drop of half; their idle stretches (1.0 s each) say it is a pause.
TEST_F(AutoscalerAfterTheWindowTest, APauseThatReadsTheSamePartialRateTwiceConfirmsNoDrop) {
  for (int i = 0; i < 2; ++i) {
    AutoscalerInput in = Steady();
    in.consumers[0].batches_per_second = 4;
    in.consumers[0].wait_fraction = 0;
    in.consumers[0].longest_idle_seconds = 1.0;
    AutoscalerDecision d = Next(in);
    ASSERT_EQ(d.desired_workers, 6) << "reading " << i << ": " << d.reason;
  }
}

// An idle stretch is a pause only beyond pause_idle_steps (4) of the trainer's
// step, the shorter one of this reading and the last: after 8 batches/s of 64
// (0.125 s), 0.5 s in the first reading after the steady state. A trainer
// whose step grew to 0.25 s (4 batches/s) shows 0.25 s stretches from then on.
// 0.45 s in the first reading: no pause, the fall is believed at the second;
// 0.55 s: a pause, so the first reading confirms nothing and the third does.
TEST_F(AutoscalerAfterTheWindowTest, IdleStretchesOfAFewStepsAreNoPause) {
  auto reading = [&](double idle) {
    AutoscalerInput in = Input(6, 100, 4, 4);
    in.consumers[0].longest_idle_seconds = idle;
    return in;
  };
  EXPECT_EQ(Next(reading(0.45)).desired_workers, 6);
  EXPECT_EQ(Next(reading(0.25)).desired_workers, 3);

  Autoscaler fresh(AutoscalerOptions{.min_workers = 1, .max_workers = 64});
  scaler_ = fresh;
  for (int i = 0; i < 16; ++i) ASSERT_EQ(Next(Steady()).desired_workers, 6);
  EXPECT_EQ(Next(reading(0.55)).desired_workers, 6);
  EXPECT_EQ(Next(reading(0.25)).desired_workers, 6);
  EXPECT_EQ(Next(reading(0.25)).desired_workers, 3);
}

// The step grows 5x (8 -> 1.6 batches/s) in the middle of a period: the mixed
// reading (4.8 batches/s) has 0.625 s stretches without a batch, more than 4 of
// the 0.125 s steps before it, so it reads as a pause and confirms nothing;
// the next two readings (limit: 4 of the mix's 0.208 s steps, then of the new
// 0.625 s ones) agree, and the fall is believed at the third, a period later
// than a smaller one.
TEST_F(AutoscalerAfterTheWindowTest, AStepFiveTimesLongerIsBelievedByTwoAgreeingReadings) {
  auto reading = [&](double rate) {
    AutoscalerInput in = Input(6, 100, rate, rate);
    in.consumers[0].longest_idle_seconds = 0.625;
    return in;
  };
  EXPECT_EQ(Next(reading(4.8)).desired_workers, 6);
  EXPECT_EQ(Next(reading(1.6)).desired_workers, 6);
  AutoscalerDecision d = Next(reading(1.6));
  EXPECT_EQ(d.desired_workers, 2);
  EXPECT_EQ(d.reason,
            "down 6 -> 2: demand of job 1 fell and two readings agree; need 1.02 workers (job 1: "
            "102 el/s / 100 el/s per worker) x 1.05 headroom");
}

// A trainer in a checkpoint: the period it starts in reads half its rate, then
// it neither receives nor waits for 10 s (readings that confirm nothing), then
// the period it ends in reads three quarters. No two readings agree on a lower
// level: the window holds the count.
TEST_F(AutoscalerAfterTheWindowTest, APausedTrainerKeepsItsWorkers) {
  std::vector<double> rates = {4, 0, 0, 0, 0, 0, 6, 8, 8};
  for (double rate : rates) {
    AutoscalerInput in = Steady();
    in.consumers[0].batches_per_second = rate;
    in.consumers[0].wait_fraction = 0;
    AutoscalerDecision d = Next(in);
    ASSERT_EQ(d.desired_workers, 6) << "rate " << rate << ": " << d.reason;
  }
}

// Two trainers of 4 batches/s (512 el/s, 6 workers); one stops asking for 10
// s (an evaluation on one rank) while the other goes on: the job reads 256
// el/s five times in a row, readings that agree on a drop of half, but a
// paused consumer's readings confirm no drop. The window holds the count.
TEST_F(AutoscalerTest, OneTrainerPausedConfirmsNoDrop) {
  auto input = [&](double second_rate) {
    AutoscalerInput in = Steady();
    in.consumers[0].batches_per_second = 4;
    ConsumerSample second = in.consumers[0];
    second.consumer_index = 1;
    second.batches_per_second = second_rate;
    in.consumers.push_back(second);
    return in;
  };
  for (int i = 0; i < 16; ++i) ASSERT_EQ(Next(input(4)).desired_workers, 6);
  for (int i = 0; i < 5; ++i) {
    AutoscalerDecision d = Next(input(0));
    ASSERT_EQ(d.desired_workers, 6) << "period " << i << ": " << d.reason;
  }
}

// A trainer that stays idle (neither receives nor waits) reads no demand, and
// its idle readings confirm no drop: the window holds the steady state's 512
// el/s for 30 s (15 decisions), then its workers go, down to min_workers.
TEST_F(AutoscalerAfterTheWindowTest, ATrainerIdleForLongerThanTheWindowGivesItsWorkersBack) {
  AutoscalerInput idle = Steady();
  idle.consumers[0].batches_per_second = 0;
  idle.consumers[0].wait_fraction = 0;
  std::vector<int> counts;
  for (int i = 0; i < 16; ++i) counts.push_back(Next(idle).desired_workers);
  EXPECT_THAT(counts, ElementsAre(6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 1, 1));
}

TEST_F(AutoscalerTest, AtMostOneScaleDownPerPeriod) {
  Next(Steady());
  AutoscalerInput none = Steady();
  none.consumers.clear();
  EXPECT_EQ(scaler_
                .Decide([&] {
                  none.now = clock_.Now();
                  return none;
                }())
                .desired_workers,
            1);
  // A second call within the period, with the actuator not done yet.
  clock_.Advance(absl::Seconds(1));
  none.now = clock_.Now();
  AutoscalerDecision d = scaler_.Decide(none);
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_THAT(d.reason, StartsWith("hold 6: scaled down less than a period"));
}

TEST_F(AutoscalerTest, ScaleUpIsCappedAtFourTimesPerCall) {
  // One worker; the trainer wants 20x what it gets.
  AutoscalerDecision d = Next(Input(1, 100, 32, 100.0 / 64));
  EXPECT_EQ(d.desired_workers, 4);
  EXPECT_THAT(d.reason, HasSubstr("= 22, capped at x4"));
  d = Next(Input(4, 100, 32, 400.0 / 64));
  EXPECT_EQ(d.desired_workers, 16);
  d = Next(Input(16, 100, 32, 1600.0 / 64));
  EXPECT_EQ(d.desired_workers, 22);
}

TEST_F(AutoscalerTest, MinAndMaxWorkers) {
  Autoscaler bounded(AutoscalerOptions{.min_workers = 2, .max_workers = 8});
  AutoscalerInput in = Input(6, 100, 16, 9.375);
  in.now = clock_.Now();
  AutoscalerDecision d = bounded.Decide(in);
  EXPECT_EQ(d.desired_workers, 8);
  EXPECT_THAT(d.reason, HasSubstr("limited to max_workers 8"));
  in.consumers.clear();
  in.now += kPeriod;
  d = bounded.Decide(in);
  EXPECT_EQ(d.desired_workers, 2);
  EXPECT_EQ(d.reason, "down 6 -> 2: no live consumer");
  EXPECT_EQ(d.drain.size(), 4u);
  // No worker at all, no consumer: start the minimum.
  in.workers.clear();
  in.now += kPeriod;
  d = bounded.Decide(in);
  EXPECT_EQ(d.desired_workers, 2);
  EXPECT_THAT(d.reason, HasSubstr("kept at min_workers 2"));
}

TEST_F(AutoscalerTest, WarmingWorkersAreNotMeasured) {
  Next(Steady());
  // Six more workers just registered; cold, they produce 30 el/s. Counting
  // them would halve the capacity and double the need.
  AutoscalerInput in = Input(12, 100, 8, 8);
  for (int i = 6; i < 12; ++i) {
    in.workers[i].registered = clock_.Now() - absl::Seconds(2);
    in.workers[i].capacity = {{kAllJobs, 30}};
  }
  AutoscalerDecision d = Next(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].capacity, 100);
  EXPECT_THAT(d.reason, HasSubstr("6 warming up"));
}

// A cluster that just started: its only worker is warming up but measured
// 100 el per busy second; the trainer wants 160 el/s (2.5 batches of 64) and
// gets 100. Nothing warm measured the job, so the warming worker's figure is
// used at once rather than after the warm-up: need 1.6, x 1.05 -> 2.
TEST_F(AutoscalerTest, WarmingWorkersAreMeasuredWhenNoWorkerIsWarm) {
  AutoscalerInput in = Input(1, 100, 2.5, 100.0 / 64);
  in.workers[0].registered = clock_.Now() - absl::Seconds(1);
  AutoscalerDecision d = Next(in);
  EXPECT_DOUBLE_EQ(d.need, 1.6);
  EXPECT_EQ(d.desired_workers, 2);
  EXPECT_THAT(d.reason, StartsWith("up 1 -> 2: need 1.60 workers"));
  EXPECT_THAT(d.reason, HasSubstr("1 job(s) measured on warming workers only"));
}

TEST_F(AutoscalerTest, NoCapacityYetHoldsAndStartsOne) {
  // The first worker registered 1 s ago; nothing was ever measured.
  AutoscalerInput in = Input(1, 0, 8, 1);
  in.workers[0].registered = clock_.Now() - absl::Seconds(1);
  AutoscalerDecision d = Next(in);
  EXPECT_EQ(d.desired_workers, 1);
  EXPECT_THAT(d.reason, StartsWith("capacity not measured yet (1 warming up, "
                                   "0 warm)"));
  // No worker at all and min_workers 0: a consumer gets one.
  Autoscaler from_zero(AutoscalerOptions{.min_workers = 0});
  in.workers.clear();
  in.now = clock_.Now();
  EXPECT_EQ(from_zero.Decide(in).desired_workers, 1);
}

TEST_F(AutoscalerTest, StalledWorkerIsNotMeasuredAndDrainedFirst) {
  AutoscalerInput in = Input(7, 100, 8, 8);
  for (WorkerSample& w : in.workers) w.held_splits = 2;
  in.workers[2].capacity = {{kAllJobs, 1}};  // its last report, long ago
  in.workers[2].last_heartbeat = clock_.Now() - absl::Seconds(9);
  in.now = clock_.Now();
  AutoscalerDecision d = scaler_.Decide(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].capacity, 100);
  EXPECT_THAT(d.replace, ElementsAre(3));
  // Need 5.12: 6 would do, but a first call never scales down.
  EXPECT_EQ(d.desired_workers, 7);
  EXPECT_THAT(d.reason, HasSubstr("no scale-down before 30s of measurements"));
  EXPECT_THAT(d.reason, HasSubstr("stalled (no heartbeat): worker 3"));
  // The consumers leave: the stalled worker is drained first.
  in.consumers.clear();
  in.now += kPeriod;
  d = scaler_.Decide(in);
  EXPECT_EQ(d.desired_workers, 1);
  EXPECT_THAT(d.drain, ElementsAre(3, 7, 6, 5, 4, 2));
}

TEST_F(AutoscalerTest, SlowOutlierCountsAsTheMedian) {
  AutoscalerInput in = Input(6, 100, 8, 8);
  in.workers[4].capacity = {{kAllJobs, 10}};   // throttled
  in.workers[1].capacity = {{kAllJobs, 400}};  // fast outlier: also clipped
  AutoscalerDecision d = Next(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].capacity, 100);
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_THAT(d.replace, ElementsAre(5));
}

TEST_F(AutoscalerTest, EpochStartKeepsTheLastDemand) {
  Next(Steady());
  // The epoch just started: pipelines refill and the trainer, which got 4
  // batches/s, waited 90% of the time. That reads as 40 batches/s = 2560
  // el/s; during the grace the estimate stays 512.
  AutoscalerInput in = Input(6, 100, 40, 4);
  in.consumers[0].epoch_started = clock_.Now() - absl::Seconds(1);
  AutoscalerDecision d = Next(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 512);
  EXPECT_EQ(d.desired_workers, 6);
  // After the grace the same measurement counts.
  in.consumers[0].epoch_started = clock_.Now() - absl::Seconds(6);
  d = Next(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 2560);
  EXPECT_EQ(d.desired_workers, 24);
}

TEST_F(AutoscalerTest, EpochsShorterThanTheGraceAreMeasuredInEveryWindow) {
  Next(Steady());
  // Epochs of 1.5 s: every window holds an epoch start. Were the grace kept,
  // the estimate would stay 512 for as long as the job runs.
  AutoscalerInput in = Input(6, 100, 40, 4);
  in.consumers[0].epoch_started = clock_.Now() - absl::Seconds(1);
  in.consumers[0].previous_epoch_seconds = 1.5;
  AutoscalerDecision d = Next(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 2560);
  EXPECT_EQ(d.desired_workers, 24);
  // An epoch of 6 s (longer than the grace) before this one: the grace holds.
  in.consumers[0].previous_epoch_seconds = 6;
  in.consumers[0].batches_per_second = 8;
  in.consumers[0].wait_fraction = 0.5;
  d = Next(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 2560);
}

TEST_F(AutoscalerTest, FullQueuesAndNoWaitVetoAScaleUp) {
  Next(Steady());
  // Workers report half their true capacity (a bad measurement), but nobody
  // waits and every queue is full.
  AutoscalerInput in = Input(6, 50, 8, 8);
  for (WorkerSample& w : in.workers) w.queue_depth = 8;
  AutoscalerDecision d = Next(in);
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_THAT(d.reason, HasSubstr("no trainer waits and every worker's output "
                                  "queue is full"));
  // One worker with room in its queue: believed.
  in.workers[0].queue_depth = 2;
  EXPECT_EQ(Next(in).desired_workers, 11);
}

TEST_F(AutoscalerTest, NoThrashOnNoise) {
  // +-5% noise on every measurement, 500 periods: the count never moves.
  Rng rng(7);
  for (int i = 0; i < 500; ++i) {
    AutoscalerInput in = Steady();
    for (WorkerSample& w : in.workers) {
      w.capacity[0].elements_per_busy_second = 100 * rng.Uniform(0.95, 1.05);
    }
    in.consumers[0].batches_per_second = 8 * rng.Uniform(0.95, 1.05);
    AutoscalerDecision d = Next(in);
    ASSERT_EQ(d.desired_workers, 6) << "period " << i << ": " << d.reason;
  }
}

TEST_F(AutoscalerTest, HeadroomFollowsTheMeasuredNoise) {
  {
    // Capacities 99/101: standard error 0.26% of the mean, 2 × that under
    // the floor.
    Autoscaler scaler({.max_workers = 64});
    AutoscalerInput in = ManySamples(99, 101);
    in.now = absl::FromUnixSeconds(1000);
    AutoscalerDecision d = scaler.Decide(in);
    EXPECT_DOUBLE_EQ(d.need, 20.48);
    EXPECT_DOUBLE_EQ(d.headroom, 1.01);
    EXPECT_EQ(d.desired_workers, 21);  // 20.68; 1.05 would give 22
    EXPECT_EQ(d.reason,
              "up 16 -> 21: need 20.48 workers (job 1: 2048 el/s / 100 el/s "
              "per worker) x 1.01 headroom = 21");
  }
  {
    // 96/104: sd 4.13, standard error 1.03% → headroom 1.0207 → 20.90.
    Autoscaler scaler({.max_workers = 64});
    AutoscalerInput in = ManySamples(96, 104);
    in.now = absl::FromUnixSeconds(1000);
    AutoscalerDecision d = scaler.Decide(in);
    EXPECT_NEAR(d.headroom, 1 + 2 * std::sqrt(16.0 * 16 / 15) / 100 / 4, 1e-12);
    EXPECT_EQ(d.desired_workers, 21);
  }
  {
    // 80/120: standard error 5.2%: capped at the fixed 1.05.
    Autoscaler scaler({.max_workers = 64});
    AutoscalerInput in = ManySamples(80, 120);
    in.now = absl::FromUnixSeconds(1000);
    AutoscalerDecision d = scaler.Decide(in);
    EXPECT_DOUBLE_EQ(d.headroom, 1.05);
    EXPECT_EQ(d.desired_workers, 22);  // 21.5
  }
  {
    // Two workers measured: no spread to read, the fixed headroom.
    Autoscaler scaler({.max_workers = 64});
    AutoscalerInput in = ManySamples(99, 101, /*workers=*/2);
    in.now = absl::FromUnixSeconds(1000);
    AutoscalerDecision d = scaler.Decide(in);
    EXPECT_DOUBLE_EQ(d.headroom, 1.05);
    EXPECT_EQ(d.desired_workers, 8);  // 2 × 4 cap; need 20.48 × 1.05 = 22
  }
  {
    // noise_z = 0: always the fixed headroom.
    Autoscaler scaler({.max_workers = 64, .noise_z = 0});
    AutoscalerInput in = ManySamples(99, 101);
    in.now = absl::FromUnixSeconds(1000);
    EXPECT_EQ(scaler.Decide(in).desired_workers, 22);
  }
}

// The consumers' spread is pooled over the jobs: job 2's single trainer
// borrows the spread job 1's four show (each ±2% from their mean: pooled
// relative variance 4 × 0.02² / 3 degrees of freedom), instead of the 2.5%
// assumed when no job shows a spread. The workers agree exactly: 0.
TEST_F(AutoscalerTest, AJobWithOneConsumerBorrowsTheOthersSpread) {
  Autoscaler scaler({.max_workers = 64});
  AutoscalerInput in;
  in.now = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 20; ++i) {
    WorkerSample w = Worker(static_cast<uint64_t>(i + 1), 0);
    w.capacity = {{1, 100}, {2, 100}};
    in.workers.push_back(w);
  }
  for (uint32_t c = 0; c < 4; ++c) {
    const double rate = c % 2 == 0 ? 8 * 1.02 : 8 * 0.98;
    in.consumers.push_back(Consumer(1, c, rate, rate));
  }
  in.consumers.push_back(Consumer(2, 0, 8, 8));
  in.jobs.push_back({.job_id = 1, .batch_size = 64});
  in.jobs.push_back({.job_id = 2, .batch_size = 64});
  AutoscalerDecision d = scaler.Decide(in);
  EXPECT_DOUBLE_EQ(d.need, 20.48 + 5.12);
  const double pooled = 4 * 0.02 * 0.02 / 3;
  const double variance = 20.48 * 20.48 * pooled / 4 + 5.12 * 5.12 * pooled / 1;
  EXPECT_NEAR(d.headroom, 1 + 2 * std::sqrt(variance) / 25.6, 1e-9);
  EXPECT_EQ(d.desired_workers, 27);  // 25.6 x 1.0207 = 26.13
}

// Trainers that genuinely differ (one of four at a quarter of the others'
// rate) are not noise to wait out: the band is at most the fixed headroom's
// 5%, so 12 workers for a need of 16.64 still scale up (a band of the raw
// spread, ±46%, would hold 12).
TEST_F(AutoscalerTest, TrainersThatDifferDoNotBlockAScaleUp) {
  Autoscaler scaler({.max_workers = 64});
  AutoscalerInput in = ManySamples(100, 100, /*workers=*/12, /*served=*/8);
  in.now = absl::FromUnixSeconds(1000);
  for (WorkerSample& w : in.workers) w.last_heartbeat = in.now;
  in.consumers[3] = Consumer(1, 3, 2, 2);
  AutoscalerDecision d = scaler.Decide(in);
  EXPECT_DOUBLE_EQ(d.need, 16.64);
  EXPECT_EQ(d.desired_workers, 18);  // 16.64 x 1.05 = 17.47
}

// With 21 workers (need 20.48 × 1.01 = 20.68) and ±5% noise on every
// measurement for 500 periods, the count never moves: a need that noise lifts
// past 21 is within the band (up only past 21 × (1 + the noise margin)), and a
// scale-down needs the new count to keep its own margin.
TEST_F(AutoscalerTest, NoThrashOnNoiseWithTheNoiseHeadroom) {
  Rng rng(11);
  Autoscaler scaler({.max_workers = 64});
  for (int i = 0; i < 500; ++i) {
    AutoscalerInput in = ManySamples(100, 100, /*workers=*/21, /*served=*/8);
    in.now = absl::FromUnixSeconds(1000 + 2 * i);
    for (WorkerSample& w : in.workers) {
      w.last_heartbeat = in.now;
      w.capacity[0].elements_per_busy_second = 100 * rng.Uniform(0.95, 1.05);
    }
    for (ConsumerSample& c : in.consumers) {
      c.batches_per_second = 8 * rng.Uniform(0.95, 1.05);
    }
    AutoscalerDecision d = scaler.Decide(in);
    ASSERT_EQ(d.desired_workers, 21) << "period " << i << ": " << d.reason;
  }
}

// The down band mirrors the up band: 22 workers, capacities 97/103 (noise
// 0.0131), need 20.8: 20.8 ÷ (1 - 0.0131) = 21.08 needs 22, so the count
// holds. A need of 20.48 (÷ (1 - 0.0131) = 20.75) is clear of 21: read to
// 0.66% (σ = 0.136 workers), 21 workers are short of it by 0.008% on average
// (at most 0.5%), so it goes down to 21 once the window no longer holds the
// larger need, though ceil(20.75 × 1.0131) would be 22.
TEST_F(AutoscalerTest, ScaleDownOnlyToACountThatKeepsItsNoiseMargin) {
  Autoscaler scaler({.max_workers = 64});
  auto decide = [&](double served) { return DecideWithSpread(scaler, served); };
  for (int i = 0; i < 20; ++i) {
    AutoscalerDecision d = decide(8.125);
    ASSERT_EQ(d.desired_workers, 22) << "period " << i << ": " << d.reason;
  }
  std::vector<int> counts;
  std::string first_down;
  for (int i = 0; i < 20; ++i) {
    AutoscalerDecision d = decide(8);
    if (first_down.empty() && d.desired_workers < 22) first_down = d.reason;
    counts.push_back(d.desired_workers);
  }
  EXPECT_THAT(first_down, EndsWith("; 21 rather than ceil(20.75 x 1.01) = 22: short by at most "
                                   "0.5% on average (20.75 = 20.48 / (1 - 0.013 noise))"));
  EXPECT_THAT(counts, ElementsAre(22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 21, 21,
                                  21, 21, 21, 21));
}

// A scale-up whose reading straddled the change (a step that began inside the
// period) stops short: the next reading finishes it without the noise margin
// that holds a steady count. 20 workers at 97/103, need 20.48 → up to 21;
// then 2120 el/s over 21 workers averaging 99.86: need 21.23, within 21's
// band (noise 0.0134: 21 × 1.0134 = 21.28), but read right after an up it
// goes on to ceil(21.23 × 1.0134) = 22. Once: at 22 workers (noise 0.0131),
// need 22.2 is within the band (22.29) and, the step having had its whole
// reading, holds. A count that was already steady at 21 holds on the 21.23.
TEST_F(AutoscalerTest, AScaleUpGoesOnAtTheNextReadingWithoutTheNoiseMargin) {
  Autoscaler scaler({.max_workers = 64});
  AutoscalerDecision d = DecideWithSpread(scaler, 20.48 / 2.56, /*workers=*/20);
  EXPECT_EQ(d.desired_workers, 21) << d.reason;
  d = DecideWithSpread(scaler, 21.2 / 2.56, /*workers=*/21);
  EXPECT_EQ(d.desired_workers, 22) << d.reason;
  EXPECT_THAT(d.reason, StartsWith("up 21 -> 22: need 21.23 workers"));
  d = DecideWithSpread(scaler, 22.2 / 2.56, /*workers=*/22);
  EXPECT_EQ(d.desired_workers, 22) << d.reason;
  EXPECT_THAT(d.reason, StartsWith("hold 22: need 22.20 workers"));

  Autoscaler steady({.max_workers = 64});
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(DecideWithSpread(steady, 20.48 / 2.56, /*workers=*/21).desired_workers, 21);
  }
  d = DecideWithSpread(steady, 21.2 / 2.56, /*workers=*/21);
  EXPECT_EQ(d.desired_workers, 21) << d.reason;
  EXPECT_THAT(d.reason, StartsWith("hold 21: need 21.23 workers"));
}

// The same after a scale-down: a fresh dispatcher with 22 workers at 97/103 reads need 20.48
// and goes down to 21 (ScaleDownOnlyToACountThatKeepsItsNoiseMargin); the next reading, need
// 21.23 on 21 workers, is within 21's band (21.28) but corrects the down: up to 22. A count
// steady at 21 holds on it (AScaleUpGoesOnAtTheNextReadingWithoutTheNoiseMargin).
TEST_F(AutoscalerTest, AScaleDownIsCorrectedAtTheNextReadingWithoutTheNoiseMargin) {
  Autoscaler scaler({.max_workers = 64});
  AutoscalerDecision d = DecideWithSpread(scaler, 20.48 / 2.56);
  ASSERT_EQ(d.desired_workers, 21) << d.reason;
  d = DecideWithSpread(scaler, 21.2 / 2.56, /*workers=*/21);
  EXPECT_EQ(d.desired_workers, 22) << d.reason;
  EXPECT_THAT(d.reason, StartsWith("up 21 -> 22: need 21.23 workers"));
}

// A fall that two readings confirm is scaled down to without the noise margin:
// 22 workers (noise 0.0131), need 20.8, then 16.9 twice (18.75% lower). With
// the margin, 16.9 ÷ (1 - 0.0131) = 17.12 would take 18; the readings are the
// new level, so 17, which are short of 16.9 (read to 0.66%) by 0.066% on
// average.
TEST_F(AutoscalerTest, AConfirmedFallIsScaledDownToWithoutTheNoiseMargin) {
  Autoscaler scaler({.max_workers = 64});
  auto decide = [&](double served) { return DecideWithSpread(scaler, served); };
  for (int i = 0; i < 5; ++i) ASSERT_EQ(decide(8.125).desired_workers, 22);
  EXPECT_EQ(decide(16.9 / 2.56).desired_workers, 22);  // one reading: not yet believed
  AutoscalerDecision d = decide(16.9 / 2.56);
  EXPECT_EQ(d.desired_workers, 17);
  EXPECT_THAT(d.reason, StartsWith("down 22 -> 17: demand of job 1 fell and two readings agree"));
}

// The same first decision as StalledWorkerIsNotMeasuredAndDrainedFirst (7 workers, need 5.12)
// on a fresh dispatcher: it has no unseen past, so it scales down at once.
TEST_F(AutoscalerTest, AFreshDispatcherScalesDownFromItsFirstDecisions) {
  Autoscaler fresh(AutoscalerOptions{.min_workers = 1, .max_workers = 64});
  AutoscalerInput in = Input(7, 100, 8, 8);
  in.now = clock_.Now();
  AutoscalerDecision d = fresh.Decide(in);
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_THAT(d.reason, StartsWith("down 7 -> 6: largest need over the last 30s 5.12 workers"));

  // Restarted, the same input holds 7 for the first window.
  Autoscaler restarted(AutoscalerOptions{.min_workers = 1, .max_workers = 64, .restarted = true});
  d = restarted.Decide(in);
  EXPECT_EQ(d.desired_workers, 7);
  EXPECT_THAT(d.reason, HasSubstr("no scale-down before 30s of measurements"));
}

TEST_F(AutoscalerTest, DrainingWorkersDoNotCount) {
  AutoscalerInput in = Input(8, 100, 8, 8);
  in.workers[6].draining = true;
  in.workers[7].draining = true;
  in.starting_workers = 1;
  AutoscalerDecision d = Next(in);
  EXPECT_EQ(d.current_workers, 7);
  EXPECT_EQ(d.desired_workers, 7);  // within the window: no scale-down yet
}

JobEstimate Job(uint64_t id, int consumers, double need, int priority = 0, int min_workers = 0) {
  JobEstimate j;
  j.job_id = id;
  j.consumers = consumers;
  j.need = need;
  j.priority = priority;
  j.min_workers = min_workers;
  return j;
}

TEST(AllocateWorkers, WorkedExampleFromTheHeader) {
  std::vector<JobEstimate> jobs = {Job(1, 2, 4), Job(2, 2, 8),
                                   Job(3, 1, 6, /*priority=*/0,
                                       /*min_workers=*/1)};
  AllocateWorkers(/*pool=*/10, /*headroom=*/1, jobs, /*bound=*/10);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 4);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 5);
  EXPECT_DOUBLE_EQ(jobs[2].allocated, 1);
  EXPECT_EQ(jobs[0].allocation_reason, "its need 4.00 x 1.00 headroom");
  EXPECT_EQ(jobs[1].allocation_reason,
            "5.00 of its need 8.00: the pool ran out (priority 0, 0.25 "
            "trainers' wait removed per worker)");
  EXPECT_EQ(jobs[2].allocation_reason,
            "min_workers 1 of its need 6.00: priority 0, 0.17 trainers' wait "
            "removed per worker");
}

// A reservation larger than the pool: before, job 1 (priority -5, min_workers 10) took all 3
// workers and job 2, of higher priority, got none, ever. Now the reservations (10) exceed the
// pool, so the largest is dropped and priority decides.
TEST(AllocateWorkers, AnOutsizedReservationIsDroppedAndVoidsOnlyItsOwn) {
  std::vector<JobEstimate> jobs = {Job(1, 4, 3.2, /*priority=*/-5, /*min_workers=*/10),
                                   Job(2, 4, 3.2)};
  AllocateWorkers(/*pool=*/3, /*headroom=*/1, jobs, /*bound=*/3);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 0);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 3);
  EXPECT_EQ(jobs[0].allocation_reason,
            "0.00 of its need 3.20: the pool ran out (priority -5, 1.25 trainers' wait removed per "
            "worker); min_workers 10 not reserved: the jobs reserve 10 of a pool of at most 3.00, "
            "and the "
            "largest reservations are dropped");
  EXPECT_EQ(jobs[1].allocation_reason,
            "3.00 of its need 3.20: the pool ran out (priority 0, 1.25 trainers' wait removed per "
            "worker)");

  // The others' reservations stay: job 2 keeps its 3 against job 3's higher priority.
  jobs = {Job(1, 4, 6, 0, /*min_workers=*/1000), Job(2, 2, 6, 0, /*min_workers=*/3),
          Job(3, 2, 6, /*priority=*/1)};
  AllocateWorkers(/*pool=*/8, /*headroom=*/1, jobs, /*bound=*/8);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 0);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 3);
  EXPECT_DOUBLE_EQ(jobs[2].allocated, 5);

  // A new job whose demand is unknown still gets its one worker to read it from.
  jobs = {Job(1, 4, 3.2, /*priority=*/-5, /*min_workers=*/10), Job(2, 4, 0)};
  jobs[1].starved = true;
  AllocateWorkers(/*pool=*/3, /*headroom=*/1, jobs, /*bound=*/3);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 2);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 1);
}

// Two reservations of 2 on a pool of 3: the lower priority's is dropped; priority 1 then gets
// its reservation and the last worker.
TEST(AllocateWorkers, ReservationsThatDoNotFitDropTheLowerPriorityFirst) {
  std::vector<JobEstimate> jobs = {Job(1, 1, 4, 0, 2), Job(2, 1, 4, 1, 2)};
  AllocateWorkers(/*pool=*/3, /*headroom=*/1, jobs, /*bound=*/3);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 0);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 3);
}

TEST(AllocateWorkers, JobsWhoseEndIsKnownGoFewestWorkerSecondsFirst) {
  // The header's example with job 2 60 s from its end and job 1 200 s:
  // 8 x 60 = 480 < 4 x 200 = 800 worker-seconds: job 2 gets its 8, job 1
  // the last 1.
  std::vector<JobEstimate> jobs = {Job(1, 2, 4), Job(2, 2, 8),
                                   Job(3, 1, 6, /*priority=*/0,
                                       /*min_workers=*/1)};
  jobs[0].remaining_seconds = 200;
  jobs[1].remaining_seconds = 60;
  AllocateWorkers(/*pool=*/10, /*headroom=*/1, jobs, /*bound=*/10);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 1);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 8);
  EXPECT_DOUBLE_EQ(jobs[2].allocated, 1);
}

TEST(AutoscalerAllocation, RemainingElementsGiveTheSecondsToTheEnd) {
  Autoscaler scaler(AutoscalerOptions{.noise_z = 0});
  AutoscalerInput in;
  in.now = absl::FromUnixSeconds(1000);
  in.jobs = {{.job_id = 1, .batch_size = 64, .remaining_elements = 51200}};
  in.consumers = {{.job_id = 1, .batches_per_second = 4, .wait_fraction = 0.5}};
  AutoscalerDecision d = scaler.Decide(in);
  ASSERT_EQ(d.jobs.size(), 1u);
  // demand 4 / 0.5 x 64 = 512 el/s: 51200 elements are 100 s.
  EXPECT_DOUBLE_EQ(d.jobs[0].remaining_seconds, 100);
}

TEST(AllocateWorkers, AStarvedJobGetsOneWorkerToReadItsDemand) {
  std::vector<JobEstimate> jobs = {Job(1, 2, 8), Job(2, 1, 0)};
  jobs[1].starved = true;
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, jobs, /*bound=*/6);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 5);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 1);
  EXPECT_EQ(jobs[1].allocation_reason, "1.00 to read its demand: its trainers got nothing yet");
}

// Reading a new job's demand comes first, whatever its priority (docs/autoscaling.md, step 2):
// on a pool of 1 a new priority-0 job takes the worker of a priority-5 job that needs it, and
// gives it back once its demand is read.
TEST(AllocateWorkers, ANewJobIsReadEvenBesideAHigherPriorityAndThenGivesItsWorkerBack) {
  std::vector<JobEstimate> jobs = {Job(1, 1, 1, /*priority=*/5), Job(2, 1, 0)};
  jobs[1].starved = true;
  AllocateWorkers(/*pool=*/1, /*headroom=*/1, jobs, /*bound=*/1);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 0);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 1);
  jobs[1].starved = false;
  jobs[1].need = 2;
  AllocateWorkers(/*pool=*/1, /*headroom=*/1, jobs, /*bound=*/1);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 1);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 0);
  EXPECT_EQ(jobs[1].allocation_reason,
            "0.00 of its need 2.00: the pool ran out (priority 0, 0.50 trainers' wait removed per "
            "worker)");
}

TEST(AutoscalerAllocation, AStarvedTrainerKeepsItsLastDemand) {
  Autoscaler scaler(AutoscalerOptions{.noise_z = 0});
  AutoscalerInput in;
  in.now = absl::FromUnixSeconds(1000);
  in.jobs = {{.job_id = 1, .batch_size = 64}};
  // New and given nothing: demand unknown, the job starved.
  in.consumers = {{.job_id = 1, .batches_per_second = 0, .wait_fraction = 1}};
  AutoscalerDecision d = scaler.Decide(in);
  ASSERT_EQ(d.jobs.size(), 1u);
  EXPECT_TRUE(d.jobs[0].starved);
  // Still nothing: still starved (its 0 is no estimate).
  in.now += absl::Seconds(2);
  d = scaler.Decide(in);
  EXPECT_TRUE(d.jobs[0].starved);
  // Served: 4 batches/s at 50% wait = 512 el/s.
  in.now += absl::Seconds(2);
  in.consumers[0].batches_per_second = 4;
  in.consumers[0].wait_fraction = 0.5;
  d = scaler.Decide(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 512);
  // Starved again: the 512 stands.
  in.now += absl::Seconds(2);
  in.consumers[0].batches_per_second = 0;
  in.consumers[0].wait_fraction = 1;
  d = scaler.Decide(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 512);
  EXPECT_FALSE(d.jobs[0].starved);
  // Nothing while waiting most but not all of the window (a pause, then a wait): still no
  // reading of its demand, so the 512 stands (it fell to 0 when only a full wait counted).
  in.now += absl::Seconds(2);
  in.consumers[0].wait_fraction = 0.94;
  d = scaler.Decide(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].demand, 512);
}

// A job whose trainers neither took a batch nor waited has no need and no reservation: the
// reason says so (it read "its min_workers 0 (its need 0.00 ... is less)").
TEST(AllocateWorkers, AJobWithoutDemandSaysSo) {
  std::vector<JobEstimate> jobs = {Job(1, 2, 4), Job(2, 1, 0)};
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, jobs, /*bound=*/6);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 0.0);
  EXPECT_EQ(jobs[1].allocation_reason,
            "no demand: its trainers took no batch and waited for none (paused, or starting)");
  // With a reservation, the reservation is the reason.
  jobs = {Job(1, 2, 4), Job(2, 1, 0, /*priority=*/0, /*min_workers=*/1)};
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, jobs, /*bound=*/6);
  EXPECT_EQ(jobs[1].allocation_reason, "its min_workers 1 (its need 0.00 x 1.00 headroom is less)");
}

TEST(AllocateWorkers, HigherPriorityIsServedFirstWhateverItsGain) {
  // Job 1 removes 4/4 = 1 trainer-second per worker, job 2 only 1/5, but job
  // 2 has priority 1: it gets its 5 x 1.2 = 6 of the 7, job 1 the last one.
  std::vector<JobEstimate> jobs = {Job(1, 4, 4), Job(2, 1, 5, 1)};
  AllocateWorkers(/*pool=*/7, /*headroom=*/1.2, jobs, /*bound=*/7);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 1);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 6);
}

TEST(AllocateWorkers, MinWorkersAreKeptAndTheRestGoesToTheHigherPriority) {
  // Both reserve 2 and the pool of 5 holds both; the last worker goes to priority 1.
  std::vector<JobEstimate> jobs = {Job(1, 1, 4, 0, 2), Job(2, 1, 4, 1, 2)};
  AllocateWorkers(/*pool=*/5, /*headroom=*/1, jobs, /*bound=*/5);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 2);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 3);
}

// Two jobs without an end known, of the same priority and gain: one after the
// other, job 1 would take 4 of the 6 workers and job 2 the 2 left, for as long
// as both run; they share the pool in proportion to their need instead. So do
// jobs whose gains differ by less than kReorderMargin (2/4 and 2/3.8: 5%).
// Gains further apart (2/4 and 2/3: a third) are served one after the other.
TEST(AllocateWorkers, JobsAlikeWithoutAnEndShareThePool) {
  std::vector<JobEstimate> equal = {Job(1, 2, 4), Job(2, 2, 4)};
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, equal, /*bound=*/6);
  EXPECT_DOUBLE_EQ(equal[0].allocated, 3);
  EXPECT_DOUBLE_EQ(equal[1].allocated, 3);
  EXPECT_EQ(equal[0].allocation_reason,
            "3.00 of its need 4.00: the pool ran out (priority 0, 0.50 trainers' wait removed per "
            "worker); shared in proportion to the need with job 2 (no end known, the same "
            "priority and gain)");

  std::vector<JobEstimate> close = {Job(1, 2, 4), Job(2, 2, 3.8)};
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, close, /*bound=*/6);
  EXPECT_DOUBLE_EQ(close[0].allocated, 6 * 4 / 7.8);
  EXPECT_DOUBLE_EQ(close[1].allocated, 6 * 3.8 / 7.8);

  std::vector<JobEstimate> apart = {Job(1, 2, 4), Job(2, 2, 3)};
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, apart, /*bound=*/6);
  EXPECT_DOUBLE_EQ(apart[0].allocated, 3);
  EXPECT_DOUBLE_EQ(apart[1].allocated, 3);
  EXPECT_EQ(apart[1].allocation_rank, 0);
  EXPECT_EQ(apart[0].allocation_reason,
            "3.00 of its need 4.00: the pool ran out (priority 0, 0.50 trainers' wait removed per "
            "worker)");

  // Jobs whose end is known are served one after the other (the fewest
  // worker-seconds first), alike or not.
  std::vector<JobEstimate> ending = {Job(1, 2, 4), Job(2, 2, 4)};
  for (JobEstimate& j : ending) j.remaining_seconds = 100;
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, ending, /*bound=*/6);
  EXPECT_DOUBLE_EQ(ending[0].allocated, 4);
  EXPECT_DOUBLE_EQ(ending[1].allocated, 2);
}

// Gains 20% apart: jobs that shared last time go on sharing (what two identical jobs read on
// different workers); jobs that did not are served one after the other; 35% apart, sharing ends.
TEST(AllocateWorkers, JobsThatSharedGoOnSharingWithinTheWiderMargin) {
  auto two_jobs = [](double need_of_2, bool shared_before) {
    std::vector<JobEstimate> jobs = {Job(1, 2, 4), Job(2, 2, need_of_2)};
    for (JobEstimate& j : jobs) j.shared_before = shared_before;
    AllocateWorkers(/*pool=*/6, /*headroom=*/1, jobs, /*bound=*/6);
    return jobs;
  };
  // Job 2's gain 2/4.8 = 0.417 against job 1's 0.5.
  std::vector<JobEstimate> kept = two_jobs(4.8, true);
  EXPECT_DOUBLE_EQ(kept[0].allocated, 6 * 4 / 8.8);
  EXPECT_DOUBLE_EQ(kept[1].allocated, 6 * 4.8 / 8.8);
  EXPECT_TRUE(kept[0].shared);
  EXPECT_TRUE(kept[1].shared);
  EXPECT_EQ(kept[1].allocation_reason,
            "3.27 of its need 4.80: the pool ran out (priority 0, 0.42 trainers' wait removed per "
            "worker); shared in proportion to the need with job 1 (no end known, the same "
            "priority and gain)");

  std::vector<JobEstimate> fresh = two_jobs(4.8, false);
  EXPECT_DOUBLE_EQ(fresh[0].allocated, 4);
  EXPECT_DOUBLE_EQ(fresh[1].allocated, 2);
  EXPECT_FALSE(fresh[0].shared);
  EXPECT_FALSE(fresh[1].shared);

  // 2/5.4 = 0.370: 35% apart.
  std::vector<JobEstimate> apart = two_jobs(5.4, true);
  EXPECT_DOUBLE_EQ(apart[0].allocated, 4);
  EXPECT_DOUBLE_EQ(apart[1].allocated, 2);
  EXPECT_FALSE(apart[1].shared);
}

// `jobs`, each ranked last time in the order given (previous_rank 0, 1, ...).
std::vector<JobEstimate> RankedInThisOrderLastTime(std::vector<JobEstimate> jobs) {
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i].previous_rank = static_cast<int>(i);
  return jobs;
}

// Jobs whose end is known (100 s left each), so served one after the other.
TEST(AllocateWorkers, AJobKeepsItsPlaceUnlessAnotherIsClearlyAhead) {
  auto ending = [](std::vector<JobEstimate> jobs) {
    for (JobEstimate& j : jobs) j.remaining_seconds = 100;
    return jobs;
  };
  // Job 2 still needs 380 worker-seconds, job 1 400: 5% fewer, within the
  // noise of two measured needs. Ranked anew, job 2 goes first; served first
  // last time, job 1 keeps its place.
  std::vector<JobEstimate> fresh = ending({Job(1, 2, 4), Job(2, 2, 3.8)});
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, fresh, /*bound=*/6);
  EXPECT_DOUBLE_EQ(fresh[0].allocated, 2.2);
  EXPECT_DOUBLE_EQ(fresh[1].allocated, 3.8);

  std::vector<JobEstimate> kept = RankedInThisOrderLastTime(ending({Job(1, 2, 4), Job(2, 2, 3.8)}));
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, kept, /*bound=*/6);
  EXPECT_DOUBLE_EQ(kept[0].allocated, 4);
  EXPECT_DOUBLE_EQ(kept[1].allocated, 2);
  EXPECT_EQ(kept[0].allocation_rank, 0);
  EXPECT_EQ(kept[1].allocation_rank, 1);

  // 300 worker-seconds are a quarter fewer than 400: job 2 passes.
  std::vector<JobEstimate> passed = RankedInThisOrderLastTime(ending({Job(1, 2, 4), Job(2, 2, 3)}));
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, passed, /*bound=*/6);
  EXPECT_DOUBLE_EQ(passed[0].allocated, 3);
  EXPECT_DOUBLE_EQ(passed[1].allocated, 3);
  EXPECT_EQ(passed[1].allocation_rank, 0);

  // A higher priority always passes, however small its gain.
  std::vector<JobEstimate> priority =
      RankedInThisOrderLastTime({Job(1, 2, 4), Job(2, 1, 5, /*priority=*/1)});
  AllocateWorkers(/*pool=*/6, /*headroom=*/1, priority, /*bound=*/6);
  EXPECT_DOUBLE_EQ(priority[0].allocated, 1);
  EXPECT_DOUBLE_EQ(priority[1].allocated, 5);
}

TEST(AllocateWorkers, WhatIsLeftGoesInProportionToTheNeed) {
  // Σ need 8 of a pool of 10: the 2 left are split 2:6.
  std::vector<JobEstimate> jobs = {Job(1, 1, 2), Job(2, 1, 6)};
  AllocateWorkers(/*pool=*/10, /*headroom=*/1, jobs, /*bound=*/10);
  EXPECT_DOUBLE_EQ(jobs[0].allocated, 2.5);
  EXPECT_DOUBLE_EQ(jobs[1].allocated, 7.5);
}

// `workers` warm workers (registered long ago, heartbeating now, at t = 1000 s)
// with the given per-job capacities.
AutoscalerInput WarmPool(int workers, std::vector<JobCapacity> capacity) {
  AutoscalerInput in;
  in.now = absl::FromUnixSeconds(1000);
  for (int id = 1; id <= workers; ++id) {
    WorkerSample w;
    w.worker_id = static_cast<uint64_t>(id);
    w.registered = absl::FromUnixSeconds(0);
    w.last_heartbeat = in.now;
    w.capacity = capacity;
    in.workers.push_back(w);
  }
  return in;
}

// Two jobs on 10 workers with max_workers 10 (fixed headroom 1.05): job 1
// needs 512 / 100 = 5.12 workers (5.376 with headroom), job 2 640 / 50 = 12.8
// (13.44). Job 1 removes 1/5.12 trainer-seconds of wait per worker, job 2
// 1/12.8: job 1 gets its 5.376, job 2 the other 4.624. With priority 1, job 2
// would take all 10; job 1's min_workers 2 keeps 2 of them.
TEST(AutoscalerAllocation, BoundedPoolIsDividedByGainThenPriority) {
  Autoscaler scaler(AutoscalerOptions{.min_workers = 1, .max_workers = 10, .noise_z = 0});
  AutoscalerInput in = WarmPool(10, {{1, 100}, {2, 50}});
  in.jobs = {{.job_id = 1, .batch_size = 64}, {.job_id = 2, .batch_size = 32}};
  in.consumers = {{.job_id = 1, .batches_per_second = 8, .wait_fraction = 0},
                  {.job_id = 2, .batches_per_second = 10, .wait_fraction = 0.5}};
  AutoscalerDecision d = scaler.Decide(in);
  EXPECT_EQ(d.desired_workers, 10);
  EXPECT_TRUE(d.pool_bound);
  ASSERT_EQ(d.jobs.size(), 2u);
  EXPECT_DOUBLE_EQ(d.jobs[0].allocated, 5.12 * 1.05);
  EXPECT_DOUBLE_EQ(d.jobs[1].allocated, 10 - 5.12 * 1.05);

  in.jobs[1].priority = 1;
  d = scaler.Decide(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].allocated, 0);
  EXPECT_DOUBLE_EQ(d.jobs[1].allocated, 10);

  in.jobs[0].min_workers = 2;
  d = scaler.Decide(in);
  EXPECT_DOUBLE_EQ(d.jobs[0].allocated, 2);
  EXPECT_DOUBLE_EQ(d.jobs[1].allocated, 8);
  EXPECT_EQ(d.jobs[0].min_workers, 2);
  EXPECT_EQ(d.jobs[1].priority, 1);
}

// Right after a restart, the pool is not divided while a job reads as no
// demand only because it has not been read yet: two jobs on 10 workers
// (max_workers 10), job 2 needing 12.8 and job 1, priority 1, needing 5.12.
// Job 1's trainers have not reported (unheard), then report a window that
// covers no time (no batch, no wait, no earlier estimate): divided, job 2
// would get all 10 workers; instead every worker serves both. Once job 1 is
// read it is served first. A fresh dispatcher divides at once (the same
// reading is a paused trainer's), and so does a restarted one whose window
// has passed.
TEST(AutoscalerAllocation, ARestartedDispatcherDividesThePoolOnlyOnceEveryJobIsRead) {
  AutoscalerInput in = WarmPool(10, {{1, 100}, {2, 50}});
  in.jobs = {{.job_id = 1, .batch_size = 64, .priority = 1}, {.job_id = 2, .batch_size = 32}};
  const ConsumerSample job2{.job_id = 2, .batches_per_second = 10, .wait_fraction = 0.5};
  const ConsumerSample job1_unread{.job_id = 1, .batches_per_second = 0, .wait_fraction = 0};
  const ConsumerSample job1_read{.job_id = 1, .batches_per_second = 8, .wait_fraction = 0};
  const AutoscalerOptions options{
      .min_workers = 1, .max_workers = 10, .noise_z = 0, .restarted = true};
  Autoscaler scaler(options);
  in.consumers = {job2};
  AutoscalerDecision d = scaler.Decide(in);
  EXPECT_FALSE(d.pool_bound);
  EXPECT_THAT(d.reason, HasSubstr("; the pool is not divided until job 1 is read since the "
                                  "restart: every worker serves every job"));
  in.now += absl::Seconds(2);
  in.consumers = {job1_unread, job2};
  d = scaler.Decide(in);
  EXPECT_FALSE(d.pool_bound);
  EXPECT_THAT(d.reason, HasSubstr("the pool is not divided until job 1 is read"));
  in.now += absl::Seconds(2);
  in.consumers = {job1_read, job2};
  d = scaler.Decide(in);
  EXPECT_TRUE(d.pool_bound);
  ASSERT_EQ(d.jobs.size(), 2u);
  EXPECT_DOUBLE_EQ(d.jobs[0].allocated, 5.12 * 1.05);
  EXPECT_DOUBLE_EQ(d.jobs[1].allocated, 10 - 5.12 * 1.05);
  EXPECT_THAT(d.reason, Not(HasSubstr("not divided")));

  AutoscalerOptions fresh_options = options;
  fresh_options.restarted = false;
  Autoscaler fresh(fresh_options);
  in.consumers = {job1_unread, job2};
  d = fresh.Decide(in);
  EXPECT_TRUE(d.pool_bound);
  ASSERT_EQ(d.jobs.size(), 2u);
  EXPECT_DOUBLE_EQ(d.jobs[0].allocated, 0);
  EXPECT_DOUBLE_EQ(d.jobs[1].allocated, 10);

  Autoscaler later(options);
  in.consumers = {job2};
  EXPECT_FALSE(later.Decide(in).pool_bound);
  in.now += absl::Seconds(30);
  in.consumers = {job1_unread, job2};
  EXPECT_TRUE(later.Decide(in).pool_bound);
}

// A reservation above its job's need is provisioned, not taken from the
// other jobs' need: job 1 needs 0.1 workers (10 / 100 el/s) and reserves 2,
// job 2 needs 2.4 (120 / 50; 2.52 with headroom): the pool is sized to
// ceil(2 + 2.52) = 5, unbounded, and each job gets what it holds, with the
// reason naming the reservation. Before, the count followed the need (3) and
// job 2 read "1.00 of its need 2.40: the pool ran out".
TEST(AutoscalerAllocation, AReservationAboveTheNeedIsProvisionedNotTakenFromOtherJobs) {
  Autoscaler scaler(AutoscalerOptions{.min_workers = 1, .max_workers = 64, .noise_z = 0});
  AutoscalerInput in = WarmPool(3, {{1, 100}, {2, 50}});
  in.jobs = {{.job_id = 1, .batch_size = 10, .min_workers = 2}, {.job_id = 2, .batch_size = 12}};
  in.consumers = {{.job_id = 1, .batches_per_second = 1, .wait_fraction = 0},
                  {.job_id = 2, .batches_per_second = 10, .wait_fraction = 0}};
  AutoscalerDecision d = scaler.Decide(in);
  EXPECT_EQ(d.desired_workers, 5);
  EXPECT_THAT(d.reason, HasSubstr("raised to 5 for the jobs' min_workers"));
  EXPECT_FALSE(d.pool_bound);
  ASSERT_EQ(d.jobs.size(), 2u);
  // Each holds its own; the rest of the 5 (0.48) goes in proportion to that (2 : 2.52).
  const double rest = 5 - 2 - 2.52;
  EXPECT_NEAR(d.jobs[0].allocated, 2 + rest * 2 / 4.52, 1e-9);
  EXPECT_EQ(d.jobs[0].allocation_reason,
            "its min_workers 2 (its need 0.10 x 1.05 headroom is less)");
  EXPECT_NEAR(d.jobs[1].allocated, 2.52 + rest * 2.52 / 4.52, 1e-9);
  EXPECT_EQ(d.jobs[1].allocation_reason, "its need 2.40 x 1.05 headroom");
  // With max_workers 4 the pool binds: the reservation first, job 2 the rest.
  Autoscaler four(AutoscalerOptions{.min_workers = 1, .max_workers = 4, .noise_z = 0});
  d = four.Decide(in);
  EXPECT_EQ(d.desired_workers, 4);
  EXPECT_TRUE(d.pool_bound);
  EXPECT_DOUBLE_EQ(d.jobs[0].allocated, 2);
  EXPECT_DOUBLE_EQ(d.jobs[1].allocated, 2);
  // A reservation the pool cannot hold raises nothing: min_workers 9 of 4.
  in.jobs[0].min_workers = 9;
  d = four.Decide(in);
  EXPECT_EQ(d.desired_workers, 3);
  EXPECT_THAT(d.reason, Not(HasSubstr("min_workers")));
}

// Two endless jobs of the same cost and demand under a pool that holds one
// and a half of them: their measured demands differ by noise alone (±3%, in
// turn), and the first-served job, with the workers it holds, stays the same
// at every decision. Before, the order followed the noise: the jobs swapped
// places, and 2 of the 6 workers, at every decision.
TEST(AutoscalerAllocation, NoiseDoesNotSwapTwoLikeJobsEveryPeriod) {
  Autoscaler scaler(AutoscalerOptions{.min_workers = 1, .max_workers = 6, .noise_z = 0});
  AutoscalerInput in = WarmPool(6, {{1, 100}, {2, 100}});
  in.jobs = {{.job_id = 1, .batch_size = 32}, {.job_id = 2, .batch_size = 32}};
  std::vector<int> first_served;
  for (int period = 0; period < 8; ++period) {
    const double up = period % 2 == 0 ? 1.03 : 0.97;
    in.now = absl::FromUnixSeconds(1000 + 2 * period);
    for (WorkerSample& w : in.workers) w.last_heartbeat = in.now;
    in.consumers = {{.job_id = 1, .batches_per_second = 12.5 * up, .wait_fraction = 0.3},
                    {.job_id = 2, .batches_per_second = 12.5 / up, .wait_fraction = 0.3}};
    AutoscalerDecision d = scaler.Decide(in);
    ASSERT_TRUE(d.pool_bound);
    ASSERT_EQ(d.jobs.size(), 2u);
    first_served.push_back(d.jobs[0].allocation_rank == 0 ? 1 : 2);
  }
  EXPECT_THAT(first_served, ::testing::Each(first_served[0]));
}

// Two endless jobs alike on a pool of 2, their gains reading 18% apart every other period (the
// capacity each worker measures for its job, 92 and 108 el/busy-s, swapping): they keep half the
// pool each, where before the job read ahead took both workers in those periods.
TEST(AutoscalerAllocation, JobsAlikeKeepSharingThroughNoiseInTheirGains) {
  Autoscaler scaler(AutoscalerOptions{.min_workers = 1, .max_workers = 2, .noise_z = 0});
  AutoscalerInput in = WarmPool(2, {});
  in.jobs = {{.job_id = 1, .batch_size = 32}, {.job_id = 2, .batch_size = 32}};
  std::vector<std::pair<double, double>> allocated;
  for (int period = 0; period < 6; ++period) {
    const bool apart = period % 2 == 1;
    in.now = absl::FromUnixSeconds(1000 + 2 * period);
    in.workers[0].last_heartbeat = in.workers[1].last_heartbeat = in.now;
    in.workers[0].capacity = {{1, apart ? 92.0 : 100.0}};
    in.workers[1].capacity = {{2, apart ? 108.0 : 100.0}};
    in.consumers = {{.job_id = 1, .batches_per_second = 5, .wait_fraction = 0.5},
                    {.job_id = 2, .batches_per_second = 5, .wait_fraction = 0.5}};
    AutoscalerDecision d = scaler.Decide(in);
    ASSERT_TRUE(d.pool_bound);
    ASSERT_EQ(d.jobs.size(), 2u);
    allocated.emplace_back(d.jobs[0].allocated, d.jobs[1].allocated);
  }
  // Needs 320/92 = 3.478 and 320/108 = 2.963 when apart: 2 × 3.478 / 6.441 and 2 × 2.963 / 6.441.
  for (int period = 0; period < 6; ++period) {
    SCOPED_TRACE(period);
    EXPECT_NEAR(allocated[period].first, period % 2 == 1 ? 1.080 : 1, 0.001);
    EXPECT_NEAR(allocated[period].second, period % 2 == 1 ? 0.920 : 1, 0.001);
  }
}

TEST(AutoscalerAllocation, UnboundedPoolGivesEveryJobItsNeed) {
  Autoscaler scaler(AutoscalerOptions{.min_workers = 1, .max_workers = 64, .noise_z = 0});
  AutoscalerInput in = WarmPool(6, {{1, 100}});
  in.jobs = {{.job_id = 1, .batch_size = 64}};
  in.consumers = {{.job_id = 1, .batches_per_second = 8, .wait_fraction = 0}};
  AutoscalerDecision d = scaler.Decide(in);
  // need 5.12 x 1.05 = 5.376 -> 6 workers, all of them job 1's.
  EXPECT_EQ(d.desired_workers, 6);
  EXPECT_FALSE(d.pool_bound);
  ASSERT_EQ(d.jobs.size(), 1u);
  EXPECT_DOUBLE_EQ(d.jobs[0].allocated, 6);
}

// An allocated job for AssignWorkersToJobs.
JobEstimate Allocated(uint64_t id, double allocated, int rank) {
  JobEstimate j;
  j.job_id = id;
  j.allocated = allocated;
  j.allocation_rank = rank;
  return j;
}

TEST(AllocateWorkers, RanksJobsInTheOrderTheyAreServed) {
  // The header's example: job 1 (2/4 removed per worker), job 2 (2/8), job 3
  // (1/6).
  std::vector<JobEstimate> jobs = {Job(3, 1, 6), Job(2, 2, 8), Job(1, 2, 4)};
  AllocateWorkers(/*pool=*/10, /*headroom=*/1, jobs, /*bound=*/10);
  EXPECT_EQ(jobs[0].allocation_rank, 2);
  EXPECT_EQ(jobs[1].allocation_rank, 1);
  EXPECT_EQ(jobs[2].allocation_rank, 0);
}

TEST(AssignWorkersToJobs, WorkedExampleFromTheHeader) {
  const std::map<uint64_t, uint64_t> assigned =
      AssignWorkersToJobs({Allocated(7, 2.6, /*rank=*/0), Allocated(8, 1.4, /*rank=*/1)},
                          /*workers=*/{4, 3, 2, 1}, /*previous=*/{{1, 8}, {2, 8}});
  EXPECT_EQ(assigned, (std::map<uint64_t, uint64_t>{{1, 8}, {2, 7}, {3, 7}, {4, 7}}));
}

TEST(AssignWorkersToJobs, FewerWorkersThanTheAllocationCutTheLastRankedFirst) {
  // Quotas 4, 3, 1 for 5 workers (3 still starting): job 3 (rank 2) gives up
  // its 1, job 2 (rank 1) 2 of its 3.
  const std::map<uint64_t, uint64_t> assigned = AssignWorkersToJobs(
      {Allocated(1, 4, /*rank=*/0), Allocated(2, 3, /*rank=*/1), Allocated(3, 1, /*rank=*/2)},
      /*workers=*/{10, 11, 12, 13, 14}, /*previous=*/{});
  EXPECT_EQ(assigned, (std::map<uint64_t, uint64_t>{{10, 1}, {11, 1}, {12, 1}, {13, 1}, {14, 2}}));
}

TEST(AssignWorkersToJobs, WorkersBeyondTheAllocationServeEveryJob) {
  // 1 + 1 workers allocated, 3 registered (one to be drained): worker 3 is in
  // no job's share.
  const std::map<uint64_t, uint64_t> assigned =
      AssignWorkersToJobs({Allocated(5, 1, /*rank=*/1), Allocated(6, 1, /*rank=*/0)},
                          /*workers=*/{1, 2, 3}, /*previous=*/{});
  EXPECT_EQ(assigned, (std::map<uint64_t, uint64_t>{{1, 6}, {2, 5}}));
}

TEST(AssignWorkersToJobs, AJobThatLeftFreesItsWorkers) {
  // Job 5 left; job 6 now has the whole pool of 3: worker 1 leaves job 5 and
  // workers 2 and 3 keep job 6.
  const std::map<uint64_t, uint64_t> assigned =
      AssignWorkersToJobs({Allocated(6, 3, /*rank=*/0)}, /*workers=*/{1, 2, 3},
                          /*previous=*/{{1, 5}, {2, 6}, {3, 6}});
  EXPECT_EQ(assigned, (std::map<uint64_t, uint64_t>{{1, 6}, {2, 6}, {3, 6}}));
}

TEST(AssignWorkersToJobs, ASmallFractionGetsAWorkerOnlyWhenOneIsSpare) {
  // Quotas 2 (of 2.5) and 0 (of 0.5) for 3 workers: the spare worker goes to
  // the larger fraction, ties to the lower rank: job 2 (rank 0).
  const std::map<uint64_t, uint64_t> assigned =
      AssignWorkersToJobs({Allocated(1, 2.5, /*rank=*/1), Allocated(2, 0.5, /*rank=*/0)},
                          /*workers=*/{1, 2, 3}, /*previous=*/{{3, 1}});
  EXPECT_EQ(assigned, (std::map<uint64_t, uint64_t>{{1, 2}, {2, 1}, {3, 1}}));
}

}  // namespace
}  // namespace sluice::dispatcher
