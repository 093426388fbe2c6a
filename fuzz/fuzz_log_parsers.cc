// Fuzzes the change log's on-disk parsers: record framing, entry metadata, the manifest, the
// slots file and the change decoder; whatever they accept must re-encode to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "log/format.h"
#include "log/manifest.h"
#include "log/slots.h"
#include "log/transaction.h"

using namespace pgrelay;
using namespace pgrelay::log;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Record framing over a buffer, as a segment scan reads it.
void fuzz_records(ByteView data) {
  while (!data.empty()) {
    ParsedRecord rec;
    std::string why;
    if (parse_record(data, &rec, &why) != RecordStatus::kOk) return;
    check(rec.total_size == kRecordHeaderSize + rec.payload.size() && rec.total_size <= data.size());
    ByteWriter again;
    append_record(rec.header.type, rec.header.flags, rec.payload, again);
    check(Bytes(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(rec.total_size)) ==
          again.bytes());
    if (rec.header.type == RecordType::kFull || rec.header.type == RecordType::kFirst) {
      ByteReader r(rec.payload);
      auto meta = decode_entry_meta(r);
      if (meta.ok()) {
        ByteWriter w;
        encode_entry_meta(*meta, w);
        ByteReader back(w.bytes());
        auto meta2 = decode_entry_meta(back);
        check(meta2.ok() && *meta2 == *meta);
      }
    }
    data = data.subspan(rec.total_size);
  }
}

void fuzz_manifest(ByteView data) {
  auto m = parse_manifest(data, "MANIFEST");
  if (!m.ok()) return;
  auto again = parse_manifest(serialize_manifest(*m), "MANIFEST");
  check(again.ok() && *again == *m);
}

void fuzz_slots(ByteView data) {
  auto slots = parse_slots(data, "slots");
  if (!slots.ok()) return;
  auto again = parse_slots(serialize_slots(*slots), "slots");
  check(again.ok() && again->size() == slots->size());
  check(serialize_slots(*again) == serialize_slots(*slots));
}

// The change decoder, fed in two pieces; a fully accepted entry re-encodes to its bytes.
void fuzz_changes(std::uint8_t count, std::uint8_t cut, ByteView data) {
  EntryMeta meta;
  meta.kind = (count & 0x80) ? EntryKind::kMessage : EntryKind::kTransaction;
  meta.begin_lsn = Lsn(0x1000);
  meta.commit_lsn = Lsn(0x2000);
  meta.end_lsn = Lsn(0x2001);
  meta.change_count = count & 0x7F;
  ChangeReader reader(meta);
  std::size_t split = data.empty() ? 0 : cut % (data.size() + 1);
  ByteWriter reencoded;
  for (ByteView piece : {data.subspan(0, split), data.subspan(split)}) {
    reader.feed(piece);
    while (true) {
      auto change = reader.next();
      if (!change.ok()) return;
      if (!*change) break;
      check(encode_change(meta.begin_lsn, (*change)->lsn, to_message((*change)->message), reencoded).ok());
    }
  }
  if (!reader.finish().ok()) return;
  check(reencoded.bytes() == Bytes(data.begin(), data.end()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  if (size < 3) return 0;
  ByteView data(bytes + 3, size - 3);
  switch (bytes[0] % 4) {
    case 0: fuzz_records(data); break;
    case 1: fuzz_manifest(data); break;
    case 2: fuzz_slots(data); break;
    default: fuzz_changes(bytes[1], bytes[2], data); break;
  }
  return 0;
}
