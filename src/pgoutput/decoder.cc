// Decodes pgoutput payloads with proto.c's layouts and the apply worker's consistency checks.
#include "pgoutput/decoder.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

namespace pgrelay::pgoutput {

namespace {

constexpr int kMinProtocolVersion = 1;
constexpr int kMaxProtocolVersion = 4;
constexpr int kParallelStreamingVersion = 4;

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  va_list again;
  va_copy(again, ap);
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::string out;
  if (n >= 0 && static_cast<std::size_t>(n) < sizeof buf) {
    out.assign(buf, static_cast<std::size_t>(n));
  } else if (n >= 0) {
    out.resize(static_cast<std::size_t>(n) + 1);
    std::vsnprintf(out.data(), out.size(), fmt, again);
    out.resize(static_cast<std::size_t>(n));
  }
  va_end(again);
  return out;
}

Error violation(std::string message, std::string detail = {}) {
  return Error::make(sqlstate::kProtocolViolation, std::move(message), {}, std::move(detail));
}

// A marker byte as Postgres's "%c" would show it, but never a raw control byte.
std::string show_byte(std::uint8_t b) {
  if (b >= 0x20 && b < 0x7f) return std::string(1, static_cast<char>(b));
  return format("\\x%02x", b);
}

// Reads the body of one message (after its tag); every read is bounds-checked and a short
// read is reported once, with the message's name.
class Body {
 public:
  Body(ByteView payload, const char* name)
      : r_(payload.subspan(1)), name_(name), size_(payload.size()) {}

  ByteReader& r() { return r_; }
  const char* name() const { return name_; }
  bool ok() const { return r_.ok(); }

  Error truncated() const {
    return violation("insufficient data left in message",
                     format("%s message of %zu bytes is truncated", name_, size_));
  }
  // After the last field: the message must have been long enough and no longer.
  Status finish() const {
    if (!r_.ok()) return truncated();
    if (!r_.at_end()) {
      return violation("invalid message format",
                       format("%zu trailing bytes after %s message", r_.remaining(), name_));
    }
    return {};
  }

  std::optional<Xid> xid_if(bool streamed) {
    if (!streamed) return std::nullopt;
    return r_.u32();
  }
  Lsn lsn() { return Lsn(r_.u64()); }

 private:
  ByteReader r_;
  const char* name_;
  std::size_t size_;
};

Status read_tuple(Body& body, Tuple& tuple) {
  ByteReader& r = body.r();
  std::uint16_t count = r.u16();
  if (!r.ok()) return body.truncated();
  // Each column takes at least one byte: never reserve more than the payload could hold.
  tuple.columns.reserve(std::min<std::size_t>(count, r.remaining()));
  for (std::uint16_t i = 0; i < count; ++i) {
    std::uint8_t kind = r.u8();
    if (!r.ok()) return body.truncated();
    switch (static_cast<ValueKind>(kind)) {
      case ValueKind::kNull:
        tuple.columns.push_back(TupleValue::null());
        break;
      case ValueKind::kUnchanged:
        tuple.columns.push_back(TupleValue::unchanged());
        break;
      case ValueKind::kText:
      case ValueKind::kBinary: {
        std::int32_t len = r.i32();
        if (!r.ok()) return body.truncated();
        if (len < 0) {
          return violation(format("invalid column value length %d in %s message", len, body.name()),
                           format("column %u of the tuple", i + 1u));
        }
        ByteView data = r.bytes(static_cast<std::size_t>(len));
        if (!r.ok()) return body.truncated();
        tuple.columns.push_back(
            TupleValue{static_cast<ValueKind>(kind), std::string(as_chars(data))});
        break;
      }
      default:
        return violation(
            format("unrecognized data representation type '%s'", show_byte(kind).c_str()),
            format("column %u of a tuple in %s message", i + 1u, body.name()));
    }
  }
  return {};
}

}  // namespace

const Relation* Decoder::relation(Oid oid) const {
  if (in_stream_) {
    auto txn = streamed_relations_.find(stream_xid_);
    if (txn != streamed_relations_.end()) {
      auto it = txn->second.find(oid);
      if (it != txn->second.end()) return &it->second;
    }
  }
  auto it = relations_.find(oid);
  return it == relations_.end() ? nullptr : &it->second;
}

void Decoder::remember(const Relation& rel) {
  RelationMap& map = in_stream_ ? streamed_relations_[stream_xid_] : relations_;
  map.insert_or_assign(rel.oid, rel);
}

void Decoder::end_streamed_transaction(Xid xid, bool applied) {
  auto txn = streamed_relations_.find(xid);
  if (txn == streamed_relations_.end()) return;
  if (applied) {
    for (auto& [oid, rel] : txn->second) relations_.insert_or_assign(oid, std::move(rel));
  }
  streamed_relations_.erase(txn);
}

namespace {

// Decodes one message given the decoder's state; never modifies it.
class MessageDecoder {
 public:
  explicit MessageDecoder(const Decoder& decoder)
      : decoder_(decoder), options_(decoder.options()), in_stream_(decoder.in_stream()) {}

  Result<Message> decode(Tag tag, Body& body) {
    switch (tag) {
      case Tag::kBegin:
        return begin(body);
      case Tag::kCommit:
        return commit(body);
      case Tag::kOrigin:
        return origin(body);
      case Tag::kRelation:
        return relation(body);
      case Tag::kType:
        return type(body);
      case Tag::kInsert:
        return insert(body);
      case Tag::kUpdate:
        return update(body);
      case Tag::kDelete:
        return remove(body);
      case Tag::kTruncate:
        return truncate(body);
      case Tag::kMessage:
        return logical_message(body);
      case Tag::kStreamStart:
        return stream_start(body);
      case Tag::kStreamStop:
        return stream_stop(body);
      case Tag::kStreamCommit:
        return stream_commit(body);
      case Tag::kStreamAbort:
        return stream_abort(body);
      case Tag::kBeginPrepare:
        return begin_prepare(body);
      case Tag::kPrepare:
        return prepare<Prepare>(body, "prepare");
      case Tag::kCommitPrepared:
        return commit_prepared(body);
      case Tag::kRollbackPrepared:
        return rollback_prepared(body);
      case Tag::kStreamPrepare:
        return stream_prepare(body);
    }
    return violation("invalid logical replication message type");  // unreachable: tag checked
  }

 private:
  template <typename T>
  static Result<Message> done(Body& body, T message) {
    Status s = body.finish();
    if (!s.ok()) return s.error();
    return Message(std::move(message));
  }

  static Status no_flags(Body& body, const char* what) {
    std::uint8_t flags = body.r().u8();
    if (!body.ok()) return body.truncated();
    if (flags != 0) return violation(format("unrecognized flags %u in %s message", flags, what));
    return {};
  }

  static Status lsn_set(const Body& body, Lsn lsn, const char* format_text) {
    if (body.ok() && !lsn.is_valid()) return violation(format_text);
    return {};
  }

  Status outside_stream_block(const char* name) const {
    if (in_stream_) return violation(format("%s message without STREAM STOP", name));
    return {};
  }

  Result<const Relation*> known_relation(Body& body, Oid oid) const {
    if (!body.ok()) return body.truncated();
    const Relation* rel = decoder_.relation(oid);
    if (rel == nullptr) {
      return violation(format("logical replication relation OID %u not found; the stream must "
                              "send a Relation message before its first change",
                              oid),
                       format("in %s message", body.name()));
    }
    return rel;
  }

  static Status read_checked_tuple(Body& body, const Relation& rel, Tuple& tuple) {
    PGRELAY_TRY(read_tuple(body, tuple));
    if (tuple.columns.size() != rel.columns.size()) {
      return violation(
          format("%s message for relation OID %u has a tuple of %zu columns, but its Relation "
                 "message declares %zu",
                 body.name(), rel.oid, tuple.columns.size(), rel.columns.size()),
          format("relation \"%s.%s\"",
                 rel.namespace_name.empty() ? "pg_catalog" : rel.namespace_name.c_str(),
                 rel.name.c_str()));
    }
    return {};
  }

  // The byte announcing a tuple: 'N', 'K' or 'O'.
  static Result<std::uint8_t> marker(Body& body) {
    std::uint8_t m = body.r().u8();
    if (!body.ok()) return body.truncated();
    return m;
  }

  Result<Message> begin(Body& body) {
    Begin m;
    m.final_lsn = body.lsn();
    PGRELAY_TRY(lsn_set(body, m.final_lsn, "final_lsn not set in begin message"));
    m.commit_time = body.r().i64();
    m.xid = body.r().u32();
    return done(body, std::move(m));
  }

  Result<Message> commit(Body& body) {
    PGRELAY_TRY(no_flags(body, "commit"));
    Commit m;
    m.commit_lsn = body.lsn();
    m.end_lsn = body.lsn();
    m.commit_time = body.r().i64();
    return done(body, std::move(m));
  }

  Result<Message> origin(Body& body) {
    Origin m;
    m.origin_lsn = body.lsn();
    m.name = body.r().cstr();
    return done(body, std::move(m));
  }

  Result<Message> relation(Body& body) {
    Relation m;
    ByteReader& r = body.r();
    m.xid = body.xid_if(in_stream_);
    m.oid = r.u32();
    m.namespace_name = r.cstr();
    m.name = r.cstr();
    m.replica_identity = static_cast<char>(r.u8());
    std::uint16_t count = r.u16();
    if (!r.ok()) return body.truncated();
    // A column takes at least 10 bytes (flags, empty name, type oid, typmod).
    m.columns.reserve(std::min<std::size_t>(count, r.remaining() / 10));
    for (std::uint16_t i = 0; i < count && r.ok(); ++i) {
      Column c;
      c.flags = r.u8();
      c.name = r.cstr();
      c.type_oid = r.u32();
      c.type_modifier = r.i32();
      m.columns.push_back(std::move(c));
    }
    return done(body, std::move(m));
  }

  Result<Message> type(Body& body) {
    Type m;
    m.xid = body.xid_if(in_stream_);
    m.oid = body.r().u32();
    m.namespace_name = body.r().cstr();
    m.name = body.r().cstr();
    return done(body, std::move(m));
  }

  Result<Message> insert(Body& body) {
    Insert m;
    m.xid = body.xid_if(in_stream_);
    m.relation_oid = body.r().u32();
    Result<const Relation*> rel = known_relation(body, m.relation_oid);
    if (!rel.ok()) return rel.error();
    Result<std::uint8_t> action = marker(body);
    if (!action.ok()) return action.error();
    if (*action != 'N') return violation(format("expected new tuple but got %d", *action));
    PGRELAY_TRY(read_checked_tuple(body, **rel, m.new_tuple));
    return done(body, std::move(m));
  }

  Result<Message> update(Body& body) {
    Update m;
    m.xid = body.xid_if(in_stream_);
    m.relation_oid = body.r().u32();
    Result<const Relation*> rel = known_relation(body, m.relation_oid);
    if (!rel.ok()) return rel.error();
    Result<std::uint8_t> action = marker(body);
    if (!action.ok()) return action.error();
    if (*action != 'K' && *action != 'O' && *action != 'N') {
      return violation(
          format("expected action 'N', 'O' or 'K', got %s", show_byte(*action).c_str()));
    }
    if (*action != 'N') {
      OldTuple old;
      old.kind = static_cast<OldKind>(*action);
      PGRELAY_TRY(read_checked_tuple(body, **rel, old.tuple));
      m.old = std::move(old);
      action = marker(body);
      if (!action.ok()) return action.error();
      if (*action != 'N') {
        return violation(format("expected action 'N', got %s", show_byte(*action).c_str()));
      }
    }
    PGRELAY_TRY(read_checked_tuple(body, **rel, m.new_tuple));
    return done(body, std::move(m));
  }

  Result<Message> remove(Body& body) {
    Delete m;
    m.xid = body.xid_if(in_stream_);
    m.relation_oid = body.r().u32();
    Result<const Relation*> rel = known_relation(body, m.relation_oid);
    if (!rel.ok()) return rel.error();
    Result<std::uint8_t> action = marker(body);
    if (!action.ok()) return action.error();
    if (*action != 'K' && *action != 'O') {
      return violation(format("expected action 'O' or 'K', got %s", show_byte(*action).c_str()));
    }
    m.old.kind = static_cast<OldKind>(*action);
    PGRELAY_TRY(read_checked_tuple(body, **rel, m.old.tuple));
    return done(body, std::move(m));
  }

  Result<Message> truncate(Body& body) {
    Truncate m;
    ByteReader& r = body.r();
    m.xid = body.xid_if(in_stream_);
    std::int32_t count = r.i32();
    std::uint8_t options = r.u8();
    if (!r.ok()) return body.truncated();
    if (count < 0) return violation(format("invalid relation count %d in truncate message", count));
    if ((options & ~(kTruncateCascade | kTruncateRestartIdentity)) != 0) {
      return violation(format("unrecognized options %u in truncate message", options));
    }
    m.cascade = (options & kTruncateCascade) != 0;
    m.restart_identity = (options & kTruncateRestartIdentity) != 0;
    if (static_cast<std::size_t>(count) > r.remaining() / 4) return body.truncated();
    m.relation_oids.reserve(static_cast<std::size_t>(count));
    for (std::int32_t i = 0; i < count; ++i) {
      Oid oid = r.u32();
      Result<const Relation*> rel = known_relation(body, oid);
      if (!rel.ok()) return rel.error();
      m.relation_oids.push_back(oid);
    }
    return done(body, std::move(m));
  }

  Result<Message> logical_message(Body& body) {
    LogicalMessage m;
    ByteReader& r = body.r();
    m.xid = body.xid_if(in_stream_);
    std::uint8_t flags = r.u8();
    if (!r.ok()) return body.truncated();
    if ((flags & ~kMessageTransactional) != 0) {
      return violation(format("unrecognized flags %u in logical decoding message", flags));
    }
    m.transactional = (flags & kMessageTransactional) != 0;
    m.lsn = body.lsn();
    m.prefix = r.cstr();
    std::int32_t len = r.i32();
    if (!r.ok()) return body.truncated();
    if (len < 0)
      return violation(format("invalid content length %d in logical decoding message", len));
    m.content = std::string(as_chars(r.bytes(static_cast<std::size_t>(len))));
    return done(body, std::move(m));
  }

  Result<Message> stream_start(Body& body) {
    if (in_stream_) return violation("duplicate STREAM START message");
    StreamStart m;
    m.xid = body.r().u32();
    std::uint8_t first = body.r().u8();
    if (body.ok() && first > 1) {
      return violation(format("invalid first segment flag %u in stream start message", first));
    }
    m.first_segment = first == 1;
    return done(body, m);
  }

  Result<Message> stream_stop(Body& body) {
    if (!in_stream_) return violation("STREAM STOP message without STREAM START");
    return done(body, StreamStop{});
  }

  Result<Message> stream_commit(Body& body) {
    PGRELAY_TRY(outside_stream_block("STREAM COMMIT"));
    StreamCommit m;
    m.xid = body.r().u32();
    PGRELAY_TRY(no_flags(body, "commit"));
    m.commit_lsn = body.lsn();
    m.end_lsn = body.lsn();
    m.commit_time = body.r().i64();
    return done(body, m);
  }

  Result<Message> stream_abort(Body& body) {
    PGRELAY_TRY(outside_stream_block("STREAM ABORT"));
    StreamAbort m;
    m.xid = body.r().u32();
    m.subxid = body.r().u32();
    if (options_.protocol_version >= kParallelStreamingVersion && options_.parallel_streaming) {
      AbortInfo info;
      info.abort_lsn = body.lsn();
      info.abort_time = body.r().i64();
      m.abort_info = info;
    }
    return done(body, m);
  }

  Result<Message> begin_prepare(Body& body) {
    BeginPrepare m;
    m.prepare_lsn = body.lsn();
    PGRELAY_TRY(lsn_set(body, m.prepare_lsn, "prepare_lsn not set in begin prepare message"));
    m.end_lsn = body.lsn();
    PGRELAY_TRY(lsn_set(body, m.end_lsn, "end_lsn not set in begin prepare message"));
    m.prepare_time = body.r().i64();
    m.xid = body.r().u32();
    m.gid = body.r().cstr();
    return done(body, std::move(m));
  }

  // Prepare and Stream Prepare: one layout, checked as logicalrep_read_prepare_common does.
  template <typename T>
  Result<Message> prepare(Body& body, const char* what) {
    PGRELAY_TRY(no_flags(body, what));
    T m;
    m.prepare_lsn = body.lsn();
    if (body.ok() && !m.prepare_lsn.is_valid()) {
      return violation(format("prepare_lsn is not set in %s message", what));
    }
    m.end_lsn = body.lsn();
    if (body.ok() && !m.end_lsn.is_valid()) {
      return violation(format("end_lsn is not set in %s message", what));
    }
    m.prepare_time = body.r().i64();
    m.xid = body.r().u32();
    if (body.ok() && m.xid == 0) {
      return violation(format("invalid two-phase transaction ID in %s message", what));
    }
    m.gid = body.r().cstr();
    return done(body, std::move(m));
  }

  Result<Message> stream_prepare(Body& body) {
    PGRELAY_TRY(outside_stream_block("STREAM PREPARE"));
    return prepare<StreamPrepare>(body, "stream prepare");
  }

  Result<Message> commit_prepared(Body& body) {
    PGRELAY_TRY(no_flags(body, "commit prepared"));
    CommitPrepared m;
    m.commit_lsn = body.lsn();
    PGRELAY_TRY(lsn_set(body, m.commit_lsn, "commit_lsn is not set in commit prepared message"));
    m.end_lsn = body.lsn();
    PGRELAY_TRY(lsn_set(body, m.end_lsn, "end_lsn is not set in commit prepared message"));
    m.commit_time = body.r().i64();
    m.xid = body.r().u32();
    m.gid = body.r().cstr();
    return done(body, std::move(m));
  }

  Result<Message> rollback_prepared(Body& body) {
    PGRELAY_TRY(no_flags(body, "rollback prepared"));
    RollbackPrepared m;
    m.prepare_end_lsn = body.lsn();
    PGRELAY_TRY(lsn_set(body, m.prepare_end_lsn,
                        "prepare_end_lsn is not set in rollback prepared message"));
    m.rollback_end_lsn = body.lsn();
    PGRELAY_TRY(lsn_set(body, m.rollback_end_lsn,
                        "rollback_end_lsn is not set in rollback prepared message"));
    m.prepare_time = body.r().i64();
    m.rollback_time = body.r().i64();
    m.xid = body.r().u32();
    m.gid = body.r().cstr();
    return done(body, std::move(m));
  }

  const Decoder& decoder_;
  const DecoderOptions& options_;
  bool in_stream_;
};

Status check_options(const DecoderOptions& options) {
  if (options.protocol_version > kMaxProtocolVersion) {
    return Error::make(sqlstate::kFeatureNotSupported,
                       format("client sent proto_version=%d but server only supports protocol %d "
                              "or lower",
                              options.protocol_version, kMaxProtocolVersion));
  }
  if (options.protocol_version < kMinProtocolVersion) {
    return Error::make(sqlstate::kFeatureNotSupported,
                       format("client sent proto_version=%d but server only supports protocol %d "
                              "or higher",
                              options.protocol_version, kMinProtocolVersion));
  }
  if (options.parallel_streaming && options.protocol_version < kParallelStreamingVersion) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       format("requested proto_version=%d does not support parallel streaming, "
                              "need %d or higher",
                              options.protocol_version, kParallelStreamingVersion));
  }
  return {};
}

}  // namespace

Result<Message> Decoder::decode(ByteView payload) {
  PGRELAY_TRY(check_options(options_));
  if (payload.empty()) {
    return violation("insufficient data left in message", "empty logical replication message");
  }
  const char tag_byte = static_cast<char>(payload[0]);
  const char* name = tag_name(tag_byte);
  if (name == nullptr) {
    return violation(format("invalid logical replication message type \"??? (%d)\"",
                            static_cast<int>(payload[0])));
  }
  int needed = min_protocol_version(tag_byte);
  if (needed > options_.protocol_version) {
    return violation(
        format("logical replication message type \"%s\" requires protocol version %d "
               "or higher, but protocol version %d is in use",
               name, needed, options_.protocol_version));
  }

  Body body(payload, name);
  const Tag tag = static_cast<Tag>(tag_byte);
  Result<Message> result = MessageDecoder(*this).decode(tag, body);
  if (!result.ok()) return result;

  // State changes only after the whole message decoded cleanly.
  switch (tag) {
    case Tag::kStreamStart:
      in_stream_ = true;
      stream_xid_ = std::get<StreamStart>(*result).xid;
      break;
    case Tag::kStreamStop:
      in_stream_ = false;
      break;
    case Tag::kRelation:
      remember(std::get<Relation>(*result));
      break;
    case Tag::kStreamCommit:
      end_streamed_transaction(std::get<StreamCommit>(*result).xid, true);
      break;
    case Tag::kStreamPrepare:
      end_streamed_transaction(std::get<StreamPrepare>(*result).xid, true);
      break;
    case Tag::kStreamAbort: {
      // A subtransaction's abort leaves the transaction's relations: pgoutput re-sends them
      // before the next change that needs them anyway.
      const StreamAbort& abort = std::get<StreamAbort>(*result);
      if (abort.xid == abort.subxid) end_streamed_transaction(abort.xid, false);
      break;
    }
    default:
      break;
  }
  return result;
}

}  // namespace pgrelay::pgoutput
