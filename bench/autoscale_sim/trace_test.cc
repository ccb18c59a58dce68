// The trace format's checks (bench/autoscale_sim/trace.h): a trace the
// simulator cannot model faithfully is refused, naming the line and the value,
// instead of running with a wrapped, ignored or overridden number.
#include "bench/autoscale_sim/trace.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::autoscale_sim {
namespace {

constexpr char kJob[] = "at 0 job 1 consumers=2 batch=32 step=0.25 rate=100\n";

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<Scenario> s = ParseTrace(text, "t.trace");
  EXPECT_FALSE(s.ok()) << text;
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  return std::string(s.status().message());
}

TEST(TraceTest, AValidTraceParses) {
  absl::StatusOr<Scenario> s = ParseTrace(
      "\xEF\xBB\xBF# a byte order mark first\nduration 60\r\nmax_workers 4\ninitial_workers 4\n" +
          std::string(kJob) +
          "at 0 demand x2\nat 5 job 2 consumers=1 batch=8 step=1 rate=10 "
          "priority=-2147483648 min_workers=2147483647 buffer=2147483647\nat 6 stop 1\n",
      "t.trace");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->max_workers, 4);
  EXPECT_EQ(s->initial_workers, 4);
  ASSERT_EQ(s->jobs.size(), 1u);
  EXPECT_EQ(s->jobs[0].consumers, 2);
  ASSERT_EQ(s->steps.size(), 3u);
  EXPECT_EQ(s->steps[1].job_spec.priority, -2147483648);
  EXPECT_EQ(s->steps[1].job_spec.min_workers, 2147483647);
  EXPECT_EQ(s->steps[1].job_spec.buffer_batches, 2147483647);
}

TEST(TraceTest, IntegersOutsideAnIntAreRefusedNotWrapped) {
  EXPECT_EQ(ErrorOf("duration 60\nat 0 job 1 consumers=1 batch=1 step=1 rate=50 "
                    "priority=2147483648\n"),
            "t.trace:2: priority must be within -2147483648..2147483647, got 2147483648");
  EXPECT_EQ(ErrorOf("duration 60\nmax_workers 1e10\n" + std::string(kJob)),
            "t.trace:2: max_workers must be within 1..100000, got 1e10");
  EXPECT_EQ(ErrorOf("duration 60\n" + std::string(kJob) + "at 5 priority 1 -2147483649\n"),
            "t.trace:3: the priority must be within -2147483648..2147483647, got -2147483649");
  EXPECT_EQ(ErrorOf("duration 60\nmax_workers 2.9\n"), "t.trace:2: max_workers must be an integer");
  EXPECT_EQ(ErrorOf("duration 60\ninitial_workers 1.5\n"),
            "t.trace:2: initial_workers must be an integer");
}

TEST(TraceTest, NumbersAreDecimal) {
  EXPECT_EQ(ErrorOf("duration 0x10\n"), "t.trace:1: duration must be a number, got '0x10'");
  EXPECT_EQ(ErrorOf("duration nan\n"), "t.trace:1: duration must be a number, got 'nan'");
  EXPECT_EQ(ErrorOf("duration 1e999\n"), "t.trace:1: duration must be a number, got '1e999'");
}

TEST(TraceTest, ADurationBeyondWhatTheSimulatorKeepsIsRefused) {
  EXPECT_EQ(ErrorOf("duration 1e9\n" + std::string(kJob)),
            "t.trace:1: duration must be at most 1000000 s, got 1e9");
  EXPECT_EQ(ErrorOf("duration 1000000.5\n"),
            "t.trace:1: duration must be at most 1000000 s, got 1000000.5");
  EXPECT_TRUE(ParseTrace("duration 1000000\n" + std::string(kJob), "t.trace").ok());
}

TEST(TraceTest, ANeedBeyondWhatTheSimulatorModelsIsRefused) {
  EXPECT_EQ(ErrorOf("duration 20\nat 0 job 1 consumers=1 batch=32 step=1 rate=1e-8\n"),
            "t.trace:2: job 1 would need 3.2e+09 workers; the simulator models at most 1e+06");
  EXPECT_EQ(ErrorOf("duration 20\nat 0 job 1 consumers=1 batch=32 step=1 rate=1e-310\n"),
            "t.trace:2: job 1 would need inf workers; the simulator models at most 1e+06");
  EXPECT_EQ(ErrorOf("duration 60\n" + std::string(kJob) + "at 10 demand x1e308\n"),
            "t.trace:3: job 1 would need inf workers; the simulator models at most 1e+06");
  EXPECT_EQ(ErrorOf("duration 60\n" + std::string(kJob) + "at 10 cost 1 x1e6\n"),
            "t.trace:3: job 1 would need 2.56e+06 workers; the simulator models at most 1e+06");
}

TEST(TraceTest, AKeyOrDirectiveGivenTwiceIsRefused) {
  EXPECT_EQ(ErrorOf("duration 60\nat 0 job 1 consumers=2 batch=32 step=0.25 rate=100 "
                    "consumers=7\n"),
            "t.trace:2: job 1 sets consumers= twice");
  EXPECT_EQ(ErrorOf("duration 60\nduration 10\n"), "t.trace:2: 'duration' is given twice");
}

TEST(TraceTest, EventsKeepTheFilesOrderAndTheJobsThatAreThere) {
  EXPECT_EQ(ErrorOf("duration 60\nat 0 demand x2\n" + std::string(kJob)),
            "t.trace:3: job 1 arrives at 0 after an event at 0: list the jobs that arrive at 0 "
            "first");
  EXPECT_EQ(ErrorOf("duration 60\n" + std::string(kJob) + "at 5 stop 1\nat 10 cost 1 x2\n"),
            "t.trace:4: job 1 has left");
  EXPECT_EQ(ErrorOf("duration 60\n" + std::string(kJob) + "at 5 stop all\nat 10 priority 1 3\n"),
            "t.trace:4: job 1 has left");
  EXPECT_EQ(ErrorOf("duration 60\n" + std::string(kJob) + "at 60 stop 1\n"),
            "t.trace: an event at 60 s is not before duration 60");
}

TEST(TraceTest, TheMeasuredStretchAndTheFirstWorkersMustFit) {
  EXPECT_EQ(ErrorOf("duration 60\nmeasure_from 60\n" + std::string(kJob)),
            "t.trace: measure_from 60 is not before duration 60");
  EXPECT_EQ(ErrorOf("duration 60\nmax_workers 4\ninitial_workers 1000\n" + std::string(kJob)),
            "t.trace: initial_workers 1000 is more than max_workers 4");
  EXPECT_EQ(ErrorOf("duration 60\ninitial_workers 129\n" + std::string(kJob)),
            "t.trace: initial_workers 129 is more than max_workers 128");
}

TEST(TraceTest, ATextWithANulByteIsRefused) {
  EXPECT_EQ(ErrorOf(std::string("duration 60\0\n", 13)),
            "t.trace: holds a NUL byte (not a text file)");
}

}  // namespace
}  // namespace sluice::autoscale_sim
