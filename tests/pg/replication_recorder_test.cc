// Tests of the pgoutput stream recorder against a real PostgreSQL 15: framing, end marker,
// keepalive replies, timeouts.
#include "replication_recorder.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "pg_server.h"

namespace pgrelay::test {
namespace {

using namespace std::chrono_literals;

class ReplicationRecorderTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { server_.reset(); }
  void SetUp() override {
    if (!server_) {
      PgServerOptions options;
      // The walsender asks for a reply every 100 ms and drops a client that stays silent for
      // 200 ms: a recorder that ignored keepalives would lose its stream.
      options.settings["wal_sender_timeout"] = "200ms";
      server_ = std::make_unique<PgServer>(options);
      server_->exec(
          "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR ALL TABLES");
    }
  }
  static std::unique_ptr<PgServer> server_;
};
std::unique_ptr<PgServer> ReplicationRecorderTest::server_;

const std::vector<std::pair<std::string, std::string>> kOptions = {
    {"proto_version", "1"}, {"publication_names", "p"}, {"messages", "true"}};

TEST_F(ReplicationRecorderTest, RecordsXLogDataUpToAndIncludingTheEndMarker) {
  ReplicationRecorder recorder(*server_, "postgres", "rec_basic");
  EXPECT_FALSE(recorder.consistent_point().empty());
  server_->exec("INSERT INTO t VALUES (1, 'one')");
  server_->exec(ReplicationRecorder::end_marker_sql("other"));  // a different marker: recorded
  server_->exec(ReplicationRecorder::end_marker_sql("basic"));
  server_->exec("INSERT INTO t VALUES (2, 'after the marker')");

  RecordedStream stream = recorder.record("basic", kOptions, "basic", 10s);
  EXPECT_EQ(stream.name, "basic");
  EXPECT_EQ(stream.option("proto_version"), "1");
  EXPECT_EQ(stream.option("binary", "false"), "false");
  std::string tags;
  for (std::size_t i = 0; i < stream.frames.size(); ++i) {
    const Bytes& frame = stream.frames[i];
    ASSERT_GT(frame.size(), kXLogDataHeaderSize);
    EXPECT_EQ(frame[0], 'w');
    ByteReader header(frame);
    header.u8();
    const std::uint64_t wal_start = header.u64();
    const std::uint64_t wal_end = header.u64();
    EXPECT_LE(wal_start, wal_end);
    EXPECT_EQ(stream.message(i).data(), frame.data() + kXLogDataHeaderSize);
    tags += static_cast<char>(stream.message(i)[0]);
  }
  // Begin, Relation, Insert, Commit, the "other" marker, then ours; nothing after it.
  EXPECT_EQ(tags, "BRICMM");
  const ByteView last = stream.message(stream.frames.size() - 1);
  const std::string text(last.begin(), last.end());
  EXPECT_NE(text.find(ReplicationRecorder::kEndMarkerPrefix), std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 5), "basic");
}

TEST_F(ReplicationRecorderTest, AnswersKeepalivesWhileWaiting) {
  ReplicationRecorder recorder(*server_, "postgres", "rec_keepalive");
  recorder.start("keepalive", kOptions);
  // Nothing arrives for 1 s (5 times wal_sender_timeout): the wait must end by our timeout,
  // not by the server dropping the connection.
  try {
    recorder.read_until([](ByteView) { return true; }, "anything", 1000ms);
    FAIL() << "expected a timeout";
  } catch (const PgError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out after 1000 ms waiting for anything"),
              std::string::npos)
        << e.what();
  }
  server_->exec(ReplicationRecorder::end_marker_sql("keepalive"));
  RecordedStream stream = recorder.finish("keepalive", 10s);
  ASSERT_EQ(stream.frames.size(), 1u);
  EXPECT_EQ(stream.message(0)[0], 'M');
}

TEST_F(ReplicationRecorderTest, ReportsServerErrors) {
  ReplicationRecorder recorder(*server_, "postgres", "rec_errors");
  try {
    recorder.start("bad", {{"proto_version", "99"}, {"publication_names", "p"}});
    recorder.finish("never", 5s);
    FAIL() << "expected an error";
  } catch (const PgError& e) {
    EXPECT_NE(std::string(e.what()).find("proto_version"), std::string::npos) << e.what();
  }
}

TEST_F(ReplicationRecorderTest, CreatesTwoPhaseSlots) {
  ReplicationRecorder recorder(*server_, "postgres", "rec_two_phase",
                               SlotOptions{.two_phase = true});
  EXPECT_EQ(server_->scalar(
                "SELECT two_phase FROM pg_replication_slots WHERE slot_name = 'rec_two_phase'"),
            "t");
  EXPECT_EQ(server_->scalar(
                "SELECT temporary FROM pg_replication_slots WHERE slot_name = 'rec_two_phase'"),
            "t");
}

}  // namespace
}  // namespace pgrelay::test
