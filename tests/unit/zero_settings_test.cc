// pgrelay zero's settings: .env files, the environment zero-cache gets, Node version ranges.
#include <gtest/gtest.h>

#include "zero/dotenv.h"
#include "zero/zero_cache_package.h"
#include "zero/zero_environment.h"

namespace pgrelay::zero {
namespace {

std::map<std::string, std::string> parse_ok(std::string_view text) {
  auto parsed = parse_dotenv(text, ".env");
  EXPECT_TRUE(parsed.ok()) << (parsed.ok() ? "" : parsed.error().message);
  return parsed.ok() ? *parsed : std::map<std::string, std::string>{};
}

TEST(Dotenv, ReadsTheFormsAppsWrite) {
  auto vars = parse_ok(
      "# zero-cache\n"
      "ZERO_PORT=4850\n"
      "  export ZERO_APP_ID = myapp   # a comment\n"
      "ZERO_AUTH_SECRET='s#cret \"x\" \\n'\n"
      "ZERO_LOG_LEVEL=\"debug\\ttab\\nline \\\"q\\\" \\\\ \\x\"\n"
      "\n"
      "EMPTY=\n"
      "HASH=a#b\r\n"
      "MULTI=\"one\n"
      "two\"\n"
      "ZERO_PORT=4851\n");
  EXPECT_EQ(vars["ZERO_PORT"], "4851");  // the later line wins
  EXPECT_EQ(vars["ZERO_APP_ID"], "myapp");
  EXPECT_EQ(vars["ZERO_AUTH_SECRET"], "s#cret \"x\" \\n");
  EXPECT_EQ(vars["ZERO_LOG_LEVEL"], "debug\ttab\nline \"q\" \\ \\x");
  EXPECT_EQ(vars["EMPTY"], "");
  EXPECT_EQ(vars["HASH"], "a#b");  // # starts a comment only after a space
  EXPECT_EQ(vars["MULTI"], "one\ntwo");
  EXPECT_EQ(vars.size(), 7u);
  EXPECT_TRUE(parse_ok("").empty());
  EXPECT_TRUE(parse_ok("\n\n# only comments\n   \n").empty());
}

TEST(Dotenv, EachMistakeNamesItsLineAndTheForm) {
  struct Case {
    const char* text;
    const char* says;
    int line;
  };
  for (const Case& c : {Case{"A=1\nnot a variable\n", "\"=\" was expected after not", 2},
                        Case{"A=1\n\n=value\n", "a variable's name was expected", 3},
                        Case{"A='open\nB=2\n", "closing ' is missing", 1},
                        Case{"A=\"x\" trailing\n", "nothing but a comment", 1},
                        Case{"1A=x\n", "a variable's name was expected", 1},
                        Case{"A=1\nB=\"two\nlines\"\nC\n", "\"=\" was expected after C", 4}}) {
    auto parsed = parse_dotenv(c.text, "/app/.env");
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.error().sqlstate, sqlstate::kInvalidParameterValue);
    EXPECT_NE(parsed.error().message.find("/app/.env, line " + std::to_string(c.line) + ": "),
              std::string::npos)
        << parsed.error().message;
    EXPECT_NE(parsed.error().message.find(c.says), std::string::npos) << parsed.error().message;
    EXPECT_NE(parsed.error().hint.find("NAME=value"), std::string::npos);
  }
}

TEST(ZeroEnvironment, TheUsersZeroSettingsWinOverPgrelays) {
  const auto env = zero_cache_environment(
      {"PATH=/usr/bin", "ZERO_PORT=5000", "NODE_OPTIONS=--x", "BROKEN", "=nameless"},
      {{"ZERO_PORT", "6000"},
       {"ZERO_APP_ID", "app"},
       {"DATABASE_URL", "not zero's"},
       {"ZERO_CVR_DB", "postgres://mine/cvr"}},
      {{"ZERO_UPSTREAM_DB", "postgres://relay/postgres"},
       {"ZERO_CVR_DB", "postgres://relay/cvr"},
       {"ZERO_REPLICA_FILE", "/d/zero/replica.db"}});
  EXPECT_EQ(env, (std::vector<std::string>{"NODE_OPTIONS=--x", "PATH=/usr/bin", "ZERO_APP_ID=app",
                                           "ZERO_CVR_DB=postgres://mine/cvr", "ZERO_PORT=5000",
                                           "ZERO_REPLICA_FILE=/d/zero/replica.db",
                                           "ZERO_UPSTREAM_DB=postgres://relay/postgres"}));
  EXPECT_EQ(environment_value(env, "ZERO_PORT"), "5000");  // the environment over .env
  EXPECT_EQ(environment_value(env, "ZERO_CVR_DB"), "postgres://mine/cvr");  // .env over pgrelay
  EXPECT_EQ(environment_value(env, "ZERO_CHANGE_DB"), "");
}

TEST(NodeVersions, RangesAndVersions) {
  EXPECT_EQ(node_major_version("v22.23.5\n"), 22);
  EXPECT_EQ(node_major_version("v8.0.0"), 8);
  EXPECT_EQ(node_major_version("no digits"), std::nullopt);
  EXPECT_EQ(node_major_version("v99999999999999999999"), std::nullopt);
  EXPECT_EQ(least_major_version(">=22"), 22);
  EXPECT_EQ(least_major_version(">= 20.11"), 20);
  EXPECT_EQ(least_major_version("^22.0.0"), 22);
  EXPECT_EQ(least_major_version("24.x || 22.x"), 22);
  EXPECT_EQ(least_major_version(">=22 <25"), 22);
  EXPECT_EQ(least_major_version(""), std::nullopt);
  EXPECT_EQ(least_major_version("*"), std::nullopt);
  EXPECT_EQ(least_major_version("22 || latest"), std::nullopt);
}

}  // namespace
}  // namespace pgrelay::zero
