// Encoding and verification of segment headers, record framing and entry metadata.
#include "log/format.h"

#include <cstring>

#include "log/crc32c.h"

namespace pgrelay::log {

void encode_entry_meta(const EntryMeta& meta, ByteWriter& out) {
  out.u8(static_cast<std::uint8_t>(meta.kind));
  out.u64(meta.begin_lsn.value());
  out.u64(meta.commit_lsn.value());
  out.u64(meta.end_lsn.value());
  out.i64(meta.commit_time);
  out.u32(meta.xid);
  out.u32(meta.change_count);
  out.u16(static_cast<std::uint16_t>(meta.origin.size()));
  out.raw(meta.origin);
  out.u64(meta.origin_lsn.value());
}

Result<EntryMeta> decode_entry_meta(ByteReader& in) {
  EntryMeta meta;
  std::uint8_t kind = in.u8();
  meta.begin_lsn = Lsn(in.u64());
  meta.commit_lsn = Lsn(in.u64());
  meta.end_lsn = Lsn(in.u64());
  meta.commit_time = in.i64();
  meta.xid = in.u32();
  meta.change_count = in.u32();
  std::uint16_t origin_len = in.u16();
  meta.origin = in.string(origin_len);
  meta.origin_lsn = Lsn(in.u64());
  if (!in.ok()) return Error::make(sqlstate::kDataCorrupted, "log entry metadata is truncated");
  if (kind < 1 || kind > 3) {
    return Error::make(sqlstate::kDataCorrupted,
                       "log entry has unknown kind " + std::to_string(kind));
  }
  meta.kind = static_cast<EntryKind>(kind);
  return meta;
}

void encode_segment_header(std::uint64_t segment_seq, ByteWriter& out) {
  ByteWriter h;
  h.raw(ByteView(reinterpret_cast<const std::uint8_t*>(kSegmentMagic), sizeof kSegmentMagic));
  h.u32(kFormatVersion);
  h.u64(segment_seq);
  h.u64(0);  // reserved
  std::uint32_t crc = crc32c(h.bytes());
  h.u32(crc);
  out.raw(h.bytes());
}

Result<std::uint64_t> decode_segment_header(ByteView header, const std::string& file) {
  auto corrupt = [&](const std::string& why) {
    return Error::make(sqlstate::kDataCorrupted, "log segment \"" + file + "\" has an invalid header: " + why,
                       "The file is not a pgrelay log segment or its first bytes are damaged. "
                       "Restore the data directory from a backup, or move the file away if it does "
                       "not belong there.");
  };
  if (header.size() < kSegmentHeaderSize) return corrupt("file is shorter than the header");
  if (std::memcmp(header.data(), kSegmentMagic, sizeof kSegmentMagic) != 0) {
    return corrupt("bad magic");
  }
  ByteReader r(header.subspan(0, kSegmentHeaderSize));
  r.bytes(sizeof kSegmentMagic);
  std::uint32_t version = r.u32();
  std::uint64_t seq = r.u64();
  r.u64();
  std::uint32_t stored_crc = r.u32();
  if (crc32c(header.subspan(0, kSegmentHeaderSize - 4)) != stored_crc) return corrupt("CRC mismatch");
  if (version != kFormatVersion) {
    return corrupt("format version " + std::to_string(version) + " is not supported (expected " +
                   std::to_string(kFormatVersion) + ")");
  }
  return seq;
}

void append_record(RecordType type, std::uint8_t flags, ByteView payload, ByteWriter& out) {
  std::uint8_t fields[6];
  auto length = static_cast<std::uint32_t>(payload.size());
  fields[0] = static_cast<std::uint8_t>(length >> 24);
  fields[1] = static_cast<std::uint8_t>(length >> 16);
  fields[2] = static_cast<std::uint8_t>(length >> 8);
  fields[3] = static_cast<std::uint8_t>(length);
  fields[4] = static_cast<std::uint8_t>(type);
  fields[5] = flags;
  std::uint32_t crc = crc32c_extend(crc32c_extend(0, fields, 6), payload.data(), payload.size());
  out.u32(crc);
  out.raw(ByteView(fields, 6));
  out.raw(payload);
}

RecordStatus parse_record(ByteView data, ParsedRecord* out, std::string* why) {
  if (data.size() < kRecordHeaderSize) {
    *why = "record header is cut short";
    return RecordStatus::kIncomplete;
  }
  ByteReader r(data);
  out->header.crc = r.u32();
  out->header.length = r.u32();
  std::uint8_t type = r.u8();
  out->header.flags = r.u8();
  if (type < 1 || type > 4 || (out->header.flags & ~kEndOfBatch) != 0 ||
      out->header.length > kMaxRecordPayload + 4096) {
    *why = "record header is invalid";
    return RecordStatus::kCorrupt;
  }
  if (data.size() - kRecordHeaderSize < out->header.length) {
    *why = "record payload is cut short";
    return RecordStatus::kIncomplete;
  }
  out->header.type = static_cast<RecordType>(type);
  out->payload = data.subspan(kRecordHeaderSize, out->header.length);
  std::uint32_t crc = crc32c_extend(0, data.data() + 4, 6);
  crc = crc32c_extend(crc, out->payload.data(), out->payload.size());
  if (crc != out->header.crc) {
    *why = "record CRC mismatch";
    return RecordStatus::kCorrupt;
  }
  out->total_size = kRecordHeaderSize + out->header.length;
  return RecordStatus::kOk;
}

}  // namespace pgrelay::log
