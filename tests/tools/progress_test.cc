// The CLI's progress bar: whole lines every few seconds when its output is not a terminal.
#include "tools/cli/progress.h"

#include <cstdio>
#include <string>

#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::cli {
namespace {

using ::testing::HasSubstr;

class Captured {
 public:
  Captured() : file_(std::tmpfile()) {}
  ~Captured() { std::fclose(file_); }
  std::FILE* file() { return file_; }
  std::string Text() {
    std::fflush(file_);
    std::rewind(file_);
    std::string text;
    char buffer[512];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), file_)) > 0) text.append(buffer, n);
    return text;
  }

 private:
  std::FILE* file_;
};

TEST(ProgressBar, NotATerminalPrintsALineEveryIntervalAndASummary) {
  FakeClock clock;
  Captured out;
  {
    ProgressBar bar(
        "consume", 100,
        {.clock = &clock, .out = out.file(), .terminal = 0, .line_interval = absl::Seconds(5)});
    bar.Update(10);  // at 0 s: nothing yet
    EXPECT_EQ(out.Text(), "");
    clock.Advance(absl::Seconds(4));
    bar.Update(20);  // 4 s: still inside the interval
    EXPECT_EQ(out.Text(), "");
    clock.Advance(absl::Seconds(1));
    bar.Update(25);  // 5 s: a line
    EXPECT_EQ(out.Text(),
              "consume    [######..................]     25/100     25%  5.0/s  ETA 15s\n");
    clock.Advance(absl::Seconds(3));
    bar.Update(40);  // 3 s after the line: nothing more
    clock.Advance(absl::Seconds(2));
    bar.Update(50);  // 5 s after it: the second line
    bar.Done();
  }
  EXPECT_EQ(out.Text(),
            "consume    [######..................]     25/100     25%  5.0/s  ETA 15s\n"
            "consume    [############............]     50/100     50%  5.0/s  ETA 10s\n"
            "consume    [############............]     50/100     50%  5.0/s  (10.00s)\n");
}

TEST(ProgressBar, TerminalRedrawsInPlace) {
  FakeClock clock;
  Captured out;
  ProgressBar bar("convert", 0, {.clock = &clock, .out = out.file(), .terminal = 1});
  bar.Update(3);
  clock.Advance(absl::Milliseconds(100));
  bar.Update(6);
  bar.Done();
  EXPECT_EQ(out.Text(),
            "\rconvert    3  0.0/s\rconvert    6  60.0/s\rconvert    6  60.0/s  (0.10s)\n");
}

}  // namespace
}  // namespace sluice::cli
