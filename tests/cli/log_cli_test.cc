// Runs `pgrelay log dump` and `pgrelay log stat` on a log written here and checks their output.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../unit/log_test_util.h"
#include "log/change_log.h"
#include "log/slots.h"
#include "log/transaction.h"

namespace pgrelay::log {
namespace {

struct CommandResult {
  int status = -1;
  std::string out;
  std::string err;
};

CommandResult run_pgrelay(const std::string& args, const std::string& dir) {
  std::string err_file = dir + "/stderr.txt";
  std::string cmd = std::string(PGRELAY_BINARY) + " " + args + " 2>" + err_file;
  CommandResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  r.err.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

std::vector<nlohmann::json> lines_of(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::size_t start = 0;
  while (start < out.size()) {
    std::size_t nl = out.find('\n', start);
    v.push_back(nlohmann::json::parse(out.substr(start, nl - start)));
    start = nl + 1;
  }
  return v;
}

pgoutput::Relation relation(pgoutput::Oid oid, const std::string& name) {
  pgoutput::Relation r;
  r.oid = oid;
  r.namespace_name = "public";
  r.name = name;
  r.replica_identity = 'd';
  r.columns = {{1, "id", 23, -1}, {0, "note", 25, -1}};
  return r;
}

pgoutput::Tuple row(const std::string& id, std::optional<std::string> note) {
  pgoutput::Tuple t;
  t.columns.push_back({pgoutput::ValueKind::kText, id});
  t.columns.push_back(note ? pgoutput::TupleValue{pgoutput::ValueKind::kText, *note}
                           : pgoutput::TupleValue{pgoutput::ValueKind::kNull, ""});
  return t;
}

// Transaction n: Relation + insert into "users" (odd n) or "orders" (even n).
Transaction txn(std::uint32_t n) {
  Transaction t;
  t.header.begin_lsn = Lsn(n * 1000);
  t.header.commit_lsn = Lsn(n * 1000 + 500);
  t.header.end_lsn = Lsn(n * 1000 + 501);
  t.header.commit_time = 800000000000000 + n * 1000000ll;  // one second apart
  t.header.xid = 700 + n;
  auto rel = n % 2 ? relation(16384, "users") : relation(16390, "orders");
  t.changes.push_back(Change{t.header.begin_lsn, rel});
  t.changes.push_back(Change{t.header.begin_lsn + 10,
                             pgoutput::Insert{std::nullopt, rel.oid, row(std::to_string(n), n == 3 ? std::nullopt : std::optional<std::string>("héllo \"q\""))}});
  return t;
}

class LogCli : public ::testing::Test {
 protected:
  void SetUp() override {
    LogOptions o;
    o.dir = dir_.path() + "/log";
    o.sync = SyncPolicy::kNone;
    auto log = ChangeLog::open(o);
    ASSERT_TRUE(log.ok()) << log.error().to_string();
    for (std::uint32_t n = 1; n <= 6; ++n) {
      auto e = encode_transaction(txn(n));
      ASSERT_TRUE(e.ok()) << e.error().to_string();
      PendingEntry p = e->pending();
      ASSERT_TRUE((*log)->append(std::span<const PendingEntry>(&p, 1)).ok());
    }
    auto slots = SlotRegistry::open(o.dir);
    ASSERT_TRUE(slots.ok());
    Slot s;
    s.name = "consumer";
    s.plugin = "pgoutput";
    s.database = "app";
    s.confirmed_flush = Lsn(3 * 1000 + 501);
    ASSERT_TRUE((*slots)->create(s).ok());
  }
  testing::TempDir dir_;
};

TEST_F(LogCli, DumpPrintsEveryTransactionAsJsonLines) {
  CommandResult r = run_pgrelay("log dump --data-dir " + dir_.path(), dir_.path());
  ASSERT_EQ(r.status, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 6u * 4);  // begin, relation, insert, commit
  EXPECT_EQ(lines[0]["type"], "begin");
  EXPECT_EQ(lines[0]["xid"], 701);
  EXPECT_EQ(lines[0]["commit_lsn"], "0/5DC");
  EXPECT_EQ(lines[1]["type"], "relation");
  EXPECT_EQ(lines[1]["table"], "users");
  EXPECT_EQ(lines[2]["type"], "insert");
  EXPECT_EQ(lines[2]["schema"], "public");
  EXPECT_EQ(lines[2]["new"]["id"], "1");
  EXPECT_EQ(lines[2]["new"]["note"], "héllo \"q\"");
  EXPECT_EQ(lines[3]["type"], "commit");
  EXPECT_EQ(lines[3]["end_lsn"], "0/5DD");
  // NULL stays distinct from a string.
  EXPECT_TRUE(lines[2 * 4 + 2]["new"]["note"].is_null());
}

TEST_F(LogCli, DumpFromLsnFollowsTheRestartRule) {
  // 0/DAC = 3 * 1000 + 500, the commit LSN of transaction 3: included; one more: excluded.
  CommandResult r = run_pgrelay("log dump --data-dir " + dir_.path() + " --from 0/DAC", dir_.path());
  ASSERT_EQ(r.status, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front()["xid"], 703);
  r = run_pgrelay("log dump --data-dir " + dir_.path() + " --from 0/DAD", dir_.path());
  lines = lines_of(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front()["xid"], 704);
}

TEST_F(LogCli, DumpFiltersByTableAndTime) {
  CommandResult r = run_pgrelay("log dump --data-dir " + dir_.path() + " --table public.orders", dir_.path());
  ASSERT_EQ(r.status, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u * 4);
  for (const auto& l : lines) {
    if (l.contains("table")) {
      EXPECT_EQ(l["table"], "orders");
    }
  }
  // Transaction 5 commits 5 s after 800000000 s past 2000-01-01.
  std::string since = "2025-05-08T06:13:25Z";
  r = run_pgrelay("log dump --data-dir " + dir_.path() + " --since " + since, dir_.path());
  ASSERT_EQ(r.status, 0) << r.err;
  lines = lines_of(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front()["commit_time"], "2025-05-08T06:13:25.000000Z");
  // The same instant written with a zone offset.
  r = run_pgrelay("log dump --data-dir " + dir_.path() + " --since '2025-05-08 08:13:25+02'",
                  dir_.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines_of(r.out).front()["xid"], 705);
  EXPECT_EQ(lines.front()["xid"], 705);
}

TEST_F(LogCli, BadArgumentsGiveClearErrors) {
  CommandResult r = run_pgrelay("log dump --data-dir " + dir_.path() + " --from nonsense", dir_.path());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("invalid --from LSN"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT"), std::string::npos);
  r = run_pgrelay("log dump --data-dir " + dir_.path() + " --since yesterday", dir_.path());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("invalid --since"), std::string::npos) << r.err;
  r = run_pgrelay("log stat --data-dir " + dir_.path() + "/nowhere", dir_.path());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("no pgrelay change log"), std::string::npos) << r.err;
}

TEST_F(LogCli, StatReportsSegmentsAndSlotLag) {
  CommandResult r = run_pgrelay("log stat --json --data-dir " + dir_.path(), dir_.path());
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["oldest_lsn"], "0/5DC");
  EXPECT_EQ(j["newest_lsn"], "0/1964");
  ASSERT_EQ(j["slots"].size(), 1u);
  EXPECT_EQ(j["slots"][0]["slot_name"], "consumer");
  EXPECT_EQ(j["slots"][0]["confirmed_flush_lsn"], "0/DAD");
  EXPECT_EQ(j["slots"][0]["lag_bytes"], 6 * 1000 + 501 - (3 * 1000 + 501));
  EXPECT_EQ(j["slots"][0]["wal_status"], "reserved");
  r = run_pgrelay("log stat --data-dir " + dir_.path(), dir_.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("newest_lsn: 0/1964"), std::string::npos) << r.out;
}

void damage(const std::string& file, std::streamoff at) {
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(at);
  f.put('\x55');
}

TEST(LogCliDamage, DamagedSealedSegmentIsAnErrorNamingFileOffsetAndFix) {
  testing::TempDir dir;
  LogOptions o;
  o.dir = dir.path() + "/log";
  o.sync = SyncPolicy::kNone;
  o.segment_size = 4096;
  {
    auto log = ChangeLog::open(o);
    ASSERT_TRUE(log.ok());
    for (std::uint32_t n = 1; n <= 200; ++n) {
      auto e = encode_transaction(txn(n));
      ASSERT_TRUE(e.ok());
      PendingEntry p = e->pending();
      ASSERT_TRUE((*log)->append(std::span<const PendingEntry>(&p, 1)).ok());
    }
    ASSERT_GT((*log)->stats().segments, 3u);
  }
  std::string seg = o.dir + "/0000000000000002.seg";
  damage(seg, 200);
  CommandResult r = run_pgrelay("log dump --data-dir " + dir.path(), dir.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find(seg), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("offset"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT"), std::string::npos) << r.err;
  // Everything before the damage was printed.
  EXPECT_FALSE(r.out.empty());
}

TEST_F(LogCli, DamagedTailIsAWarningNamingFileAndOffset) {
  std::string seg = dir_.path() + "/log/0000000000000001.seg";
  damage(seg, 40);  // inside the first batch of the only (active) segment
  CommandResult r = run_pgrelay("log dump --data-dir " + dir_.path(), dir_.path());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(seg), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("offset 32"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

}  // namespace
}  // namespace pgrelay::log
