// Logger: the text and JSON line formats, escaping, level filtering, and whole lines under threads.
#include "base/logger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

namespace pgrelay {
namespace {

// 2026-11-30 04:40:12.345 UTC
std::chrono::system_clock::time_point fixed_time() {
  using namespace std::chrono;
  return system_clock::time_point(seconds(1796013612)) + milliseconds(345);
}

struct Captured {
  std::vector<std::string> lines;
  Logger make(LogFormat format, LogLevel level = LogLevel::kDebug) {
    LoggerOptions options;
    options.format = format;
    options.level = level;
    options.pid = 4242;
    options.clock = fixed_time;
    options.sink = [this](std::string_view line) { lines.emplace_back(line); };
    return Logger(std::move(options));
  }
};

TEST(LoggerTest, TextLineLooksLikePostgres) {
  Captured out;
  Logger logger = out.make(LogFormat::kText);
  logger.info("connection authorized",
              {{"user", "app"}, {"database", "postgres"}, {"replication", false}, {"pid", 17}});
  ASSERT_EQ(out.lines.size(), 1u);
  EXPECT_EQ(out.lines[0],
            "2026-11-30 04:40:12.345 UTC [4242] INFO:  connection authorized user=app "
            "database=postgres replication=false pid=17\n");
}

TEST(LoggerTest, TextLevelNamesAndNumbers) {
  Captured out;
  Logger logger = out.make(LogFormat::kText);
  logger.debug("d", {{"u", std::uint64_t{18446744073709551615u}}, {"i", -5}});
  logger.warning("w", {{"x", 1.5}});
  logger.error("e");
  ASSERT_EQ(out.lines.size(), 3u);
  EXPECT_EQ(out.lines[0],
            "2026-11-30 04:40:12.345 UTC [4242] DEBUG:  d u=18446744073709551615 i=-5\n");
  EXPECT_EQ(out.lines[1], "2026-11-30 04:40:12.345 UTC [4242] WARNING:  w x=1.5\n");
  EXPECT_EQ(out.lines[2], "2026-11-30 04:40:12.345 UTC [4242] ERROR:  e\n");
}

TEST(LoggerTest, TextEscapingKeepsOneLinePerEntry) {
  Captured out;
  Logger logger = out.make(LogFormat::kText);
  // A client chooses its user name: it must not be able to forge a second line.
  std::string evil_user = "bob\n2026-11-30 04:40:12.345 UTC [1] INFO:  connection authorized";
  logger.warning("password authentication failed\nDETAIL:  x",
                 {{"user", evil_user},
                  {"q", "say \"hi\" a=b"},
                  {"empty", ""},
                  {"ctl", std::string("a\x01\tb\x7f", 5)},
                  {"bad_utf8", std::string("\xff\xc3\xa9", 3)},
                  {"back", "c:\\dir"}});
  ASSERT_EQ(out.lines.size(), 1u);
  const std::string& line = out.lines[0];
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
  EXPECT_EQ(
      line,
      "2026-11-30 04:40:12.345 UTC [4242] WARNING:  password authentication failed\\nDETAIL:  "
      "x user=\"bob\\n2026-11-30 04:40:12.345 UTC [1] INFO:  connection authorized\" "
      "q=\"say \\\"hi\\\" a=b\" empty=\"\" ctl=\"a\\x01\\tb\\x7f\" bad_utf8=\\xff\xc3\xa9 "
      "back=\"c:\\\\dir\"\n");
}

TEST(LoggerTest, JsonLinesParseBackWithEveryField) {
  Captured out;
  Logger logger = out.make(LogFormat::kJson);
  std::string tricky =
      std::string("quote\" back\\ nl\n cr\r tab\t nul") + '\0' + "\x01\x1f\x7f end é";
  logger.warning("auth \"failed\"\nnext", {{"user", tricky},
                                           {"n", 42},
                                           {"big", std::uint64_t{1} << 63},
                                           {"ratio", 0.25},
                                           {"inf", std::numeric_limits<double>::infinity()},
                                           {"ok", true},
                                           {"message", "shadowed"},
                                           {"bad_utf8", std::string("a\xff"
                                                                    "b",
                                                                    3)}});
  ASSERT_EQ(out.lines.size(), 1u);
  const std::string& line = out.lines[0];
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
  auto json = nlohmann::json::parse(line);
  EXPECT_EQ(json["time"], "2026-11-30T04:40:12.345Z");
  EXPECT_EQ(json["level"], "warning");
  EXPECT_EQ(json["pid"], 4242);
  EXPECT_EQ(json["message"], "auth \"failed\"\nnext");
  EXPECT_EQ(json["user"].get<std::string>(), tricky);
  EXPECT_EQ(json["n"], 42);
  EXPECT_EQ(json["big"].get<std::uint64_t>(), std::uint64_t{1} << 63);
  EXPECT_DOUBLE_EQ(json["ratio"].get<double>(), 0.25);
  EXPECT_TRUE(json["inf"].is_null());
  EXPECT_EQ(json["ok"], true);
  EXPECT_EQ(json["_message"], "shadowed");
  EXPECT_EQ(json["bad_utf8"],
            "a\xef\xbf\xbd"
            "b");  // U+FFFD for the invalid byte
  // Control characters are escaped, not raw, in the line itself.
  EXPECT_NE(line.find("\\u0000\\u0001\\u001f\\u007f"), std::string::npos) << line;
  // The order is time, level, pid, message, then the fields as given.
  EXPECT_EQ(line.rfind("{\"time\":\"2026-11-30T04:40:12.345Z\",\"level\":\"warning\",\"pid\":4242,"
                       "\"message\":",
                       0),
            0u)
      << line;
}

TEST(LoggerTest, LevelFiltering) {
  Captured out;
  Logger logger = out.make(LogFormat::kJson, LogLevel::kWarning);
  EXPECT_FALSE(logger.enabled(LogLevel::kInfo));
  EXPECT_TRUE(logger.enabled(LogLevel::kError));
  logger.debug("no");
  logger.info("no");
  logger.warning("yes 1");
  logger.error("yes 2");
  ASSERT_EQ(out.lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(out.lines[0])["message"], "yes 1");
  EXPECT_EQ(nlohmann::json::parse(out.lines[1])["level"], "error");
  logger.set_level(LogLevel::kDebug);
  logger.debug("now");
  ASSERT_EQ(out.lines.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(out.lines[2])["level"], "debug");

  // log_to on a null logger is a no-op.
  log_to(nullptr, LogLevel::kError, "nowhere");
  log_to(&logger, LogLevel::kInfo, "somewhere");
  EXPECT_EQ(out.lines.size(), 4u);
}

TEST(LoggerTest, ParsesLevelsAndFormats) {
  EXPECT_EQ(*parse_log_level("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(*parse_log_level("info"), LogLevel::kInfo);
  EXPECT_EQ(*parse_log_level("warn"), LogLevel::kWarning);
  EXPECT_EQ(*parse_log_level("Warning"), LogLevel::kWarning);
  EXPECT_EQ(*parse_log_level("error"), LogLevel::kError);
  auto bad = parse_log_level("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().sqlstate, sqlstate::kInvalidParameterValue);
  EXPECT_NE(bad.error().message.find("loud"), std::string::npos);
  EXPECT_EQ(*parse_log_format("json"), LogFormat::kJson);
  EXPECT_EQ(*parse_log_format("TEXT"), LogFormat::kText);
  EXPECT_FALSE(parse_log_format("xml").ok());
}

TEST(LoggerTest, WritesWholeLinesToAFileDescriptorFromManyThreads) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  LoggerOptions options;
  options.format = LogFormat::kJson;
  options.fd = fds[1];
  Logger logger(std::move(options));
  std::string collected;
  std::thread reader([&] {
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(fds[0], buffer, sizeof buffer)) > 0) collected.append(buffer, n);
  });
  constexpr int kThreads = 4, kLines = 500;
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      std::string padding(200, static_cast<char>('a' + t));
      for (int i = 0; i < kLines; ++i)
        logger.info("line", {{"thread", t}, {"i", i}, {"pad", padding}});
    });
  }
  for (auto& w : writers) w.join();
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  std::istringstream in(collected);
  std::string line;
  int count = 0;
  std::vector<int> next(kThreads, 0);
  while (std::getline(in, line)) {
    auto json = nlohmann::json::parse(line);  // throws (fails the test) on a torn line
    int t = json["thread"];
    EXPECT_EQ(json["i"], next[t]++);
    EXPECT_EQ(json["pid"], static_cast<int>(::getpid()));
    EXPECT_EQ(json["pad"].get<std::string>(), std::string(200, static_cast<char>('a' + t)));
    ++count;
  }
  EXPECT_EQ(count, kThreads * kLines);
}

}  // namespace
}  // namespace pgrelay
