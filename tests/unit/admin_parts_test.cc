// The admin page's parts that hold no socket: the log tail kept in memory or read from a file,
// and the history behind its charts and slots' lag in seconds.
#include <gtest/gtest.h>

#include <fstream>

#include "admin/status_history.h"
#include "base/line_tail.h"
#include "log_test_util.h"

namespace pgrelay {
namespace {

using std::chrono::seconds;
using std::chrono::system_clock;

TEST(LineTail, KeepsTheLastLinesAndFiltersThem) {
  LineTail tail(3);
  EXPECT_TRUE(tail.last(10).empty());
  tail.add("one\n");
  tail.add("two\nthree");
  tail.add("four hello\n");
  EXPECT_EQ(tail.added(), 4u);
  EXPECT_EQ(tail.last(10), (std::vector<std::string>{"two", "three", "four hello"}));
  EXPECT_EQ(tail.last(2), (std::vector<std::string>{"three", "four hello"}));
  EXPECT_EQ(tail.last(10, "hello"), (std::vector<std::string>{"four hello"}));
  EXPECT_TRUE(tail.last(10, "one").empty());  // dropped: past the capacity
}

TEST(LineTail, ReadsTheEndOfAFile) {
  log::testing::TempDir dir;
  const std::string path = dir.path() + "/x.log";
  EXPECT_TRUE(tail_file(path, 5).empty());  // no file
  {
    std::ofstream out(path);
    for (int i = 0; i < 1000; ++i) out << "line " << i << (i % 100 == 0 ? " mark" : "") << "\n";
    out << "unfinished";
  }
  EXPECT_EQ(tail_file(path, 2), (std::vector<std::string>{"line 999", "unfinished"}));
  EXPECT_EQ(tail_file(path, 2, "mark"),
            (std::vector<std::string>{"line 800 mark", "line 900 mark"}));
  // A window that cuts a line in two drops the cut piece.
  const auto windowed = tail_file(path, 100, {}, 30);
  ASSERT_FALSE(windowed.empty());
  EXPECT_EQ(windowed.back(), "unfinished");
  for (const auto& line : windowed) {
    EXPECT_TRUE(line == "unfinished" || line.starts_with("line 99")) << line;
  }
}

admin::StatusSample sample(system_clock::time_point t, std::uint64_t transactions,
                           std::uint64_t head, std::uint64_t lag) {
  admin::StatusSample s;
  s.time = t;
  s.captured_transactions = transactions;
  s.heads["app"] = head;
  s.slot_lag["s1"] = lag;
  return s;
}

TEST(StatusHistory, RatesLagAndTheSpan) {
  admin::StatusHistory history(seconds(10));
  const auto t0 = system_clock::time_point(seconds(1'800'000'000));
  EXPECT_EQ(history.lag_seconds("app", 0, t0), 0);
  history.add(sample(t0, 100, 1000, 0));
  history.add(sample(t0 + seconds(1), 150, 1000, 0));
  history.add(sample(t0 + seconds(3), 250, 2000, 1000));
  history.add(sample(t0 + seconds(4), 250, 3000, 2000));
  const auto json = history.to_json();
  EXPECT_EQ(json["span_seconds"], 10);
  ASSERT_EQ(json["samples"].size(), 4u);
  EXPECT_EQ(json["samples"][0]["capture_rate"], 0.0);
  EXPECT_EQ(json["samples"][1]["capture_rate"], 50.0);
  EXPECT_EQ(json["samples"][2]["capture_rate"], 50.0);  // 100 in 2 s
  EXPECT_EQ(json["samples"][3]["capture_rate"], 0.0);
  EXPECT_EQ(json["samples"][3]["slot_lag_bytes"]["s1"], 2000);
  EXPECT_EQ(json["samples"][0]["time"], 1'800'000'000'000LL);

  const auto now = t0 + seconds(5);
  EXPECT_EQ(history.lag_seconds("app", 3000, now), 0);    // caught up
  EXPECT_EQ(history.lag_seconds("app", 2500, now), 1.0);  // the head passed it at t0+4
  EXPECT_EQ(history.lag_seconds("app", 1000, now), 2.0);  // at t0+3
  EXPECT_EQ(history.lag_seconds("app", 500, now), 5.0);   // in every sample: the oldest
  EXPECT_EQ(history.lag_seconds("other", 0, now), 0);     // no log: nothing to lag behind

  // Samples older than the span go.
  history.add(sample(t0 + seconds(12), 300, 3000, 0));
  EXPECT_EQ(history.to_json()["samples"].size(), 3u);
}

}  // namespace
}  // namespace pgrelay
