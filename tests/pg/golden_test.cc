// Records real PostgreSQL 15 pgoutput streams that cover every message type, checks them and
// (with PGRELAY_GOLDEN_DIR set) writes each message out as a fuzz seed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "base/bytes.h"
#include "pg_server.h"
#include "pgoutput/decoder.h"
#include "pgoutput/encoder.h"
#include "replication_recorder.h"
#include "wire/replication_frames.h"

namespace pgrelay::test {
namespace {

namespace fs = std::filesystem;
using Options = std::vector<std::pair<std::string, std::string>>;

// ---------------------------------------------------------------------------------------------
// The per-message check every recorded stream goes through.
//
// For each recorded XLogData payload: the frame parses and re-encodes byte for byte, the
// pgoutput message decodes with the options the stream was recorded with, and encoding the
// decoded message gives back exactly the bytes Postgres sent.
// ---------------------------------------------------------------------------------------------
void check_stream(const RecordedStream& stream) {
  ASSERT_FALSE(stream.frames.empty()) << stream.name;
  pgoutput::DecoderOptions options;
  options.protocol_version = std::stoi(stream.option("proto_version", "1"));
  pgoutput::Decoder decoder(options);
  for (std::size_t i = 0; i < stream.frames.size(); ++i) {
    const Bytes& frame = stream.frames[i];
    ASSERT_GT(frame.size(), kXLogDataHeaderSize) << stream.name << " #" << i;
    ASSERT_EQ(frame[0], 'w') << stream.name << " #" << i;
    const ByteView original = stream.message(i);

    Result<wire::ServerReplicationFrame> parsed = wire::parse_from_server(frame);
    ASSERT_TRUE(parsed.ok()) << stream.name << " #" << i << ": " << parsed.error().to_string();
    const auto* xlog = std::get_if<wire::XLogData>(&*parsed);
    ASSERT_NE(xlog, nullptr) << stream.name << " #" << i;
    EXPECT_EQ(xlog->data, Bytes(original.begin(), original.end())) << stream.name << " #" << i;
    EXPECT_EQ(wire::encode(*xlog), frame) << stream.name << " #" << i;

    Result<pgoutput::Message> decoded = decoder.decode(original);
    ASSERT_TRUE(decoded.ok()) << stream.name << " #" << i << " tag '"
                              << static_cast<char>(original[0])
                              << "': " << decoded.error().to_string();
    const Bytes reencoded = pgoutput::encode(*decoded);
    ASSERT_EQ(reencoded, Bytes(original.begin(), original.end()))
        << stream.name << " #" << i << ": " << pgoutput::describe(*decoded);
    EXPECT_EQ(pgoutput::encoded_size(*decoded), original.size()) << stream.name << " #" << i;
  }
  EXPECT_FALSE(decoder.in_stream()) << stream.name << " ends inside a stream block";
}

// ---------------------------------------------------------------------------------------------
// A byte-level summary of a stream, written against proto.c's layouts independently of the
// decoder, so the expectations below do not depend on the code under test.
// ---------------------------------------------------------------------------------------------
struct StreamSummary {
  std::set<char> tags;
  std::set<char> tags_in_stream;      // tags seen between Stream Start and Stream Stop
  std::set<char> tuple_kinds;         // 'n', 'u', 't', 'b'
  std::set<char> old_tuple_kinds;     // 'K' or 'O' before an Update's new tuple or in a Delete
  std::set<char> replica_identities;  // relreplident of every Relation message
  std::set<std::uint8_t> truncate_options;
  std::map<std::uint32_t, int> relation_sends;  // relation oid -> Relation messages
  std::set<std::string> type_names;
  std::set<std::string> origins;
  std::set<bool> message_transactional;  // for messages with prefix "golden"
  std::set<bool> stream_first_segment;
  bool stream_abort_of_subxact = false;
  bool stream_abort_of_toplevel = false;
  std::vector<std::string> problems;
};

class Summarizer {
 public:
  explicit Summarizer(StreamSummary& out) : s_(out) {}

  void message(ByteView m, std::size_t index) {
    ByteReader r(m);
    const char tag = static_cast<char>(r.u8());
    s_.tags.insert(tag);
    if (in_stream_) s_.tags_in_stream.insert(tag);
    auto xid = [&] {
      if (in_stream_) r.u32();
    };
    switch (tag) {
      case 'B':
        r.u64(), r.i64(), r.u32();
        break;
      case 'C':
        r.u8(), r.u64(), r.u64(), r.i64();
        break;
      case 'O':
        r.u64();
        s_.origins.insert(r.cstr());
        break;
      case 'R': {
        xid();
        const std::uint32_t oid = r.u32();
        r.cstr(), r.cstr();
        s_.replica_identities.insert(static_cast<char>(r.u8()));
        const std::uint16_t natts = r.u16();
        for (std::uint16_t i = 0; i < natts && r.ok(); ++i) r.u8(), r.cstr(), r.u32(), r.i32();
        ++s_.relation_sends[oid];
        break;
      }
      case 'Y':
        xid();
        r.u32(), r.cstr();
        s_.type_names.insert(r.cstr());
        break;
      case 'I':
        xid();
        r.u32();
        expect(r, 'N', index);
        tuple(r);
        break;
      case 'U': {
        xid();
        r.u32();
        const char kind = static_cast<char>(r.u8());
        if (kind == 'K' || kind == 'O') {
          s_.old_tuple_kinds.insert(kind);
          tuple(r);
          expect(r, 'N', index);
        } else if (kind != 'N') {
          problem(index, "bad Update tuple marker");
        }
        tuple(r);
        break;
      }
      case 'D': {
        xid();
        r.u32();
        const char kind = static_cast<char>(r.u8());
        if (kind != 'K' && kind != 'O') problem(index, "bad Delete tuple marker");
        s_.old_tuple_kinds.insert(kind);
        tuple(r);
        break;
      }
      case 'T': {
        xid();
        const std::uint32_t n = r.u32();
        s_.truncate_options.insert(r.u8());
        for (std::uint32_t i = 0; i < n && r.ok(); ++i) r.u32();
        break;
      }
      case 'M': {
        xid();
        const std::uint8_t flags = r.u8();
        r.u64();
        const std::string prefix = r.cstr();
        r.bytes(r.u32());
        if (prefix == "golden") s_.message_transactional.insert(flags == 1);
        break;
      }
      case 'S':
        if (in_stream_) problem(index, "nested Stream Start");
        r.u32();
        s_.stream_first_segment.insert(r.u8() == 1);
        in_stream_ = true;
        break;
      case 'E':
        if (!in_stream_) problem(index, "Stream Stop outside a stream");
        in_stream_ = false;
        break;
      case 'c':
        r.u32(), r.u8(), r.u64(), r.u64(), r.i64();
        break;
      case 'A': {
        const std::uint32_t x = r.u32();
        const std::uint32_t sub = r.u32();
        (x == sub ? s_.stream_abort_of_toplevel : s_.stream_abort_of_subxact) = true;
        break;
      }
      case 'b':
        r.u64(), r.u64(), r.i64(), r.u32(), r.cstr();
        break;
      case 'P':
      case 'K':
      case 'p':
        r.u8(), r.u64(), r.u64(), r.i64(), r.u32(), r.cstr();
        break;
      case 'r':
        r.u8(), r.u64(), r.u64(), r.i64(), r.i64(), r.u32(), r.cstr();
        break;
      default:
        problem(index, std::string("unknown tag '") + tag + "'");
        return;
    }
    if (!r.ok()) problem(index, std::string("truncated '") + tag + "' message");
    if (r.ok() && !r.at_end()) problem(index, std::string("trailing bytes after '") + tag + "'");
  }

 private:
  void tuple(ByteReader& r) {
    const std::uint16_t ncols = r.u16();
    for (std::uint16_t i = 0; i < ncols && r.ok(); ++i) {
      const char kind = static_cast<char>(r.u8());
      s_.tuple_kinds.insert(kind);
      if (kind == 't' || kind == 'b') r.bytes(r.u32());
    }
  }
  void expect(ByteReader& r, char want, std::size_t index) {
    if (static_cast<char>(r.u8()) != want) problem(index, std::string("expected '") + want + "'");
  }
  void problem(std::size_t index, const std::string& what) {
    s_.problems.push_back("#" + std::to_string(index) + ": " + what);
  }

  StreamSummary& s_;
  bool in_stream_ = false;
};

StreamSummary summarize(const RecordedStream& stream) {
  StreamSummary summary;
  Summarizer summarizer(summary);
  for (std::size_t i = 0; i < stream.frames.size(); ++i) summarizer.message(stream.message(i), i);
  return summary;
}

std::string tags_string(const std::set<char>& tags) {
  return std::string(tags.begin(), tags.end());
}

#define EXPECT_HAS(set, value)         \
  EXPECT_TRUE((set).count(value) == 1) \
      << #set " lacks '" << (value) << "'; has: " << tags_string(set)

// Fuzz seeds: pgoutput messages for the decoder fuzzer, whole CopyData payloads for the
// replication frame fuzzer.
void write_fuzz_seeds(const RecordedStream& stream) {
  const char* dir = std::getenv("PGRELAY_GOLDEN_DIR");
  if (dir == nullptr || *dir == '\0') return;
  const fs::path messages = fs::path(dir) / "fuzz_pgoutput_decoder";
  const fs::path frames = fs::path(dir) / "fuzz_replication_frames";
  fs::create_directories(messages);
  fs::create_directories(frames);
  auto write = [](const fs::path& path, ByteView bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    ASSERT_TRUE(out.good()) << "cannot write " << path;
  };
  for (std::size_t i = 0; i < stream.frames.size(); ++i) {
    char index[24];
    std::snprintf(index, sizeof index, "%04zu", i);
    const std::string name = stream.name + "-" + index;
    write(messages / name, stream.message(i));
    write(frames / name, stream.frames[i]);
  }
}

// ---------------------------------------------------------------------------------------------
// Workloads.
// ---------------------------------------------------------------------------------------------

// Each stream gets its own database (slots and publications are per database) and slot.
constexpr const char* kSchemaAllTypes = R"sql(
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE pair AS (a int, b text);
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE TABLE all_types (
  id int PRIMARY KEY,
  c_int2 int2, c_int4 int4, c_int8 int8, c_numeric numeric, c_numeric_fixed numeric(40, 10),
  c_float4 float4, c_float8 float8,
  c_text text, c_varchar varchar(20), c_char char(4), c_bytea bytea, c_bool bool,
  c_date date, c_time time, c_timetz timetz, c_ts timestamp, c_tstz timestamptz, c_interval interval,
  c_uuid uuid, c_json json, c_jsonb jsonb, c_int_arr int[], c_text_arr text[],
  c_inet inet, c_cidr cidr, c_macaddr macaddr,
  c_mood mood, c_mood_arr mood[], c_pair pair, c_int4range int4range, c_floatrange floatrange,
  c_posint posint, c_oid oid, c_bit bit varying(16), c_point point, c_tsvector tsvector, c_money money
);
CREATE TABLE ri_full (id int, v text, n numeric);
ALTER TABLE ri_full REPLICA IDENTITY FULL;
CREATE TABLE ri_index (id int NOT NULL, code text NOT NULL, v text);
CREATE UNIQUE INDEX ri_index_code ON ri_index (code);
ALTER TABLE ri_index REPLICA IDENTITY USING INDEX ri_index_code;
CREATE TABLE ri_nothing (id int, v text);
ALTER TABLE ri_nothing REPLICA IDENTITY NOTHING;
CREATE TABLE toasty (id int PRIMARY KEY, big text, small text);
ALTER TABLE toasty ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE evolving (id int PRIMARY KEY);
CREATE TABLE parent_t (id serial PRIMARY KEY);
CREATE TABLE child_t (id serial PRIMARY KEY, parent_id int REFERENCES parent_t);
CREATE TABLE other_t (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text);
CREATE PUBLICATION golden FOR ALL TABLES;
)sql";

constexpr const char* kInsertAllTypes = R"sql(
INSERT INTO all_types VALUES (
  1, 32767, 2147483647, 9007199254740993,
  '12345678901234567890123456789012345678.123456789012345678901234567890123', 123456789.0123456789,
  'NaN', 'Infinity',
  E'h\u00e9llo w\u00f6rld \u2713 \u65e5\u672c\u8a9e \U0001F418 tab\there\nnewline \\ backslash',
  'varchar', 'ab', '\x00ff10', true,
  '2024-02-29', '23:59:59.999999', '12:34:56+05:30', '2024-02-29 12:34:56.789012',
  '2024-02-29 12:34:56.789012+05:30', '1 year 2 mons 3 days 04:05:06.789',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2, {"b": null}], "e": "\u00e9"}',
  '{"k": "v", "n": 1.5, "arr": [true, false]}', '{1,2,NULL,-4}',
  ARRAY['a', 'with "quote"', NULL, 'NULL', 'comma,here', '', 'back\slash', '{brace}'],
  '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
  'happy', '{sad,ok}', ROW(7, 'seven'), '[1,10)', '[1.5,2.5]',
  42, 4294967295, B'1010', '(1.5,-2.25)', 'a fat cat sat', '$1,234.56'
);
INSERT INTO all_types (id) VALUES (2);
INSERT INTO all_types VALUES (
  3, -32768, -2147483648, -9223372036854775808, '-0.000000000000000000001', -1, '-Infinity',
  '-1.7976931348623157e308', '', '', '', '\x', false, '4713-01-01 BC', '00:00', '00:00-12',
  'infinity', '-infinity', '-178000000 years', '00000000-0000-0000-0000-000000000000', 'null',
  '[]', '{{1,2},{3,4}}', '{}', '::1', '::/0', 'ff:ff:ff:ff:ff:ff', 'sad', '{}', ROW(NULL, NULL),
  'empty', '(,0]', 1, 0, B'', '(0,0)', '', '-$0.01'
);
)sql";

// The workload for the protocol 1 streams (text and binary): every change kind, every replica
// identity, unchanged TOAST, truncate options, Type, logical messages, origins and a re-sent
// Relation.
void v1_workload(PgServer& pg, const std::string& db, const std::string& stream_name) {
  pg.exec(kInsertAllTypes, db);
  pg.exec("UPDATE all_types SET c_text = 'updated', c_float4 = '-Infinity' WHERE id = 1", db);
  pg.exec("UPDATE all_types SET id = 100 WHERE id = 3", db);  // key change: old key 'K'
  pg.exec("DELETE FROM all_types WHERE id = 2", db);

  pg.exec("INSERT INTO ri_full VALUES (1, 'a', NULL), (2, 'b', 2.5)", db);
  pg.exec("UPDATE ri_full SET v = 'a2' WHERE id = 1", db);  // old row 'O'
  pg.exec("DELETE FROM ri_full WHERE id = 2", db);

  pg.exec("INSERT INTO ri_index VALUES (1, 'code1', 'x')", db);
  pg.exec("UPDATE ri_index SET code = 'code2' WHERE id = 1", db);  // index key changed: 'K'
  pg.exec("UPDATE ri_index SET v = 'y' WHERE id = 1", db);         // key unchanged: no old tuple
  pg.exec("DELETE FROM ri_index WHERE id = 1", db);

  pg.exec("INSERT INTO ri_nothing VALUES (1, 'only inserts can be published')", db);

  // > 8kB of incompressible text stored out of line, then an update that leaves it alone.
  pg.exec(
      "INSERT INTO toasty SELECT 1, string_agg(md5(i::text), ''), 'small' "
      "FROM generate_series(1, 400) i",
      db);
  pg.exec("UPDATE toasty SET small = 'changed' WHERE id = 1", db);  // 'u' for big
  pg.exec("DELETE FROM toasty WHERE id = 1", db);

  pg.exec("INSERT INTO evolving VALUES (1)", db);
  pg.exec("ALTER TABLE evolving ADD COLUMN note text", db);
  pg.exec("INSERT INTO evolving VALUES (2, 'after ALTER TABLE')", db);  // Relation re-sent

  pg.exec(
      "INSERT INTO parent_t DEFAULT VALUES; INSERT INTO child_t (parent_id) VALUES (1);"
      "INSERT INTO other_t (v) VALUES ('o')",
      db);
  pg.exec("TRUNCATE parent_t, other_t RESTART IDENTITY CASCADE", db);  // child_t too
  pg.exec("TRUNCATE other_t", db);
  pg.exec("TRUNCATE parent_t CASCADE", db);
  pg.exec("TRUNCATE other_t RESTART IDENTITY", db);

  pg.exec(
      "BEGIN; SELECT pg_logical_emit_message(true, 'golden', E'transactional \\u2713');"
      "INSERT INTO ri_nothing VALUES (2, 'with a message'); COMMIT",
      db);
  pg.exec("SELECT pg_logical_emit_message(true, 'golden', '')", db);
  pg.exec("SELECT pg_logical_emit_message(false, 'golden', '\\x00ff'::bytea)", db);

  // A transaction replayed from another node: pgoutput sends an Origin message after Begin.
  const std::string origin = "golden_origin_" + stream_name;
  pg.exec("SELECT pg_replication_origin_create(" + sql_literal(origin) +
              ") WHERE NOT EXISTS (SELECT FROM pg_replication_origin WHERE roname = " +
              sql_literal(origin) + ")",
          db);
  {
    PgConnection c = pg.connect_admin(db);
    c.exec("SELECT pg_replication_origin_session_setup(" + sql_literal(origin) + ")");
    c.exec(
        "BEGIN; SELECT pg_replication_origin_xact_setup('0/1234ABCD', '2024-01-02 03:04:05+00');"
        "INSERT INTO ri_nothing VALUES (3, 'from elsewhere'); COMMIT");
    c.exec("SELECT pg_replication_origin_session_reset()");
  }

  // Several tables in one transaction.
  pg.exec(
      "BEGIN; INSERT INTO all_types (id, c_mood) VALUES (4, 'ok');"
      "INSERT INTO ri_full VALUES (3, 'c', 3); UPDATE all_types SET c_mood = 'sad' WHERE id = 4;"
      "DELETE FROM ri_full WHERE id = 3; COMMIT",
      db);
}

// Rows of ~1.5kB of text that neither compress nor go out of line: 50 of them (75kB) exceed
// logical_decoding_work_mem (64kB), so their transaction is streamed.
std::string insert_big_rows(const std::string& table, int first, int count) {
  return "INSERT INTO " + table +
         " SELECT i, (SELECT string_agg(md5(i::text || '-' || j::text), '') "
         "FROM generate_series(1, 47) j) FROM generate_series(" +
         std::to_string(first) + ", " + std::to_string(first + count - 1) + ") i";
}

constexpr const char* kSchemaStreaming = R"sql(
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE stream_big (id int PRIMARY KEY, payload text);
CREATE TABLE stream_small (id int, m mood);
CREATE PUBLICATION golden FOR ALL TABLES;
)sql";

// Whether `message` is the Prepare (or Stream Prepare) of transaction `gid`.
bool is_prepare_of(ByteView message, const std::string& gid) {
  ByteReader r(message);
  const std::uint8_t tag = r.u8();
  r.u8(), r.u64(), r.u64(), r.i64(), r.u32();  // flags, prepare lsn, end lsn, time, xid
  const std::string got = r.cstr();
  return (tag == 'P' || tag == 'p') && r.ok() && r.at_end() && got == gid;
}

// ---------------------------------------------------------------------------------------------
// Fixture: one server per test process, a fresh database per stream.
// ---------------------------------------------------------------------------------------------
using Workload = std::function<void(const std::string& db, ReplicationRecorder& recorder)>;

class GoldenTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { server_.reset(); }
  void SetUp() override {
    if (!server_) server_ = std::make_unique<PgServer>();
  }
  // A test that failed between PREPARE TRANSACTION and its resolution would leave a prepared
  // transaction behind, and creating the next slot waits for it forever.
  void TearDown() override {
    if (!server_) return;
    for (const Row& row : pg().exec("SELECT gid, database FROM pg_prepared_xacts")) {
      pg().exec("ROLLBACK PREPARED " + sql_literal(*row[0]), *row[1]);
    }
  }

  PgServer& pg() { return *server_; }

  // Creates database golden_<name> with `schema` and a slot, starts streaming, runs the
  // workload, and records the stream up to the end marker. Every stream asks for logical
  // messages (the marker is one).
  RecordedStream record(const std::string& name, const std::string& schema, Options options,
                        SlotOptions slot, const Workload& workload) {
    const std::string db = "golden_" + name;
    pg().exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");  // --gtest_repeat
    pg().exec("CREATE DATABASE " + db);
    pg().exec(schema, db);
    options.emplace_back("publication_names", "golden");
    options.emplace_back("messages", "true");
    ReplicationRecorder recorder(pg(), db, "golden_" + name, slot);
    recorder.start(name, options);
    workload(db, recorder);
    pg().exec(ReplicationRecorder::end_marker_sql(name), db);
    RecordedStream stream = recorder.finish(name);
    write_fuzz_seeds(stream);
    return stream;
  }

  static std::unique_ptr<PgServer> server_;
};
std::unique_ptr<PgServer> GoldenTest::server_;

TEST_F(GoldenTest, ProtocolV1Text) {
  const RecordedStream stream = record(
      "v1_text", kSchemaAllTypes, {{"proto_version", "1"}}, {},
      [&](const std::string& db, ReplicationRecorder&) { v1_workload(pg(), db, "v1_text"); });
  const StreamSummary s = summarize(stream);
  EXPECT_TRUE(s.problems.empty()) << ::testing::PrintToString(s.problems);

  for (char tag : std::string("BCORYIUDTM")) EXPECT_HAS(s.tags, tag);
  for (char tag : std::string("SEcAbPKrp"))
    EXPECT_EQ(s.tags.count(tag), 0u) << "unexpected " << tag;
  for (char kind : std::string("ntu")) EXPECT_HAS(s.tuple_kinds, kind);
  EXPECT_EQ(s.tuple_kinds.count('b'), 0u);
  for (char kind : std::string("KO")) EXPECT_HAS(s.old_tuple_kinds, kind);
  for (char ident : std::string("dfin")) EXPECT_HAS(s.replica_identities, ident);
  EXPECT_EQ(s.truncate_options, (std::set<std::uint8_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.message_transactional, (std::set<bool>{false, true}));
  EXPECT_EQ(s.origins, (std::set<std::string>{"golden_origin_v1_text"}));
  // A domain's Type message names its base type (posint -> int4).
  for (const char* type : {"mood", "pair", "floatrange", "int4"}) {
    EXPECT_EQ(s.type_names.count(type), 1u) << "no Type message for " << type;
  }
  int resent = 0;
  for (const auto& [oid, count] : s.relation_sends) resent += count > 1 ? 1 : 0;
  EXPECT_GE(resent, 1) << "no Relation message was re-sent after ALTER TABLE";

  check_stream(stream);
}

TEST_F(GoldenTest, ProtocolV1Binary) {
  const RecordedStream stream = record(
      "v1_binary", kSchemaAllTypes, {{"proto_version", "1"}, {"binary", "true"}}, {},
      [&](const std::string& db, ReplicationRecorder&) { v1_workload(pg(), db, "v1_binary"); });
  const StreamSummary s = summarize(stream);
  EXPECT_TRUE(s.problems.empty()) << ::testing::PrintToString(s.problems);
  for (char tag : std::string("BCORYIUDTM")) EXPECT_HAS(s.tags, tag);
  for (char kind : std::string("bnu")) EXPECT_HAS(s.tuple_kinds, kind);
  for (char kind : std::string("KO")) EXPECT_HAS(s.old_tuple_kinds, kind);

  check_stream(stream);
}

TEST_F(GoldenTest, ProtocolV2Streaming) {
  const RecordedStream stream =
      record("v2_streaming", kSchemaStreaming, {{"proto_version", "2"}, {"streaming", "on"}}, {},
             [&](const std::string& db, ReplicationRecorder&) {
               // A small transaction is not streamed: Begin/Commit as in protocol 1.
               pg().exec("INSERT INTO stream_small VALUES (0, 'ok')", db);
               // A large committed transaction with every change kind inside the stream blocks.
               pg().exec("BEGIN;" + insert_big_rows("stream_big", 1, 50) +
                             ";"
                             "INSERT INTO stream_small VALUES (1, 'happy');"
                             "SELECT pg_logical_emit_message(true, 'golden', 'inside a stream');"
                             "UPDATE stream_big SET id = -id WHERE id <= 2;"
                             "UPDATE stream_big SET payload = 'short' WHERE id = 4;"
                             "DELETE FROM stream_big WHERE id = 3;"
                             "TRUNCATE stream_small;"
                             "COMMIT",
                         db);
               // A streamed subtransaction rolled back: Stream Abort with the subxact's xid.
               pg().exec("BEGIN;" + insert_big_rows("stream_big", 1001, 50) + "; SAVEPOINT s1;" +
                             insert_big_rows("stream_big", 2001, 50) +
                             "; ROLLBACK TO SAVEPOINT s1;"
                             "INSERT INTO stream_big VALUES (5000, 'after rollback to savepoint');"
                             "COMMIT",
                         db);
               // A streamed transaction rolled back as a whole: Stream Abort with xid = subxid.
               pg().exec("BEGIN;" + insert_big_rows("stream_big", 3001, 50) + "; ROLLBACK", db);
             });
  const StreamSummary s = summarize(stream);
  EXPECT_TRUE(s.problems.empty()) << ::testing::PrintToString(s.problems);
  for (char tag : std::string("BCRYIMSEcA")) EXPECT_HAS(s.tags, tag);
  for (char tag : std::string("RYIUDTM")) EXPECT_HAS(s.tags_in_stream, tag);
  EXPECT_EQ(s.stream_first_segment, (std::set<bool>{false, true}));
  EXPECT_TRUE(s.stream_abort_of_subxact) << "no Stream Abort for a subtransaction";
  EXPECT_TRUE(s.stream_abort_of_toplevel) << "no Stream Abort for a whole transaction";
  EXPECT_HAS(s.old_tuple_kinds, 'K');

  check_stream(stream);
}

TEST_F(GoldenTest, ProtocolV3TwoPhase) {
  const RecordedStream stream = record(
      "v3_two_phase", kSchemaStreaming, {{"proto_version", "3"}, {"two_phase", "true"}},
      SlotOptions{.two_phase = true}, [&](const std::string& db, ReplicationRecorder& recorder) {
        pg().exec(
            "BEGIN; INSERT INTO stream_small VALUES (1, 'ok');"
            "PREPARE TRANSACTION 'golden_v3_commit'",
            db);
        pg().exec("COMMIT PREPARED 'golden_v3_commit'", db);
        pg().exec(
            "BEGIN; INSERT INTO stream_big VALUES (2, 'two'); UPDATE stream_big SET id = 3;"
            "SELECT pg_logical_emit_message(true, 'golden', 'prepared');"
            "PREPARE TRANSACTION 'golden_v3_rollback'",
            db);
        // Roll back only once the prepare is decoded: decoding a transaction that is already
        // rolled back stops at its first catalog access (a "concurrent abort") and sends an
        // empty Begin Prepare/Prepare pair.
        recorder.read_until([](ByteView m) { return is_prepare_of(m, "golden_v3_rollback"); },
                            "the prepare of golden_v3_rollback");
        pg().exec("ROLLBACK PREPARED 'golden_v3_rollback'", db);
        pg().exec("INSERT INTO stream_small VALUES (2, 'sad')", db);
      });
  const StreamSummary s = summarize(stream);
  EXPECT_TRUE(s.problems.empty()) << ::testing::PrintToString(s.problems);
  for (char tag : std::string("bPKrBCRYIUM")) EXPECT_HAS(s.tags, tag);
  std::string tags;
  for (std::size_t i = 0; i < stream.frames.size(); ++i)
    tags += static_cast<char>(stream.message(i)[0]);
  // The rolled-back prepared transaction was decoded in full before its rollback.
  EXPECT_NE(tags.find("IUMPr"), std::string::npos) << tags;
  for (char tag : std::string("SEcAp")) EXPECT_EQ(s.tags.count(tag), 0u) << "unexpected " << tag;

  check_stream(stream);
}

TEST_F(GoldenTest, ProtocolV3TwoPhaseStreaming) {
  const RecordedStream stream = record(
      "v3_two_phase_streaming", kSchemaStreaming,
      {{"proto_version", "3"}, {"two_phase", "true"}, {"streaming", "on"}},
      SlotOptions{.two_phase = true}, [&](const std::string& db, ReplicationRecorder& recorder) {
        pg().exec("BEGIN;" + insert_big_rows("stream_big", 1, 50) +
                      "; PREPARE TRANSACTION 'golden_v3s_commit'",
                  db);
        pg().exec("COMMIT PREPARED 'golden_v3s_commit'", db);
        pg().exec("BEGIN;" + insert_big_rows("stream_big", 1001, 50) +
                      "; PREPARE TRANSACTION 'golden_v3s_rollback'",
                  db);
        recorder.read_until([](ByteView m) { return is_prepare_of(m, "golden_v3s_rollback"); },
                            "the stream prepare of golden_v3s_rollback");
        pg().exec("ROLLBACK PREPARED 'golden_v3s_rollback'", db);
        // A small prepared transaction is not streamed.
        pg().exec(
            "BEGIN; INSERT INTO stream_small VALUES (1, 'ok');"
            "PREPARE TRANSACTION 'golden_v3s_small'",
            db);
        pg().exec("COMMIT PREPARED 'golden_v3s_small'", db);
        // A large plain transaction is still streamed and committed.
        pg().exec("BEGIN;" + insert_big_rows("stream_big", 2001, 50) + "; COMMIT", db);
      });
  const StreamSummary s = summarize(stream);
  EXPECT_TRUE(s.problems.empty()) << ::testing::PrintToString(s.problems);
  for (char tag : std::string("SEpKrbPcRYI")) EXPECT_HAS(s.tags, tag);

  check_stream(stream);
}

}  // namespace
}  // namespace pgrelay::test
