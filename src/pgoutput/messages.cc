// Names, protocol versions and one-line descriptions of pgoutput messages.
#include "pgoutput/messages.h"

#include <cstdio>
#include <type_traits>

namespace pgrelay::pgoutput {

namespace {

template <typename T>
constexpr Tag tag_for() {
  if constexpr (std::is_same_v<T, Begin>)
    return Tag::kBegin;
  else if constexpr (std::is_same_v<T, Commit>)
    return Tag::kCommit;
  else if constexpr (std::is_same_v<T, Origin>)
    return Tag::kOrigin;
  else if constexpr (std::is_same_v<T, Relation>)
    return Tag::kRelation;
  else if constexpr (std::is_same_v<T, Type>)
    return Tag::kType;
  else if constexpr (std::is_same_v<T, Insert>)
    return Tag::kInsert;
  else if constexpr (std::is_same_v<T, Update>)
    return Tag::kUpdate;
  else if constexpr (std::is_same_v<T, Delete>)
    return Tag::kDelete;
  else if constexpr (std::is_same_v<T, Truncate>)
    return Tag::kTruncate;
  else if constexpr (std::is_same_v<T, LogicalMessage>)
    return Tag::kMessage;
  else if constexpr (std::is_same_v<T, StreamStart>)
    return Tag::kStreamStart;
  else if constexpr (std::is_same_v<T, StreamStop>)
    return Tag::kStreamStop;
  else if constexpr (std::is_same_v<T, StreamCommit>)
    return Tag::kStreamCommit;
  else if constexpr (std::is_same_v<T, StreamAbort>)
    return Tag::kStreamAbort;
  else if constexpr (std::is_same_v<T, BeginPrepare>)
    return Tag::kBeginPrepare;
  else if constexpr (std::is_same_v<T, Prepare>)
    return Tag::kPrepare;
  else if constexpr (std::is_same_v<T, CommitPrepared>)
    return Tag::kCommitPrepared;
  else if constexpr (std::is_same_v<T, RollbackPrepared>)
    return Tag::kRollbackPrepared;
  else {
    static_assert(std::is_same_v<T, StreamPrepare>);
    return Tag::kStreamPrepare;
  }
}

constexpr std::size_t kMaxShownValue = 48;

void append_quoted(std::string& out, const std::string& value) {
  out += '\'';
  std::size_t shown = value.size() < kMaxShownValue ? value.size() : kMaxShownValue;
  for (std::size_t i = 0; i < shown; ++i) {
    unsigned char c = static_cast<unsigned char>(value[i]);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '\'';
  if (shown < value.size()) out += "...(" + std::to_string(value.size()) + " bytes)";
}

void append_tuple(std::string& out, const Tuple& tuple) {
  out += '(';
  bool first = true;
  for (const TupleValue& v : tuple.columns) {
    if (!first) out += ", ";
    first = false;
    switch (v.kind) {
      case ValueKind::kNull:
        out += "null";
        break;
      case ValueKind::kUnchanged:
        out += "unchanged-toast";
        break;
      case ValueKind::kText:
        append_quoted(out, v.bytes);
        break;
      case ValueKind::kBinary:
        out += "binary:";
        append_quoted(out, v.bytes);
        break;
      default:
        out += "kind?";
        break;
    }
  }
  out += ')';
}

void append_xid(std::string& out, const std::optional<Xid>& xid) {
  if (xid) out += " xid=" + std::to_string(*xid);
}

std::string qualified(const std::string& nspname, const std::string& name) {
  return (nspname.empty() ? std::string("pg_catalog") : nspname) + "." + name;
}

struct Describer {
  std::string out;

  void operator()(const Begin& m) {
    out += " final_lsn=" + m.final_lsn.to_string() +
           " commit_time=" + std::to_string(m.commit_time) + " xid=" + std::to_string(m.xid);
  }
  void operator()(const Commit& m) {
    out += " commit_lsn=" + m.commit_lsn.to_string() + " end_lsn=" + m.end_lsn.to_string() +
           " commit_time=" + std::to_string(m.commit_time);
  }
  void operator()(const Origin& m) {
    out += " origin_lsn=" + m.origin_lsn.to_string() + " name=";
    append_quoted(out, m.name);
  }
  void operator()(const Relation& m) {
    append_xid(out, m.xid);
    out += " oid=" + std::to_string(m.oid) + " " + qualified(m.namespace_name, m.name) +
           " replica_identity=" + std::string(1, m.replica_identity) + " columns=(";
    bool first = true;
    for (const Column& c : m.columns) {
      if (!first) out += ", ";
      first = false;
      out += c.name + " " + std::to_string(c.type_oid);
      if (c.type_modifier != -1) out += "(" + std::to_string(c.type_modifier) + ")";
      if (c.is_key()) out += " key";
      if ((c.flags & ~kColumnIsKey) != 0) out += " flags=" + std::to_string(c.flags);
    }
    out += ')';
  }
  void operator()(const Type& m) {
    append_xid(out, m.xid);
    out += " oid=" + std::to_string(m.oid) + " " + qualified(m.namespace_name, m.name);
  }
  void operator()(const Insert& m) {
    append_xid(out, m.xid);
    out += " relation=" + std::to_string(m.relation_oid) + " new=";
    append_tuple(out, m.new_tuple);
  }
  void operator()(const Update& m) {
    append_xid(out, m.xid);
    out += " relation=" + std::to_string(m.relation_oid);
    if (m.old) {
      out += m.old->kind == OldKind::kFull ? " old=" : " key=";
      append_tuple(out, m.old->tuple);
    }
    out += " new=";
    append_tuple(out, m.new_tuple);
  }
  void operator()(const Delete& m) {
    append_xid(out, m.xid);
    out += " relation=" + std::to_string(m.relation_oid);
    out += m.old.kind == OldKind::kFull ? " old=" : " key=";
    append_tuple(out, m.old.tuple);
  }
  void operator()(const Truncate& m) {
    append_xid(out, m.xid);
    if (m.cascade) out += " cascade";
    if (m.restart_identity) out += " restart_identity";
    out += " relations=(";
    bool first = true;
    for (Oid oid : m.relation_oids) {
      if (!first) out += ", ";
      first = false;
      out += std::to_string(oid);
    }
    out += ')';
  }
  void operator()(const LogicalMessage& m) {
    append_xid(out, m.xid);
    out += m.transactional ? " transactional" : " non-transactional";
    out += " lsn=" + m.lsn.to_string() + " prefix=";
    append_quoted(out, m.prefix);
    out += " content=";
    append_quoted(out, m.content);
  }
  void operator()(const StreamStart& m) {
    out += " xid=" + std::to_string(m.xid) + (m.first_segment ? " first_segment" : "");
  }
  void operator()(const StreamStop&) {}
  void operator()(const StreamCommit& m) {
    out += " xid=" + std::to_string(m.xid) + " commit_lsn=" + m.commit_lsn.to_string() +
           " end_lsn=" + m.end_lsn.to_string() + " commit_time=" + std::to_string(m.commit_time);
  }
  void operator()(const StreamAbort& m) {
    out += " xid=" + std::to_string(m.xid) + " subxid=" + std::to_string(m.subxid);
    if (m.abort_info) {
      out += " abort_lsn=" + m.abort_info->abort_lsn.to_string() +
             " abort_time=" + std::to_string(m.abort_info->abort_time);
    }
  }
  void prepare_like(Lsn lsn, Lsn end_lsn, Timestamp time, Xid xid, const std::string& gid) {
    out += " prepare_lsn=" + lsn.to_string() + " end_lsn=" + end_lsn.to_string() +
           " prepare_time=" + std::to_string(time) + " xid=" + std::to_string(xid) + " gid=";
    append_quoted(out, gid);
  }
  void operator()(const BeginPrepare& m) {
    prepare_like(m.prepare_lsn, m.end_lsn, m.prepare_time, m.xid, m.gid);
  }
  void operator()(const Prepare& m) {
    prepare_like(m.prepare_lsn, m.end_lsn, m.prepare_time, m.xid, m.gid);
  }
  void operator()(const StreamPrepare& m) {
    prepare_like(m.prepare_lsn, m.end_lsn, m.prepare_time, m.xid, m.gid);
  }
  void operator()(const CommitPrepared& m) {
    out += " commit_lsn=" + m.commit_lsn.to_string() + " end_lsn=" + m.end_lsn.to_string() +
           " commit_time=" + std::to_string(m.commit_time) + " xid=" + std::to_string(m.xid) +
           " gid=";
    append_quoted(out, m.gid);
  }
  void operator()(const RollbackPrepared& m) {
    out += " prepare_end_lsn=" + m.prepare_end_lsn.to_string() +
           " rollback_end_lsn=" + m.rollback_end_lsn.to_string() +
           " prepare_time=" + std::to_string(m.prepare_time) +
           " rollback_time=" + std::to_string(m.rollback_time) + " xid=" + std::to_string(m.xid) +
           " gid=";
    append_quoted(out, m.gid);
  }
};

}  // namespace

Tag tag_of(const Message& message) {
  return std::visit([](const auto& m) { return tag_for<std::decay_t<decltype(m)>>(); }, message);
}

const char* tag_name(char tag) {
  switch (static_cast<Tag>(tag)) {
    case Tag::kBegin:
      return "BEGIN";
    case Tag::kCommit:
      return "COMMIT";
    case Tag::kOrigin:
      return "ORIGIN";
    case Tag::kRelation:
      return "RELATION";
    case Tag::kType:
      return "TYPE";
    case Tag::kInsert:
      return "INSERT";
    case Tag::kUpdate:
      return "UPDATE";
    case Tag::kDelete:
      return "DELETE";
    case Tag::kTruncate:
      return "TRUNCATE";
    case Tag::kMessage:
      return "MESSAGE";
    case Tag::kStreamStart:
      return "STREAM START";
    case Tag::kStreamStop:
      return "STREAM STOP";
    case Tag::kStreamCommit:
      return "STREAM COMMIT";
    case Tag::kStreamAbort:
      return "STREAM ABORT";
    case Tag::kBeginPrepare:
      return "BEGIN PREPARE";
    case Tag::kPrepare:
      return "PREPARE";
    case Tag::kCommitPrepared:
      return "COMMIT PREPARED";
    case Tag::kRollbackPrepared:
      return "ROLLBACK PREPARED";
    case Tag::kStreamPrepare:
      return "STREAM PREPARE";
  }
  return nullptr;
}

int min_protocol_version(char tag) {
  switch (static_cast<Tag>(tag)) {
    case Tag::kBegin:
    case Tag::kCommit:
    case Tag::kOrigin:
    case Tag::kRelation:
    case Tag::kType:
    case Tag::kInsert:
    case Tag::kUpdate:
    case Tag::kDelete:
    case Tag::kTruncate:
    case Tag::kMessage:
      return 1;
    case Tag::kStreamStart:
    case Tag::kStreamStop:
    case Tag::kStreamCommit:
    case Tag::kStreamAbort:
      return 2;
    case Tag::kBeginPrepare:
    case Tag::kPrepare:
    case Tag::kCommitPrepared:
    case Tag::kRollbackPrepared:
    case Tag::kStreamPrepare:
      return 3;
  }
  return 0;
}

std::string describe(const Message& message) {
  Describer d;
  d.out = tag_name(static_cast<char>(tag_of(message)));
  std::visit(d, message);
  return std::move(d.out);
}

}  // namespace pgrelay::pgoutput
