// The pgoutput logical replication message model (protocol versions 1-4) as plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "wire/lsn.h"

namespace pgrelay::pgoutput {

using wire::Lsn;

// Postgres TimestampTz on the wire: microseconds since 2000-01-01 00:00:00 UTC.
using Timestamp = std::int64_t;
using Xid = std::uint32_t;
using Oid = std::uint32_t;

// The first byte of every pgoutput message.
enum class Tag : char {
  kBegin = 'B',
  kCommit = 'C',
  kOrigin = 'O',
  kRelation = 'R',
  kType = 'Y',
  kInsert = 'I',
  kUpdate = 'U',
  kDelete = 'D',
  kTruncate = 'T',
  kMessage = 'M',
  kStreamStart = 'S',
  kStreamStop = 'E',
  kStreamCommit = 'c',
  kStreamAbort = 'A',
  kBeginPrepare = 'b',
  kPrepare = 'P',
  kCommitPrepared = 'K',
  kRollbackPrepared = 'r',
  kStreamPrepare = 'p',
};

// How one column value is carried in TupleData.
enum class ValueKind : char {
  kNull = 'n',
  kUnchanged = 'u',  // unchanged TOASTed value: the value itself is not sent
  kText = 't',
  kBinary = 'b',
};

struct TupleValue {
  ValueKind kind = ValueKind::kNull;
  // The value's bytes for kText (type output function) and kBinary (type send function);
  // empty otherwise. A std::string so that short values stay inline (no allocation).
  std::string bytes;

  static TupleValue null() { return {ValueKind::kNull, {}}; }
  static TupleValue unchanged() { return {ValueKind::kUnchanged, {}}; }
  static TupleValue text(std::string v) { return {ValueKind::kText, std::move(v)}; }
  static TupleValue binary(std::string v) { return {ValueKind::kBinary, std::move(v)}; }
  bool operator==(const TupleValue&) const = default;
};

struct Tuple {
  std::vector<TupleValue> columns;
  bool operator==(const Tuple&) const = default;
};

// Which old tuple an Update or Delete carries: the replica identity key ('K') or the whole
// old row ('O', replica identity FULL).
enum class OldKind : char { kKey = 'K', kFull = 'O' };

struct OldTuple {
  OldKind kind = OldKind::kKey;
  Tuple tuple;
  bool operator==(const OldTuple&) const = default;
};

// Relation column flags.
inline constexpr std::uint8_t kColumnIsKey = 1;

struct Column {
  std::uint8_t flags = 0;  // kColumnIsKey when part of the replica identity
  std::string name;
  Oid type_oid = 0;
  std::int32_t type_modifier = -1;

  bool is_key() const { return (flags & kColumnIsKey) != 0; }
  bool operator==(const Column&) const = default;
};

// Replica identity characters, as in pg_class.relreplident.
inline constexpr char kReplicaIdentityDefault = 'd';
inline constexpr char kReplicaIdentityNothing = 'n';
inline constexpr char kReplicaIdentityFull = 'f';
inline constexpr char kReplicaIdentityIndex = 'i';

// Messages that may appear inside a streamed block carry `xid`: present exactly when the
// message was (or is to be) sent between Stream Start and Stream Stop.

struct Begin {
  Lsn final_lsn;
  Timestamp commit_time = 0;
  Xid xid = 0;
  bool operator==(const Begin&) const = default;
};

// The flags byte is always 0 on the wire (Postgres rejects anything else).
struct Commit {
  Lsn commit_lsn;
  Lsn end_lsn;
  Timestamp commit_time = 0;
  bool operator==(const Commit&) const = default;
};

struct Origin {
  Lsn origin_lsn;
  std::string name;
  bool operator==(const Origin&) const = default;
};

struct Relation {
  std::optional<Xid> xid;
  Oid oid = 0;
  std::string namespace_name;  // "" stands for pg_catalog, as Postgres sends it
  std::string name;
  char replica_identity = kReplicaIdentityDefault;
  std::vector<Column> columns;
  // The schema's name: namespace_name, or "pg_catalog" where pgoutput sends it empty.
  std::string_view schema() const {
    return namespace_name.empty() ? std::string_view("pg_catalog")
                                  : std::string_view(namespace_name);
  }
  bool operator==(const Relation&) const = default;
};

struct Type {
  std::optional<Xid> xid;
  Oid oid = 0;
  std::string namespace_name;  // "" stands for pg_catalog
  std::string name;
  bool operator==(const Type&) const = default;
};

struct Insert {
  std::optional<Xid> xid;
  Oid relation_oid = 0;
  Tuple new_tuple;
  bool operator==(const Insert&) const = default;
};

struct Update {
  std::optional<Xid> xid;
  Oid relation_oid = 0;
  std::optional<OldTuple> old;  // absent when the key did not change (and identity not FULL)
  Tuple new_tuple;
  bool operator==(const Update&) const = default;
};

struct Delete {
  std::optional<Xid> xid;
  Oid relation_oid = 0;
  OldTuple old;
  bool operator==(const Delete&) const = default;
};

// Truncate option bits on the wire.
inline constexpr std::uint8_t kTruncateCascade = 1;
inline constexpr std::uint8_t kTruncateRestartIdentity = 2;

struct Truncate {
  std::optional<Xid> xid;
  bool cascade = false;
  bool restart_identity = false;
  std::vector<Oid> relation_oids;
  bool operator==(const Truncate&) const = default;
};

// Message flag bit on the wire.
inline constexpr std::uint8_t kMessageTransactional = 1;

// A pg_logical_emit_message() record.
struct LogicalMessage {
  std::optional<Xid> xid;
  bool transactional = false;
  Lsn lsn;
  std::string prefix;
  std::string content;
  bool operator==(const LogicalMessage&) const = default;
};

struct StreamStart {
  Xid xid = 0;
  bool first_segment = false;
  bool operator==(const StreamStart&) const = default;
};

struct StreamStop {
  bool operator==(const StreamStop&) const = default;
};

struct StreamCommit {
  Xid xid = 0;
  Lsn commit_lsn;
  Lsn end_lsn;
  Timestamp commit_time = 0;
  bool operator==(const StreamCommit&) const = default;
};

// Sent with protocol version 4 when streaming = parallel.
struct AbortInfo {
  Lsn abort_lsn;
  Timestamp abort_time = 0;
  bool operator==(const AbortInfo&) const = default;
};

struct StreamAbort {
  Xid xid = 0;
  Xid subxid = 0;  // equals xid when the whole top-level transaction aborts
  std::optional<AbortInfo> abort_info;
  bool operator==(const StreamAbort&) const = default;
};

struct BeginPrepare {
  Lsn prepare_lsn;
  Lsn end_lsn;
  Timestamp prepare_time = 0;
  Xid xid = 0;
  std::string gid;
  bool operator==(const BeginPrepare&) const = default;
};

struct Prepare {
  Lsn prepare_lsn;
  Lsn end_lsn;
  Timestamp prepare_time = 0;
  Xid xid = 0;
  std::string gid;
  bool operator==(const Prepare&) const = default;
};

struct CommitPrepared {
  Lsn commit_lsn;
  Lsn end_lsn;
  Timestamp commit_time = 0;
  Xid xid = 0;
  std::string gid;
  bool operator==(const CommitPrepared&) const = default;
};

struct RollbackPrepared {
  Lsn prepare_end_lsn;
  Lsn rollback_end_lsn;
  Timestamp prepare_time = 0;
  Timestamp rollback_time = 0;
  Xid xid = 0;
  std::string gid;
  bool operator==(const RollbackPrepared&) const = default;
};

struct StreamPrepare {
  Lsn prepare_lsn;
  Lsn end_lsn;
  Timestamp prepare_time = 0;
  Xid xid = 0;
  std::string gid;
  bool operator==(const StreamPrepare&) const = default;
};

using Message =
    std::variant<Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate,
                 LogicalMessage, StreamStart, StreamStop, StreamCommit, StreamAbort, BeginPrepare,
                 Prepare, CommitPrepared, RollbackPrepared, StreamPrepare>;

// The wire tag of a message.
Tag tag_of(const Message& message);

// Postgres's name for a message type ("BEGIN", "STREAM START", ...), or nullptr for a byte
// that is not a pgoutput tag.
const char* tag_name(char tag);

// The lowest protocol version in which a message type exists (1, 2 for streaming, 3 for
// two-phase), or 0 for a byte that is not a pgoutput tag.
int min_protocol_version(char tag);

// One line for logs and test failure messages; long values are shortened.
std::string describe(const Message& message);

}  // namespace pgrelay::pgoutput
