// Encodes transactions as change records and decodes them piece by piece with validation.
#include "log/transaction.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "pgoutput/encoder.h"

namespace pgrelay::log {

namespace {

template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

std::uint32_t load_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

std::uint64_t load_u64(const std::uint8_t* p) {
  return (std::uint64_t{load_u32(p)} << 32) | load_u32(p + 4);
}

}  // namespace

TransactionHeader header_of(const EntryMeta& meta) {
  TransactionHeader h;
  h.begin_lsn = meta.begin_lsn;
  h.commit_lsn = meta.commit_lsn;
  h.end_lsn = meta.end_lsn;
  h.commit_time = meta.commit_time;
  h.xid = meta.xid;
  h.origin = meta.origin;
  h.origin_lsn = meta.origin_lsn;
  return h;
}

EntryMeta entry_meta(EntryKind kind, const TransactionHeader& header, std::uint32_t change_count) {
  EntryMeta m;
  m.kind = kind;
  m.begin_lsn = header.begin_lsn;
  m.commit_lsn = header.commit_lsn;
  m.end_lsn = header.end_lsn;
  m.commit_time = header.commit_time;
  m.xid = header.xid;
  m.change_count = change_count;
  m.origin = header.origin;
  m.origin_lsn = header.origin_lsn;
  return m;
}

std::size_t encoded_change_size(const pgoutput::Message& message) {
  return kChangeHeaderSize + pgoutput::encoded_size(message);
}

Status encode_change(Lsn begin_lsn, Lsn lsn, const pgoutput::Message& message, ByteWriter& out) {
  if (lsn < begin_lsn) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "change LSN " + lsn.to_string() + " precedes its transaction's begin LSN " +
                           begin_lsn.to_string());
  }
  const std::size_t size = pgoutput::encoded_size(message);
  if (size > kMaxChangeMessageSize) {
    return Error::make(
        sqlstate::kProgramLimitExceeded,
        "change at LSN " + lsn.to_string() + " is too large to store: " + std::to_string(size) +
            " bytes",
        {}, "A pgoutput message is at most " + std::to_string(kMaxChangeMessageSize) + " bytes.");
  }
  out.u32(static_cast<std::uint32_t>(size));
  out.u64(lsn - begin_lsn);
  pgoutput::encode(message, out);
  return {};
}

pgoutput::Message to_message(ChangeMessage message) {
  return std::visit(
      [](auto&& m) {
        m.xid.reset();
        return pgoutput::Message(std::move(m));
      },
      std::move(message));
}

const pgoutput::LogicalMessage* publications_marker(const ChangeMessage& message) {
  const auto* m = std::get_if<pgoutput::LogicalMessage>(&message);
  return m != nullptr && m->prefix == kPublicationsChangedPrefix ? m : nullptr;
}

Result<EncodedEntry> encode_transaction(const Transaction& txn) {
  if (txn.changes.size() > std::numeric_limits<std::uint32_t>::max()) {
    return Error::make(sqlstate::kProgramLimitExceeded, "transaction has too many changes");
  }
  ByteWriter out;
  bool marked = false;
  for (const Change& c : txn.changes) {
    PGRELAY_TRY(encode_change(txn.header.begin_lsn, c.lsn, to_message(c.message), out));
    marked = marked || publications_marker(c.message) != nullptr;
  }
  EncodedEntry entry{
      entry_meta(txn.kind, txn.header, static_cast<std::uint32_t>(txn.changes.size())),
      std::move(out).take(), marked};
  // Reading it back enforces the rules a reader relies on (Relation before changes, one
  // non-transactional message per message entry).
  ChangeReader check(entry.meta);
  check.checking_input_ = true;
  check.feed(entry.data);
  while (true) {
    auto c = check.next();
    if (!c.ok()) return c.take_error();
    if (!*c) break;
  }
  PGRELAY_TRY(check.finish());
  return entry;
}

// --- ChangeReader ---

ChangeReader::ChangeReader(const EntryMeta& meta)
    : meta_(meta), decoder_(pgoutput::DecoderOptions{}) {}

Error ChangeReader::fail(Error error) {
  failed_ = error;
  return error;
}

Error ChangeReader::corrupt(std::string why, std::optional<Lsn> lsn, std::string detail) const {
  std::string where = meta_.kind == EntryKind::kMessage
                          ? "logical message entry"
                          : "transaction " + std::to_string(meta_.xid);
  where += " (commit LSN " + meta_.commit_lsn.to_string() + ")";
  where += lsn ? " at change LSN " + lsn->to_string()
               : " at offset " + std::to_string(offset_) + " of its data";
  if (checking_input_) {
    return Error::make(sqlstate::kInvalidParameterValue, "cannot store " + where + ": " + why, {},
                       std::move(detail));
  }
  return Error::make(sqlstate::kDataCorrupted, "corrupt change data in " + where + ": " + why,
                     "Restore the data directory from a backup. To serve consumers again without "
                     "it, drop the slots that need this entry and create new ones.",
                     std::move(detail));
}

void ChangeReader::note_capacity() {
  peak_ = std::max(peak_, buf_.capacity());
}

void ChangeReader::take(std::size_t n) {
  n = std::min(n, piece_.size());
  buf_.insert(buf_.end(), piece_.begin(), piece_.begin() + static_cast<std::ptrdiff_t>(n));
  piece_ = piece_.subspan(n);
  note_capacity();
}

void ChangeReader::restart_at(std::uint64_t offset) {
  buf_.clear();
  piece_ = ByteView();
  offset_ = offset;
}

void ChangeReader::feed(ByteView piece) {
  if (!piece_.empty()) take(piece_.size());
  piece_ = piece;
}

Result<std::uint32_t> ChangeReader::record_length(ByteView header) {
  std::uint32_t len = load_u32(header.data());
  Lsn lsn = meta_.begin_lsn + load_u64(header.data() + 4);
  if (len == 0) return fail(corrupt("change of length 0", lsn));
  if (len > kMaxChangeMessageSize) {
    return fail(corrupt("change length " + std::to_string(len) + " exceeds the maximum of " +
                            std::to_string(kMaxChangeMessageSize),
                        lsn));
  }
  return len;
}

Result<std::optional<Change>> ChangeReader::next() {
  if (failed_) return *failed_;
  if (buf_.empty()) {
    // The common case: the whole change lies in the piece; decode it in place.
    if (piece_.size() >= kChangeHeaderSize) {
      auto len = record_length(piece_);
      if (!len.ok()) return len.error();
      const std::size_t total = kChangeHeaderSize + *len;
      if (piece_.size() >= total) {
        ByteView record = piece_.first(total);
        piece_ = piece_.subspan(total);
        return decode_record(record);
      }
      // Reserve only what has arrived: a damaged length must not allocate up to 1 GiB.
      buf_.reserve(std::min(total, piece_.size()));
    }
    take(piece_.size());
    return std::optional<Change>();
  }
  // A change split across pieces: complete it in the buffer.
  if (buf_.size() < kChangeHeaderSize) {
    take(kChangeHeaderSize - buf_.size());
    if (buf_.size() < kChangeHeaderSize) return std::optional<Change>();
  }
  auto len = record_length(buf_);
  if (!len.ok()) return len.error();
  const std::size_t total = kChangeHeaderSize + *len;
  if (buf_.size() < total) {
    buf_.reserve(std::min(total, buf_.size() + piece_.size()));
    take(total - buf_.size());
    if (buf_.size() < total) return std::optional<Change>();
  }
  auto change = decode_record(ByteView(buf_).first(total));
  // More than one change is buffered only when a piece was fed before the last was drained.
  buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(total));
  return change;
}

Result<std::optional<Change>> ChangeReader::decode_record(ByteView record) {
  const std::uint64_t offset = load_u64(record.data() + 4);
  if (offset > std::numeric_limits<std::uint64_t>::max() - meta_.begin_lsn.value()) {
    return fail(corrupt("change LSN offset " + std::to_string(offset) + " overflows", std::nullopt));
  }
  const Lsn lsn = meta_.begin_lsn + offset;
  if (meta_.kind != EntryKind::kTransaction && meta_.kind != EntryKind::kMessage) {
    return fail(corrupt("entry is neither a transaction nor a logical message", lsn));
  }
  if (meta_.kind == EntryKind::kMessage && changes_read_ > 0) {
    return fail(corrupt("a logical message entry holds more than one change", lsn));
  }
  if (changes_read_ >= meta_.change_count) {
    return fail(corrupt("entry holds more changes than the " + std::to_string(meta_.change_count) +
                            " its metadata declares",
                        lsn));
  }
  auto decoded = decoder_.decode(record.subspan(kChangeHeaderSize));
  if (!decoded.ok()) return fail(corrupt(decoded.error().message, lsn, decoded.error().detail));

  std::optional<std::string> wrong;
  std::optional<ChangeMessage> message = std::visit(
      Overloaded{
          [&](pgoutput::Relation& m) -> std::optional<ChangeMessage> { return std::move(m); },
          [&](pgoutput::Type& m) -> std::optional<ChangeMessage> { return std::move(m); },
          [&](pgoutput::Insert& m) -> std::optional<ChangeMessage> { return std::move(m); },
          [&](pgoutput::Update& m) -> std::optional<ChangeMessage> { return std::move(m); },
          [&](pgoutput::Delete& m) -> std::optional<ChangeMessage> { return std::move(m); },
          [&](pgoutput::Truncate& m) -> std::optional<ChangeMessage> { return std::move(m); },
          [&](pgoutput::LogicalMessage& m) -> std::optional<ChangeMessage> { return std::move(m); },
          [&](auto& m) -> std::optional<ChangeMessage> {
            wrong = pgoutput::tag_name(static_cast<char>(pgoutput::tag_of(pgoutput::Message(m))));
            return std::nullopt;
          },
      },
      *decoded);
  if (!message) return fail(corrupt("unexpected " + *wrong + " message among changes", lsn));

  const auto* logical = std::get_if<pgoutput::LogicalMessage>(&*message);
  if (meta_.kind == EntryKind::kMessage) {
    if (logical == nullptr || logical->transactional) {
      return fail(corrupt("a logical message entry must hold one non-transactional message", lsn));
    }
  } else if (logical != nullptr && !logical->transactional) {
    return fail(corrupt("non-transactional logical message inside a transaction", lsn));
  }
  offset_ += record.size();
  ++changes_read_;
  return std::optional<Change>(Change{lsn, std::move(*message)});
}

Status ChangeReader::finish() {
  if (failed_) return *failed_;
  if (!buf_.empty() || !piece_.empty()) {
    const std::size_t left = buf_.size() + piece_.size();
    return fail(corrupt(
        "data ends inside a change (" + std::to_string(left) + " bytes of a change left over)",
        std::nullopt));
  }
  if (changes_read_ != meta_.change_count) {
    return fail(corrupt("entry holds " + std::to_string(changes_read_) +
                            " changes but its metadata declares " +
                            std::to_string(meta_.change_count),
                        std::nullopt));
  }
  return {};
}

// --- EntryReader and whole-entry helpers ---

Result<std::optional<Change>> EntryReader::next() {
  while (true) {
    auto change = reader_.next();
    if (!change.ok() || *change || done_) return change;
    auto piece = cursor_.next_data();
    if (!piece.ok()) return piece.take_error();
    if (!*piece) {
      done_ = true;
      PGRELAY_TRY(reader_.finish());
      return std::optional<Change>();
    }
    reader_.feed(**piece);
  }
}

Result<Transaction> read_transaction(Cursor& cursor, const EntryMeta& meta) {
  Transaction txn;
  txn.kind = meta.kind;
  txn.header = header_of(meta);
  EntryReader reader(cursor, meta);
  while (true) {
    auto change = reader.next();
    if (!change.ok()) return change.take_error();
    if (!*change) return txn;
    txn.changes.push_back(std::move(**change));
  }
}

Result<Transaction> decode_transaction(const EntryMeta& meta, ByteView data) {
  Transaction txn;
  txn.kind = meta.kind;
  txn.header = header_of(meta);
  ChangeReader reader(meta);
  reader.feed(data);
  while (true) {
    auto change = reader.next();
    if (!change.ok()) return change.take_error();
    if (!*change) break;
    txn.changes.push_back(std::move(**change));
  }
  PGRELAY_TRY(reader.finish());
  return txn;
}

}  // namespace pgrelay::log
