// Trigger capture phase 2 against a real PostgreSQL 15: messages, wake-ups, service, DDL.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>
#include <random>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "capture/trigger/capture_service.h"
#include "capture/trigger/installer.h"
#include "capture/trigger/poller.h"
#include "capture/trigger/record_text.h"
#include "capture/trigger/text_array.h"
#include "capture/trigger/truncate_statement.h"
#include "log/change_log.h"
#include "log/change_view.h"
#include "log/transaction.h"
#include "pg_server.h"

namespace pgrelay::capture {
namespace {

namespace fs = std::filesystem;
using test::PgConnection;
using test::PgServer;
using Values = std::vector<std::optional<std::string>>;
using namespace std::chrono_literals;

Values texts(const pgoutput::Tuple& t) {
  Values out;
  for (const auto& c : t.columns) {
    if (c.kind == pgoutput::ValueKind::kNull) {
      out.emplace_back(std::nullopt);
    } else if (c.kind == pgoutput::ValueKind::kUnchanged) {
      out.emplace_back("<unchanged>");
    } else {
      out.emplace_back(c.bytes);
    }
  }
  return out;
}

TEST(RecordTextTest, SplitsRecordOutputExactly) {
  auto r = parse_record_text(R"((1,,"",abc,"a,b","say ""hi""","back\\slash"," lead",x))", 9);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(
      *r, (Fields{"1", std::nullopt, "", "abc", "a,b", "say \"hi\"", "back\\slash", " lead", "x"}));
  auto empty = parse_record_text("()", 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  auto one_null = parse_record_text("()", 1);
  ASSERT_TRUE(one_null.ok());
  EXPECT_EQ(*one_null, (Fields{std::nullopt}));
  auto trailing_null = parse_record_text("(1,)", 2);
  ASSERT_TRUE(trailing_null.ok());
  EXPECT_EQ(*trailing_null, (Fields{"1", std::nullopt}));
  for (const char* bad : {"", "(", "1,2", "(\"open)", "(a\\)"}) {
    auto b = parse_record_text(bad, 1);
    EXPECT_FALSE(b.ok()) << bad;
    if (!b.ok()) {
      EXPECT_EQ(b.error().sqlstate, "XX001");
    }
  }
}

// Random rows of every awkward kind come back field for field. Postgres's own record_out is
// checked against the parser by the capture tests; this one checks the rules both share.
TEST(RecordTextTest, RoundTripsRandomRows) {
  std::mt19937 rng(20261201);
  const std::string alphabet = "ab,\"\\() \n\txé";
  for (int n = 0; n < 20000; ++n) {
    Fields fields(1 + rng() % 6);
    for (auto& f : fields) {
      if (rng() % 5 == 0) continue;  // NULL
      std::string v(rng() % 12, ' ');
      for (auto& c : v) c = alphabet[rng() % alphabet.size()];
      f = v;
    }
    const std::string text = format_record_text(fields);
    auto parsed = parse_record_text(text, fields.size());
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.error().to_string();
    ASSERT_EQ(*parsed, fields) << text;
  }
}

TEST(TextArrayTest, SplitsArraySendOutputAndRefusesWhatIsNotOne) {
  const TextElements elements{"(1,abc)", std::nullopt, "", "(2,\"a b\")"};
  const std::string bytes = format_text_array(elements);
  auto parsed = parse_text_array(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
  EXPECT_EQ(*parsed, elements);
  auto empty = parse_text_array(format_text_array({}));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  // Every cut of a valid array is refused, as is a wrong element type, a second dimension, a
  // NULL without the null flag and a count larger than the bytes could hold.
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    auto b = parse_text_array(std::string_view(bytes).substr(0, cut));
    EXPECT_FALSE(b.ok()) << cut;
    if (!b.ok()) {
      EXPECT_EQ(b.error().sqlstate, "XX001");
    }
  }
  std::string int_array = bytes;
  int_array[11] = 23;  // int4
  std::string two_dims = bytes;
  two_dims[3] = 2;
  std::string no_null_flag = bytes;
  no_null_flag[7] = 0;
  std::string huge_count = bytes;
  huge_count[12] = 0x7f;
  for (const std::string& bad : {int_array, two_dims, no_null_flag, huge_count, bytes + "x"}) {
    EXPECT_FALSE(parse_text_array(bad).ok());
  }
}

TEST(TruncateStatementTest, ReadsOptionsOfTheMatchingStatement) {
  auto o = truncate_options("TRUNCATE a, b CASCADE", {"a"});
  EXPECT_TRUE(o.cascade);
  EXPECT_FALSE(o.restart_identity);
  o = truncate_options("truncate table only \"A\" restart identity;", {"A"});
  EXPECT_TRUE(o.restart_identity);
  EXPECT_FALSE(o.cascade);
  // The statement that names the table wins; comments and literals are not words.
  o = truncate_options(
      "SELECT 'cascade'; /* truncate x cascade */ TRUNCATE x; -- cascade\n"
      "TRUNCATE y RESTART IDENTITY CASCADE",
      {"x"});
  EXPECT_FALSE(o.cascade);
  EXPECT_FALSE(o.restart_identity);
  o = truncate_options("TRUNCATE x; TRUNCATE public.y RESTART IDENTITY CASCADE", {"y"});
  EXPECT_TRUE(o.cascade);
  EXPECT_TRUE(o.restart_identity);
  // Inside a function: the top-level query has no TRUNCATE.
  // Two statements naming the same table: the one that names exactly the truncated set.
  o = truncate_options("TRUNCATE s; TRUNCATE c, s RESTART IDENTITY", {"s"});
  EXPECT_FALSE(o.restart_identity);
  o = truncate_options("TRUNCATE s; TRUNCATE c, s RESTART IDENTITY", {"c", "s"});
  EXPECT_TRUE(o.restart_identity);
  o = truncate_options("SELECT do_truncate()", {"x"});
  EXPECT_FALSE(o.cascade);
  o = truncate_options("SELECT $$TRUNCATE x CASCADE$$", {"x"});
  EXPECT_FALSE(o.cascade);
}

class CaptureServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::PgServerOptions options;
    options.settings["wal_level"] = "replica";
    // NOTIFY wake-ups are only used where transactions cannot be prepared.
    options.settings["max_prepared_transactions"] = "0";
    server_ = new PgServer(options);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    char tmpl[] = "/tmp/pgrelay-capsvc-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    log::LogOptions o;
    o.dir = dir_ + "/log";
    o.sync = log::SyncPolicy::kNone;
    auto l = log::ChangeLog::open(o);
    ASSERT_TRUE(l.ok()) << l.error().message;
    log_ = std::move(*l);
    auto s = PgSession::connect(server_->conninfo());
    ASSERT_TRUE(s.ok()) << s.error().message;
    session_ = std::move(*s);
  }

  void TearDown() override {
    service_.reset();
    poller_.reset();
    log_.reset();
    if (session_) {
      auto st = uninstall(*session_, schema_);
      EXPECT_TRUE(st.ok()) << st.error().to_string();
    }
    for (const auto& t : tables_) server_->exec("DROP TABLE IF EXISTS " + t + " CASCADE");
    for (const auto& p : publications_) server_->exec("DROP PUBLICATION IF EXISTS " + p);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void create_table(const std::string& name, const std::string& definition) {
    server_->exec("CREATE TABLE " + name + " " + definition);
    tables_.push_back(name);
  }

  void install_tables(const std::vector<std::string>& names, DdlTracking ddl = DdlTracking::kAuto) {
    InstallOptions o;
    o.schema = schema_;
    o.ddl = ddl;
    for (const auto& n : names) o.tables.push_back({"public", n});
    auto r = install(*session_, o);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }

  void start_poller() {
    PollerOptions o;
    o.conninfo = server_->conninfo();
    o.schema = schema_;
    o.spill_dir = dir_ + "/spill";
    auto p = TriggerPoller::open(o, *log_);
    ASSERT_TRUE(p.ok()) << p.error().to_string();
    poller_ = std::move(*p);
  }

  PollStats poll() {
    auto r = poller_->poll();
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    return r.ok() ? *r : PollStats{};
  }

  CaptureServiceOptions service_options(DdlTracking ddl = DdlTracking::kAuto) {
    CaptureServiceOptions o;
    o.poller.conninfo = server_->conninfo();
    o.poller.spill_dir = dir_ + "/spill";
    o.install.schema = schema_;
    o.install.ddl = ddl;
    return o;
  }

  // Every entry (transactions and messages) in log order.
  std::vector<log::Transaction> read_log() {
    std::vector<log::Transaction> out;
    auto c = log_->open_cursor(Lsn(0));
    EXPECT_TRUE(c.ok());
    if (!c.ok()) return out;
    while (true) {
      auto e = (*c)->next_entry();
      EXPECT_TRUE(e.ok());
      if (!e.ok() || !e->has_value()) break;
      auto t = log::read_transaction(**c, **e);
      EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
      if (!t.ok()) break;
      out.push_back(std::move(*t));
    }
    return out;
  }

  // Data changes (and messages) of the whole log, each with the Relation in force for it.
  struct Seen {
    log::ChangeMessage message;
    std::optional<pgoutput::Relation> relation;
  };
  std::vector<Seen> changes() {
    std::vector<Seen> out;
    for (const auto& t : read_log()) {
      std::map<pgoutput::Oid, pgoutput::Relation> rels;
      for (const auto& c : t.changes) {
        if (auto* r = std::get_if<pgoutput::Relation>(&c.message)) {
          rels[r->oid] = *r;
          continue;
        }
        if (std::holds_alternative<pgoutput::Type>(c.message)) continue;
        if (auto* m = std::get_if<pgoutput::LogicalMessage>(&c.message);
            m != nullptr && m->prefix == log::kPublicationsChangedPrefix) {
          continue;  // for walsenders (see publication_filter_test), not a change
        }
        Seen s{c.message, std::nullopt};
        pgoutput::Oid oid = 0;
        if (auto* i = std::get_if<pgoutput::Insert>(&c.message)) oid = i->relation_oid;
        if (auto* u = std::get_if<pgoutput::Update>(&c.message)) oid = u->relation_oid;
        if (auto* d = std::get_if<pgoutput::Delete>(&c.message)) oid = d->relation_oid;
        if (oid != 0) {
          EXPECT_TRUE(rels.count(oid) != 0) << "change without a Relation before it";
          if (rels.count(oid) != 0) s.relation = rels[oid];
        }
        out.push_back(std::move(s));
      }
    }
    return out;
  }

  static std::vector<std::string> column_names(const pgoutput::Relation& r) {
    std::vector<std::string> out;
    for (const auto& c : r.columns) out.push_back(c.name);
    return out;
  }

  bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return done();
  }

  static PgServer* server_;
  std::string schema_ = "_pgrelay";
  std::string dir_;
  std::unique_ptr<log::ChangeLog> log_;
  std::unique_ptr<PgSession> session_;
  std::unique_ptr<TriggerPoller> poller_;
  std::unique_ptr<CaptureService> service_;
  std::vector<std::string> tables_;
  std::vector<std::string> publications_;
};

PgServer* CaptureServiceTest::server_ = nullptr;

TEST_F(CaptureServiceTest, MessagesKeepTheirTransactionOrStandAlone) {
  create_table("msg_t", "(id int PRIMARY KEY)");
  install_tables({"msg_t"});
  start_poller();
  // A writer with no privilege beyond its table calls emit_message (SECURITY DEFINER).
  server_->create_role("msg_writer", std::nullopt);
  server_->exec("GRANT INSERT ON msg_t TO msg_writer");
  PgConnection w(server_->conninfo("postgres", "msg_writer"));
  const std::string before = server_->scalar("SELECT pg_current_wal_insert_lsn()::text");
  w.exec(
      "BEGIN; INSERT INTO msg_t VALUES (1); "
      "SELECT _pgrelay.emit_message(true, 'app/1', '\\x00ff0a'::bytea); "
      "SELECT _pgrelay.emit_message(false, 'lag', 'now é'); COMMIT");
  const std::string returned = w.scalar("SELECT _pgrelay.emit_message(false, 'alone', 'x')::text");
  w.exec("BEGIN; SELECT _pgrelay.emit_message(true, 'only', ''); COMMIT");
  // Rolled back: the transactional and (documented limitation) the non-transactional one.
  w.exec(
      "BEGIN; SELECT _pgrelay.emit_message(true, 'gone', 'x'); "
      "SELECT _pgrelay.emit_message(false, 'gone2', 'x'); ROLLBACK");
  EXPECT_EQ(w.scalar("SELECT _pgrelay.emit_message(true, NULL, 'x') IS NULL"), "t");  // STRICT
  EXPECT_GE(Lsn::parse(returned).value(), Lsn::parse(before).value());

  PollStats st = poll();
  EXPECT_EQ(st.messages, 2u);
  EXPECT_EQ(st.transactions, 2u);
  auto log = read_log();
  ASSERT_EQ(log.size(), 4u);
  // The non-transactional message written inside the first transaction comes before it.
  EXPECT_EQ(log[0].kind, log::EntryKind::kMessage);
  ASSERT_EQ(log[0].changes.size(), 1u);
  auto m0 = std::get<pgoutput::LogicalMessage>(log[0].changes[0].message);
  EXPECT_FALSE(m0.transactional);
  EXPECT_EQ(m0.prefix, "lag");
  EXPECT_EQ(m0.content, "now \xc3\xa9");
  EXPECT_EQ(m0.lsn, log[0].header.commit_lsn);
  EXPECT_EQ(log[1].kind, log::EntryKind::kTransaction);
  std::vector<log::ChangeMessage> data;
  for (const auto& c : log[1].changes) {
    if (!std::holds_alternative<pgoutput::Relation>(c.message)) data.push_back(c.message);
  }
  ASSERT_EQ(data.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<pgoutput::Insert>(data[0]));
  auto m1 = std::get<pgoutput::LogicalMessage>(data[1]);
  EXPECT_TRUE(m1.transactional);
  EXPECT_EQ(m1.prefix, "app/1");
  EXPECT_EQ(m1.content, std::string("\x00\xff\n", 3));
  EXPECT_GT(m1.lsn, log[1].header.begin_lsn);
  EXPECT_LT(m1.lsn, log[1].header.commit_lsn);
  EXPECT_EQ(log[2].kind, log::EntryKind::kMessage);
  auto m2 = std::get<pgoutput::LogicalMessage>(log[2].changes[0].message);
  EXPECT_EQ(m2.prefix, "alone");
  // The stream position of a message is past the LSN emit_message returned.
  EXPECT_GT(log[2].header.commit_lsn, Lsn::parse(returned).value());
  EXPECT_EQ(log[3].kind, log::EntryKind::kTransaction);
  ASSERT_EQ(log[3].changes.size(), 1u);
  EXPECT_EQ(std::get<pgoutput::LogicalMessage>(log[3].changes[0].message).prefix, "only");
  EXPECT_EQ(server_->scalar("SELECT count(*) FROM _pgrelay.changes"), "0");
  server_->exec("DROP OWNED BY msg_writer; DROP ROLE msg_writer");
}

TEST_F(CaptureServiceTest, OneNotificationPerWritingTransaction) {
  create_table("note_t", "(id int PRIMARY KEY)");
  install_tables({"note_t"});
  PgConnection listener(server_->conninfo());
  listener.exec("LISTEN _pgrelay");
  // Raised by an idle capture service; no service runs here.
  server_->exec("UPDATE _pgrelay.wakeup SET armed = true");
  server_->exec(
      "BEGIN; INSERT INTO note_t SELECT generate_series(1, 200); UPDATE note_t SET id = id + 1000; "
      "SELECT _pgrelay.emit_message(true, 'p', 'c'); COMMIT");
  server_->exec("INSERT INTO note_t VALUES (1)");
  server_->exec("BEGIN; INSERT INTO note_t VALUES (2); ROLLBACK");
  std::this_thread::sleep_for(100ms);
  listener.exec("SELECT 1");  // reads what arrived
  int n = 0;
  while (PGnotify* note = PQnotifies(listener.raw())) {
    EXPECT_STREQ(note->relname, "_pgrelay");
    PQfreemem(note);
    ++n;
  }
  EXPECT_EQ(n, 2);
}

// After a poll that found work the service polls every min_poll for busy_grace before it backs
// off: at a steady rate of fewer commits than polls many polls find nothing, and doubling the
// wait after each of those made one wait in ten 500 us to 1 ms at 1000 tx/s.
TEST_F(CaptureServiceTest, PollsStayAtMinPollForTheGraceAfterAFind) {
  create_table("grace_t", "(id int PRIMARY KEY)");
  int next_id = 1;
  // The polls in the 500 ms after a poll that found a transaction.
  auto polls_after_a_find = [&](std::chrono::microseconds grace) -> std::uint64_t {
    auto o = service_options();
    o.install.tables.push_back({"public", "grace_t"});
    o.min_poll = 2ms;
    o.max_poll = 10s;
    o.busy_grace = grace;
    o.detect_interval = 60s;
    auto svc = CaptureService::start(o, *log_);
    EXPECT_TRUE(svc.ok()) << svc.error().to_string();
    if (!svc.ok()) return 0;
    std::this_thread::sleep_for(200ms);  // idle: backed off (and waiting on NOTIFY)
    const auto before = (*svc)->stats().transactions;
    server_->exec("INSERT INTO grace_t VALUES (" + std::to_string(next_id++) + ")");
    EXPECT_TRUE(wait_for([&] { return (*svc)->stats().transactions > before; }, 5s));
    const auto polls = (*svc)->stats().polls;
    std::this_thread::sleep_for(500ms);
    const auto after = (*svc)->stats().polls - polls;
    (*svc)->stop();
    return after;
  };
  // Every 2 ms plus the poll's own time (a few ms under sanitizers): about 70 on an idle
  // machine. 25 leaves room for a loaded CI machine and stays well above the backoff's 15.
  EXPECT_GE(polls_after_a_find(10s), 25u);
  // Without grace: 2, 4, 8, ... 256 ms apart, and one more as the NOTIFY flag goes up: 9.
  EXPECT_LE(polls_after_a_find(0us), 15u);
}

TEST_F(CaptureServiceTest, ServiceWakesOnNotifySyncsAndReconnects) {
  create_table("svc_t", "(id int PRIMARY KEY, v text)");
  auto o = service_options();
  o.install.tables.push_back({"public", "svc_t"});
  // A fallback poll far longer than the test waits: only the notification can wake it.
  o.min_poll = 20s;
  o.max_poll = 20s;
  o.detect_interval = 60s;
  o.reconnect_min = 50ms;
  o.reconnect_max = 200ms;
  auto svc = CaptureService::start(o, *log_);
  ASSERT_TRUE(svc.ok()) << svc.error().to_string();
  service_ = std::move(*svc);
  std::this_thread::sleep_for(300ms);  // the first poll has run; the thread sleeps for 20 s
  const auto t0 = std::chrono::steady_clock::now();
  server_->exec("INSERT INTO svc_t VALUES (1, 'a')");
  EXPECT_TRUE(wait_for([&] { return service_->stats().transactions >= 1; }, 5s));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, 5s);

  // sync() on a log with nothing new: the upstream's WAL position (not an old or empty log
  // head), so that a slot created there compares correctly with upstream LSNs.
  auto wal_before = Lsn::parse(*server_->exec("SELECT pg_current_wal_insert_lsn()")[0][0]);
  ASSERT_TRUE(wal_before.has_value());
  auto idle = service_->sync();
  ASSERT_TRUE(idle.ok()) << idle.error().to_string();
  EXPECT_GE(*idle, *wal_before);

  // sync(): everything committed before the call is in the log when it returns.
  server_->exec("INSERT INTO svc_t VALUES (2, 'b')");
  server_->exec("INSERT INTO svc_t VALUES (3, 'c')");
  auto last = service_->sync();
  ASSERT_TRUE(last.ok()) << last.error().to_string();
  EXPECT_EQ(read_log().size(), 3u);
  EXPECT_GE(*last, log_->last_commit_lsn());

  // The upstream drops every capture connection: the service reconnects and loses nothing.
  const auto reconnects = service_->stats().reconnects;
  server_->exec(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
      "AND backend_type = 'client backend' AND datname = 'postgres'");
  auto fresh = PgSession::connect(server_->conninfo());
  ASSERT_TRUE(fresh.ok());
  session_ = std::move(*fresh);
  server_->exec("INSERT INTO svc_t VALUES (4, 'd')");
  EXPECT_TRUE(wait_for([&] { return service_->stats().reconnects > reconnects; }, 10s));
  server_->exec("INSERT INTO svc_t VALUES (5, 'e')");
  last = service_->sync();
  ASSERT_TRUE(last.ok()) << last.error().to_string();
  std::vector<std::string> ids;
  for (const auto& s : changes()) {
    ids.push_back(*texts(std::get<pgoutput::Insert>(s.message).new_tuple)[0]);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"1", "2", "3", "4", "5"}));
  auto stats = service_->stats();
  EXPECT_EQ(stats.transactions, 5u);
  EXPECT_TRUE(stats.last_lsn.is_valid());
  EXPECT_LE(stats.last_lsn, *last);
  service_->stop();
  service_->stop();  // idempotent
  EXPECT_FALSE(service_->sync().ok());
}

TEST(CaptureServicePreparedTest, WherePrepareIsPossibleTriggersNeverNotify) {
  PgServer server;  // max_prepared_transactions = 10
  server.exec("CREATE TABLE p2 (id int PRIMARY KEY)");
  char tmpl[] = "/tmp/pgrelay-capture-2pc-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  log::LogOptions log_options;
  log_options.dir = dir + "/log";
  log_options.sync = log::SyncPolicy::kNone;
  auto log = log::ChangeLog::open(log_options);
  ASSERT_TRUE(log.ok());
  CaptureServiceOptions o;
  o.poller.conninfo = server.conninfo();
  o.poller.spill_dir = dir;
  o.install.tables.push_back({"public", "p2"});
  o.min_poll = 10ms;
  o.max_poll = 2s;
  auto svc = CaptureService::start(o, **log);
  ASSERT_TRUE(svc.ok()) << svc.error().to_string();
  std::this_thread::sleep_for(500ms);  // idle long enough that it would have armed NOTIFY
  EXPECT_EQ(server.scalar("SELECT armed FROM _pgrelay.wakeup"), "f");
  // A prepared transaction on a captured table works, and is captured once committed.
  PgConnection a(server.conninfo());
  a.exec("BEGIN; INSERT INTO p2 VALUES (1); PREPARE TRANSACTION 'p2_gid'");
  a.exec("COMMIT PREPARED 'p2_gid'");
  auto synced = (*svc)->sync();
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  EXPECT_EQ((*svc)->stats().transactions, 1u);
  (*svc)->stop();
  std::filesystem::remove_all(dir);
}

// Restarts the server the way an operator would (pg_ctl restart -m fast).
void restart(const PgServer& server) {
  const std::string pg_ctl = "/usr/lib/postgresql/15/bin/pg_ctl -D " + server.data_dir() +
                             " -m fast -w -t 60 restart > /dev/null 2>&1";
  const std::string cmd = getuid() == 0 ? "runuser -u postgres -- " + pg_ctl : pg_ctl;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(CaptureServiceRestartTest, UpstreamRestartIsSurvivedWithNothingLost) {
  PgServer server;
  server.exec("CREATE TABLE rst (id int PRIMARY KEY)");
  char tmpl[] = "/tmp/pgrelay-restart-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  log::LogOptions lo;
  lo.dir = dir + "/log";
  auto log = log::ChangeLog::open(lo);
  ASSERT_TRUE(log.ok());
  CaptureServiceOptions o;
  o.poller.conninfo = server.conninfo();
  o.poller.spill_dir = dir + "/spill";
  o.install.tables.push_back({"public", "rst"});
  o.reconnect_min = 50ms;
  o.reconnect_max = 400ms;
  auto svc = CaptureService::start(o, **log);
  ASSERT_TRUE(svc.ok()) << svc.error().to_string();
  {
    PgConnection w(server.conninfo());
    w.exec("INSERT INTO rst VALUES (1)");
    // Committed, not yet captured when the server goes down.
    w.exec("BEGIN; INSERT INTO rst VALUES (2); COMMIT");
  }
  restart(server);
  {
    PgConnection w(server.conninfo());
    w.exec("INSERT INTO rst VALUES (3)");
  }
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  Result<Lsn> last = (*svc)->sync();
  while (!last.ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    last = (*svc)->sync();
  }
  ASSERT_TRUE(last.ok()) << last.error().to_string();
  EXPECT_GE((*svc)->stats().reconnects, 1u);
  (*svc)->stop();
  std::vector<std::string> ids;
  auto c = (*log)->open_cursor(Lsn(0));
  ASSERT_TRUE(c.ok());
  while (true) {
    auto e = (*c)->next_entry();
    ASSERT_TRUE(e.ok());
    if (!e->has_value()) break;
    auto t = log::read_transaction(**c, **e);
    ASSERT_TRUE(t.ok());
    for (const auto& ch : t->changes) {
      if (auto* i = std::get_if<pgoutput::Insert>(&ch.message)) {
        ids.push_back(*texts(i->new_tuple)[0]);
      }
    }
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"1", "2", "3"}));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_F(CaptureServiceTest, ExportedSnapshotSplitsTransactionsAtTheConsistentPoint) {
  create_table("exp_t", "(id int PRIMARY KEY)");
  auto o = service_options();
  o.install.tables.push_back({"public", "exp_t"});
  o.min_poll = 5s;
  o.max_poll = 5s;
  auto svc = CaptureService::start(o, *log_);
  ASSERT_TRUE(svc.ok()) << svc.error().to_string();
  service_ = std::move(*svc);
  PgConnection late(server_->conninfo());
  late.exec("BEGIN; INSERT INTO exp_t VALUES (1)");  // takes its xid before the export
  server_->exec("INSERT INTO exp_t VALUES (2)");
  auto exported = service_->export_snapshot();
  ASSERT_TRUE(exported.ok()) << exported.error().to_string();
  late.exec("COMMIT");
  server_->exec("INSERT INTO exp_t VALUES (3)");
  ASSERT_TRUE(service_->sync().ok());

  // A client importing the snapshot sees exactly what the log holds before the point.
  PgConnection importer(server_->conninfo());
  importer.exec("BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT " +
                test::sql_literal(exported->snapshot_name));
  EXPECT_EQ(importer.scalar("SELECT string_agg(id::text, ',' ORDER BY id) FROM exp_t"), "2");
  importer.exec("COMMIT");
  std::vector<std::pair<std::string, Lsn>> seen;
  for (const auto& t : read_log()) {
    for (const auto& c : t.changes) {
      if (auto* i = std::get_if<pgoutput::Insert>(&c.message)) {
        seen.push_back({*texts(i->new_tuple)[0], t.header.commit_lsn});
      }
    }
  }
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].first, "2");
  EXPECT_LT(seen[0].second, exported->consistent_point);
  for (std::size_t i = 1; i < seen.size(); ++i) {
    EXPECT_NE(seen[i].first, "2");
    EXPECT_GT(seen[i].second, exported->consistent_point);
  }
}

TEST_F(CaptureServiceTest, AlterTableWithEventTriggerIsExact) {
  create_table("ddl_t", "(id int PRIMARY KEY, a text, b int)");
  install_tables({"ddl_t"});
  start_poller();
  EXPECT_EQ(server_->scalar("SELECT count(*) FROM pg_event_trigger WHERE evtname = '_pgrelay_ddl'"),
            "1");
  server_->exec("INSERT INTO ddl_t VALUES (1, 'x', 10)");
  server_->exec("ALTER TABLE ddl_t ADD COLUMN c numeric DEFAULT 1.50");
  server_->exec("INSERT INTO ddl_t VALUES (2, 'y', 20, 2.5)");
  server_->exec("ALTER TABLE ddl_t RENAME COLUMN a TO a2");
  server_->exec("UPDATE ddl_t SET a2 = 'z' WHERE id = 1");
  // In one transaction: a change before and after the ALTER.
  server_->exec(
      "BEGIN; INSERT INTO ddl_t VALUES (3, 'w', 30, 3); ALTER TABLE ddl_t DROP COLUMN b; "
      "INSERT INTO ddl_t VALUES (4, 'v', 4); ALTER TABLE ddl_t ALTER COLUMN c TYPE text; "
      "INSERT INTO ddl_t VALUES (5, 'u', 'five'); COMMIT");
  server_->exec("ALTER TABLE ddl_t RENAME TO ddl_t2");
  tables_.push_back("ddl_t2");
  server_->exec("DELETE FROM ddl_t2 WHERE id = 5");
  poll();  // one poll after all of it: each row still decodes with its own layout
  auto seen = changes();
  ASSERT_EQ(seen.size(), 7u);
  using Names = std::vector<std::string>;
  EXPECT_EQ(column_names(*seen[0].relation), (Names{"id", "a", "b"}));
  EXPECT_EQ(texts(std::get<pgoutput::Insert>(seen[0].message).new_tuple), (Values{"1", "x", "10"}));
  EXPECT_EQ(column_names(*seen[1].relation), (Names{"id", "a", "b", "c"}));
  EXPECT_EQ(texts(std::get<pgoutput::Insert>(seen[1].message).new_tuple),
            (Values{"2", "y", "20", "2.5"}));
  EXPECT_EQ(column_names(*seen[2].relation), (Names{"id", "a2", "b", "c"}));
  EXPECT_EQ(texts(std::get<pgoutput::Update>(seen[2].message).new_tuple),
            (Values{"1", "z", "10", "1.50"}));
  EXPECT_EQ(column_names(*seen[3].relation), (Names{"id", "a2", "b", "c"}));
  EXPECT_EQ(column_names(*seen[4].relation), (Names{"id", "a2", "c"}));
  EXPECT_EQ(seen[4].relation->columns[2].type_oid, 1700u);
  EXPECT_EQ(texts(std::get<pgoutput::Insert>(seen[4].message).new_tuple), (Values{"4", "v", "4"}));
  EXPECT_EQ(seen[5].relation->columns[2].type_oid, 25u);
  EXPECT_EQ(texts(std::get<pgoutput::Insert>(seen[5].message).new_tuple),
            (Values{"5", "u", "five"}));
  EXPECT_EQ(seen[6].relation->name, "ddl_t2");
  EXPECT_EQ(texts(std::get<pgoutput::Delete>(seen[6].message).old.tuple),
            (Values{"5", std::nullopt, std::nullopt}));
}

TEST_F(CaptureServiceTest, NewTableOfAPublicationIsCapturedWithoutRestart) {
  server_->exec("CREATE SCHEMA pubs; CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA pubs");
  publications_.push_back("pub_schema");
  create_table("pubs.first", "(id int PRIMARY KEY)");
  InstallOptions o;
  o.publications.push_back("pub_schema");
  auto r = install(*session_, o);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->event_trigger);
  EXPECT_EQ(r->captured_tables, 1);
  start_poller();
  // The event trigger installs the capture inside the CREATE TABLE's transaction.
  server_->exec(
      "BEGIN; CREATE TABLE pubs.second (id int PRIMARY KEY, v text); "
      "INSERT INTO pubs.second VALUES (1, 'same transaction'); COMMIT");
  tables_.push_back("pubs.second");
  // Partitioned tables are skipped, not an error for the writer's DDL.
  server_->exec("CREATE TABLE pubs.parted (id int) PARTITION BY RANGE (id)");
  tables_.push_back("pubs.parted");
  server_->exec("INSERT INTO pubs.first VALUES (1)");
  poll();
  auto seen = changes();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].relation->name, "second");
  EXPECT_EQ(seen[1].relation->name, "first");
  server_->exec("DROP SCHEMA pubs CASCADE");
}

TEST_F(CaptureServiceTest, AllPublicationsModeFollowsPublicationsCreatedLater) {
  InstallOptions o;
  o.all_publications = true;
  auto r = install(*session_, o);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->captured_tables, 0);
  start_poller();
  // What zero-cache does after connecting: a publication over a schema, tables in it, writes.
  server_->exec(
      "BEGIN; CREATE SCHEMA later; CREATE TABLE later.t (id int PRIMARY KEY, v text); "
      "CREATE PUBLICATION pub_later FOR TABLES IN SCHEMA later; "
      "INSERT INTO later.t VALUES (1, 'captured'); COMMIT");
  publications_.push_back("pub_later");
  tables_.push_back("later.t");
  // A FOR ALL TABLES publication must not make pgrelay's own tables unwritable (they have no
  // business being published, and DELETE on a published table needs a replica identity).
  server_->exec("CREATE PUBLICATION pub_everything FOR ALL TABLES");
  publications_.push_back("pub_everything");
  server_->exec("INSERT INTO later.t VALUES (2, 'also captured')");
  poll();
  poll();
  auto seen = changes();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].relation->name, "t");
  EXPECT_EQ(std::get<pgoutput::Insert>(seen[1].message).new_tuple.columns[1].bytes,
            "also captured");
  auto reinstalled = install(*session_, o);  // rewrites the sources: DELETE must work
  EXPECT_TRUE(reinstalled.ok()) << reinstalled.error().to_string();
  server_->exec("DROP PUBLICATION pub_everything; DROP SCHEMA later CASCADE");
}

TEST_F(CaptureServiceTest, WithoutEventTriggerDdlIsFollowedByPolling) {
  server_->exec("CREATE SCHEMA pubp; CREATE PUBLICATION pub_poll FOR TABLES IN SCHEMA pubp");
  publications_.push_back("pub_poll");
  create_table("pubp.t", "(id int PRIMARY KEY, a text)");
  auto o = service_options(DdlTracking::kPolling);
  o.install.publications.push_back("pub_poll");
  o.min_poll = 10ms;
  o.max_poll = 50ms;
  o.detect_interval = 100ms;
  auto svc = CaptureService::start(o, *log_);
  ASSERT_TRUE(svc.ok()) << svc.error().to_string();
  service_ = std::move(*svc);
  EXPECT_EQ(server_->scalar("SELECT count(*) FROM pg_event_trigger"), "0");
  // The detector syncs once, then only when the catalogs change (rows are not catalogs).
  ASSERT_TRUE(wait_for([&] { return service_->stats().catalog_syncs >= 1; }, 5s));
  const std::uint64_t syncs = service_->stats().catalog_syncs;
  server_->exec("INSERT INTO pubp.t VALUES (1, 'x')");
  std::this_thread::sleep_for(500ms);  // five detect intervals
  EXPECT_EQ(service_->stats().catalog_syncs, syncs);
  ASSERT_TRUE(service_->sync().ok());
  // ALTERs the service has not synced yet: rows carry the old layout version but are decoded
  // with the layout they fit. No writer statement fails.
  server_->exec(
      "BEGIN; ALTER TABLE pubp.t ADD COLUMN b int; INSERT INTO pubp.t VALUES (2, 'y', 20); "
      "COMMIT");
  auto synced = service_->sync();
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  server_->exec("ALTER TABLE pubp.t DROP COLUMN a; INSERT INTO pubp.t VALUES (3, 30)");
  synced = service_->sync();
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  EXPECT_EQ(service_->stats().last_error, "");
  // A new table in the publication: captured once the service has noticed it.
  server_->exec("CREATE TABLE pubp.n (id int PRIMARY KEY)");
  tables_.push_back("pubp.n");
  EXPECT_TRUE(wait_for(
      [&] {
        return server_->scalar(
                   "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pubp.n'::regclass") != "0";
      },
      5s));
  EXPECT_GT(service_->stats().catalog_syncs, syncs);
  server_->exec("INSERT INTO pubp.n VALUES (7)");
  ASSERT_TRUE(service_->sync().ok());
  auto seen = changes();
  ASSERT_EQ(seen.size(), 4u);
  using Names = std::vector<std::string>;
  EXPECT_EQ(column_names(*seen[0].relation), (Names{"id", "a"}));
  EXPECT_EQ(column_names(*seen[1].relation), (Names{"id", "a", "b"}));
  EXPECT_EQ(texts(std::get<pgoutput::Insert>(seen[1].message).new_tuple), (Values{"2", "y", "20"}));
  EXPECT_EQ(column_names(*seen[2].relation), (Names{"id", "b"}));
  EXPECT_EQ(texts(std::get<pgoutput::Insert>(seen[2].message).new_tuple), (Values{"3", "30"}));
  EXPECT_EQ(seen[3].relation->name, "n");
  EXPECT_EQ(service_->stats().last_error, "");
  // The documented gap: a layout that existed only between two syncs is gone. Its row is left
  // out and reported; capture goes on.
  server_->exec(
      "BEGIN; ALTER TABLE pubp.t ADD COLUMN c int; INSERT INTO pubp.t VALUES (4, 40, 400); "
      "ALTER TABLE pubp.t DROP COLUMN c; COMMIT");
  server_->exec("INSERT INTO pubp.t VALUES (5, 50)");
  ASSERT_TRUE(service_->sync().ok());
  EXPECT_NE(service_->stats().last_error.find("fit no recorded column layout"), std::string::npos);
  seen = changes();
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(texts(std::get<pgoutput::Insert>(seen[4].message).new_tuple), (Values{"5", "50"}));
  service_.reset();
  server_->exec("DROP SCHEMA pubp CASCADE");
}

}  // namespace
}  // namespace pgrelay::capture
