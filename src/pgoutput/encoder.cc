// Encodes pgoutput messages byte for byte as proto.c writes them (protocol versions 1-4).
#include "pgoutput/encoder.h"

#include <cassert>
#include <cstring>

namespace pgrelay::pgoutput {

namespace {

// Writes big-endian fields into a buffer already sized by encoded_size(): no capacity checks
// and no reallocation per field, which is what makes encoding cheap.
class Out {
 public:
  explicit Out(std::uint8_t* p) : p_(p) {}

  void u8(std::uint8_t v) { *p_++ = v; }
  void u16(std::uint16_t v) {
    p_[0] = static_cast<std::uint8_t>(v >> 8);
    p_[1] = static_cast<std::uint8_t>(v);
    p_ += 2;
  }
  void u32(std::uint32_t v) {
    p_[0] = static_cast<std::uint8_t>(v >> 24);
    p_[1] = static_cast<std::uint8_t>(v >> 16);
    p_[2] = static_cast<std::uint8_t>(v >> 8);
    p_[3] = static_cast<std::uint8_t>(v);
    p_ += 4;
  }
  void i32(std::int32_t v) { u32(static_cast<std::uint32_t>(v)); }
  void u64(std::uint64_t v) {
    u32(static_cast<std::uint32_t>(v >> 32));
    u32(static_cast<std::uint32_t>(v));
  }
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void raw(const std::string& s) {
    if (!s.empty()) std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  // Postgres names and strings never contain NUL; the model's strings must not either.
  void cstr(const std::string& s) {
    raw(s);
    *p_++ = 0;
  }
  const std::uint8_t* position() const { return p_; }

 private:
  std::uint8_t* p_;
};

void put_tag(Out& out, Tag tag) {
  out.u8(static_cast<std::uint8_t>(tag));
}
void put_lsn(Out& out, Lsn lsn) {
  out.u64(lsn.value());
}
void put_xid(Out& out, const std::optional<Xid>& xid) {
  if (xid) out.u32(*xid);
}

// TupleData: Int16 column count, then per column a kind byte and, for 't' and 'b', an Int32
// length and the bytes.
void put_tuple(Out& out, const Tuple& tuple) {
  out.u16(static_cast<std::uint16_t>(tuple.columns.size()));
  for (const TupleValue& v : tuple.columns) {
    out.u8(static_cast<std::uint8_t>(v.kind));
    if (v.kind == ValueKind::kText || v.kind == ValueKind::kBinary) {
      out.i32(static_cast<std::int32_t>(v.bytes.size()));
      out.raw(v.bytes);
    }
  }
}

struct Writer {
  Out& out;

  void operator()(const Begin& m) {
    put_tag(out, Tag::kBegin);
    put_lsn(out, m.final_lsn);
    out.i64(m.commit_time);
    out.u32(m.xid);
  }
  void operator()(const Commit& m) {
    put_tag(out, Tag::kCommit);
    out.u8(0);  // flags, unused
    put_lsn(out, m.commit_lsn);
    put_lsn(out, m.end_lsn);
    out.i64(m.commit_time);
  }
  void operator()(const Origin& m) {
    put_tag(out, Tag::kOrigin);
    put_lsn(out, m.origin_lsn);
    out.cstr(m.name);
  }
  void operator()(const Relation& m) {
    put_tag(out, Tag::kRelation);
    put_xid(out, m.xid);
    out.u32(m.oid);
    out.cstr(m.namespace_name);
    out.cstr(m.name);
    out.u8(static_cast<std::uint8_t>(m.replica_identity));
    out.u16(static_cast<std::uint16_t>(m.columns.size()));
    for (const Column& c : m.columns) {
      out.u8(c.flags);
      out.cstr(c.name);
      out.u32(c.type_oid);
      out.i32(c.type_modifier);
    }
  }
  void operator()(const Type& m) {
    put_tag(out, Tag::kType);
    put_xid(out, m.xid);
    out.u32(m.oid);
    out.cstr(m.namespace_name);
    out.cstr(m.name);
  }
  void operator()(const Insert& m) {
    put_tag(out, Tag::kInsert);
    put_xid(out, m.xid);
    out.u32(m.relation_oid);
    out.u8('N');
    put_tuple(out, m.new_tuple);
  }
  void operator()(const Update& m) {
    put_tag(out, Tag::kUpdate);
    put_xid(out, m.xid);
    out.u32(m.relation_oid);
    if (m.old) {
      out.u8(static_cast<std::uint8_t>(m.old->kind));
      put_tuple(out, m.old->tuple);
    }
    out.u8('N');
    put_tuple(out, m.new_tuple);
  }
  void operator()(const Delete& m) {
    put_tag(out, Tag::kDelete);
    put_xid(out, m.xid);
    out.u32(m.relation_oid);
    out.u8(static_cast<std::uint8_t>(m.old.kind));
    put_tuple(out, m.old.tuple);
  }
  void operator()(const Truncate& m) {
    put_tag(out, Tag::kTruncate);
    put_xid(out, m.xid);
    out.i32(static_cast<std::int32_t>(m.relation_oids.size()));
    std::uint8_t options = 0;
    if (m.cascade) options |= kTruncateCascade;
    if (m.restart_identity) options |= kTruncateRestartIdentity;
    out.u8(options);
    for (Oid oid : m.relation_oids) out.u32(oid);
  }
  void operator()(const LogicalMessage& m) {
    put_tag(out, Tag::kMessage);
    put_xid(out, m.xid);
    out.u8(m.transactional ? kMessageTransactional : 0);
    put_lsn(out, m.lsn);
    out.cstr(m.prefix);
    out.i32(static_cast<std::int32_t>(m.content.size()));
    out.raw(m.content);
  }
  void operator()(const StreamStart& m) {
    put_tag(out, Tag::kStreamStart);
    out.u32(m.xid);
    out.u8(m.first_segment ? 1 : 0);
  }
  void operator()(const StreamStop&) { put_tag(out, Tag::kStreamStop); }
  void operator()(const StreamCommit& m) {
    put_tag(out, Tag::kStreamCommit);
    out.u32(m.xid);
    out.u8(0);  // flags, unused
    put_lsn(out, m.commit_lsn);
    put_lsn(out, m.end_lsn);
    out.i64(m.commit_time);
  }
  void operator()(const StreamAbort& m) {
    put_tag(out, Tag::kStreamAbort);
    out.u32(m.xid);
    out.u32(m.subxid);
    if (m.abort_info) {
      put_lsn(out, m.abort_info->abort_lsn);
      out.i64(m.abort_info->abort_time);
    }
  }
  void operator()(const BeginPrepare& m) {
    put_tag(out, Tag::kBeginPrepare);
    put_lsn(out, m.prepare_lsn);
    put_lsn(out, m.end_lsn);
    out.i64(m.prepare_time);
    out.u32(m.xid);
    out.cstr(m.gid);
  }
  // Prepare and Stream Prepare share one layout, including the unused flags byte.
  void prepare_common(Tag tag, Lsn prepare_lsn, Lsn end_lsn, Timestamp prepare_time, Xid xid,
                      const std::string& gid) {
    put_tag(out, tag);
    out.u8(0);  // flags, unused
    put_lsn(out, prepare_lsn);
    put_lsn(out, end_lsn);
    out.i64(prepare_time);
    out.u32(xid);
    out.cstr(gid);
  }
  void operator()(const Prepare& m) {
    prepare_common(Tag::kPrepare, m.prepare_lsn, m.end_lsn, m.prepare_time, m.xid, m.gid);
  }
  void operator()(const StreamPrepare& m) {
    prepare_common(Tag::kStreamPrepare, m.prepare_lsn, m.end_lsn, m.prepare_time, m.xid, m.gid);
  }
  void operator()(const CommitPrepared& m) {
    put_tag(out, Tag::kCommitPrepared);
    out.u8(0);  // flags, unused
    put_lsn(out, m.commit_lsn);
    put_lsn(out, m.end_lsn);
    out.i64(m.commit_time);
    out.u32(m.xid);
    out.cstr(m.gid);
  }
  void operator()(const RollbackPrepared& m) {
    put_tag(out, Tag::kRollbackPrepared);
    out.u8(0);  // flags, unused
    put_lsn(out, m.prepare_end_lsn);
    put_lsn(out, m.rollback_end_lsn);
    out.i64(m.prepare_time);
    out.i64(m.rollback_time);
    out.u32(m.xid);
    out.cstr(m.gid);
  }
};

std::size_t xid_size(const std::optional<Xid>& xid) {
  return xid ? 4 : 0;
}
std::size_t cstr_size(const std::string& s) {
  return s.size() + 1;
}

std::size_t tuple_size(const Tuple& tuple) {
  std::size_t n = 2;
  for (const TupleValue& v : tuple.columns) {
    n += 1;
    if (v.kind == ValueKind::kText || v.kind == ValueKind::kBinary) n += 4 + v.bytes.size();
  }
  return n;
}

struct Sizer {
  std::size_t operator()(const Begin&) const { return 1 + 8 + 8 + 4; }
  std::size_t operator()(const Commit&) const { return 1 + 1 + 8 + 8 + 8; }
  std::size_t operator()(const Origin& m) const { return 1 + 8 + cstr_size(m.name); }
  std::size_t operator()(const Relation& m) const {
    std::size_t n =
        1 + xid_size(m.xid) + 4 + cstr_size(m.namespace_name) + cstr_size(m.name) + 1 + 2;
    for (const Column& c : m.columns) n += 1 + cstr_size(c.name) + 4 + 4;
    return n;
  }
  std::size_t operator()(const Type& m) const {
    return 1 + xid_size(m.xid) + 4 + cstr_size(m.namespace_name) + cstr_size(m.name);
  }
  std::size_t operator()(const Insert& m) const {
    return 1 + xid_size(m.xid) + 4 + 1 + tuple_size(m.new_tuple);
  }
  std::size_t operator()(const Update& m) const {
    return 1 + xid_size(m.xid) + 4 + (m.old ? 1 + tuple_size(m.old->tuple) : 0) + 1 +
           tuple_size(m.new_tuple);
  }
  std::size_t operator()(const Delete& m) const {
    return 1 + xid_size(m.xid) + 4 + 1 + tuple_size(m.old.tuple);
  }
  std::size_t operator()(const Truncate& m) const {
    return 1 + xid_size(m.xid) + 4 + 1 + 4 * m.relation_oids.size();
  }
  std::size_t operator()(const LogicalMessage& m) const {
    return 1 + xid_size(m.xid) + 1 + 8 + cstr_size(m.prefix) + 4 + m.content.size();
  }
  std::size_t operator()(const StreamStart&) const { return 1 + 4 + 1; }
  std::size_t operator()(const StreamStop&) const { return 1; }
  std::size_t operator()(const StreamCommit&) const { return 1 + 4 + 1 + 8 + 8 + 8; }
  std::size_t operator()(const StreamAbort& m) const {
    return 1 + 4 + 4 + (m.abort_info ? 8 + 8 : 0);
  }
  std::size_t operator()(const BeginPrepare& m) const {
    return 1 + 8 + 8 + 8 + 4 + cstr_size(m.gid);
  }
  std::size_t operator()(const Prepare& m) const {
    return 1 + 1 + 8 + 8 + 8 + 4 + cstr_size(m.gid);
  }
  std::size_t operator()(const StreamPrepare& m) const {
    return 1 + 1 + 8 + 8 + 8 + 4 + cstr_size(m.gid);
  }
  std::size_t operator()(const CommitPrepared& m) const {
    return 1 + 1 + 8 + 8 + 8 + 4 + cstr_size(m.gid);
  }
  std::size_t operator()(const RollbackPrepared& m) const {
    return 1 + 1 + 8 + 8 + 8 + 8 + 4 + cstr_size(m.gid);
  }
};

}  // namespace

void encode(const Message& message, ByteWriter& out) {
  // ByteWriter appends field by field; size once and write in place instead.
  Bytes buf = std::move(out).take();
  const std::size_t start = buf.size();
  const std::size_t size = encoded_size(message);
  buf.resize(start + size);
  Out writer(buf.data() + start);
  std::visit(Writer{writer}, message);
  assert(writer.position() == buf.data() + buf.size());
  out = ByteWriter(std::move(buf));
}

Bytes encode(const Message& message) {
  Bytes buf(encoded_size(message));
  Out writer(buf.data());
  std::visit(Writer{writer}, message);
  assert(writer.position() == buf.data() + buf.size());
  return buf;
}

std::size_t encoded_size(const Message& message) {
  return std::visit(Sizer{}, message);
}

}  // namespace pgrelay::pgoutput
