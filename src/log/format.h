// The on-disk format of log segments: segment header, record framing and entry metadata.
//
// A segment file is a 32-byte header followed by records:
//
//   record := crc32c:u32 | length:u32 | type:u8 | flags:u8 | payload[length]
//
// The CRC covers length, type, flags and payload, so a torn length is detected as surely as a
// torn payload. An *entry* (one committed transaction, one non-transactional message, or one
// capture checkpoint) is a FULL record, or a FIRST, any number of MIDDLE and a LAST record;
// FULL and FIRST payloads begin with the entry's metadata. Appends are batches of entries; the
// last record of a batch carries kEndOfBatch, and recovery keeps exactly the prefix of a segment
// that ends with such a record, so a batch (and therefore a transaction) is all or nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/bytes.h"
#include "base/result.h"
#include "wire/lsn.h"

namespace pgrelay::log {

using wire::Lsn;

inline constexpr char kSegmentMagic[8] = {'P', 'G', 'R', 'L', 'S', 'E', 'G', '1'};
inline constexpr std::uint32_t kFormatVersion = 1;
inline constexpr std::size_t kSegmentHeaderSize = 32;
inline constexpr std::size_t kRecordHeaderSize = 10;
// Largest payload of one record; an entry larger than this is split into FIRST/MIDDLE/LAST.
inline constexpr std::size_t kMaxRecordPayload = 256 * 1024;

enum class RecordType : std::uint8_t {
  kFull = 1,
  kFirst = 2,
  kMiddle = 3,
  kLast = 4,
};

enum RecordFlags : std::uint8_t {
  kEndOfBatch = 1,
};

struct RecordHeader {
  std::uint32_t crc = 0;
  std::uint32_t length = 0;
  RecordType type = RecordType::kFull;
  std::uint8_t flags = 0;
};

// What an entry is.
enum class EntryKind : std::uint8_t {
  kTransaction = 1,  // a committed transaction: its changes follow the metadata
  kMessage = 2,      // a non-transactional logical message (pg_logical_emit_message(false, ...))
  kCheckpoint = 3,   // capture state persisted atomically with a batch; invisible to readers
};

// Metadata of an entry, stored at the start of its FULL/FIRST record.
struct EntryMeta {
  EntryKind kind = EntryKind::kTransaction;
  Lsn begin_lsn;   // first change (Begin's XLogData start)
  Lsn commit_lsn;  // ordering key: Begin's final LSN and Commit's commit LSN
  Lsn end_lsn;     // end of the commit record: what a consumer confirms after the commit
  std::int64_t commit_time = 0;  // microseconds since 2000-01-01, as pgoutput sends
  std::uint32_t xid = 0;
  std::uint32_t change_count = 0;
  std::string origin;  // replication origin name, empty when none
  Lsn origin_lsn;

  bool operator==(const EntryMeta&) const = default;
};

void encode_entry_meta(const EntryMeta& meta, ByteWriter& out);
// Parses metadata from the start of a FULL/FIRST payload, leaving `in` at the entry's data.
Result<EntryMeta> decode_entry_meta(ByteReader& in);

void encode_segment_header(std::uint64_t segment_seq, ByteWriter& out);
// Validates a segment header; `file` names the file in the error.
Result<std::uint64_t> decode_segment_header(ByteView header, const std::string& file);

// Writes a record header (computing the CRC over header fields and payload) followed by payload.
void append_record(RecordType type, std::uint8_t flags, ByteView payload, ByteWriter& out);

// Parses and verifies one record at the start of `data`. Returns the header, or nullopt when
// `data` is too short to hold the whole record (a torn tail). A CRC mismatch or impossible field
// yields an Error.
struct ParsedRecord {
  RecordHeader header;
  ByteView payload;
  std::size_t total_size = 0;
};
enum class RecordStatus { kOk, kIncomplete, kCorrupt };
RecordStatus parse_record(ByteView data, ParsedRecord* out, std::string* why);

}  // namespace pgrelay::log
