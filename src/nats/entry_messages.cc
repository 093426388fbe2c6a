// The NATS messages one log entry is published as: a JSON message per change, then its bytes.
#include "nats/entry_messages.h"

#include <algorithm>
#include <string_view>
#include <type_traits>
#include <variant>

#include "pgoutput/message_json.h"

namespace pgrelay::nats {

namespace {

// The change messages a change is published as: one per row change, logical message and
// truncated table; none for Relation and Type records and capture's publications markers.
std::uint32_t messages_of(const log::ChangeMessage& message) {
  return std::visit(
      [&](const auto& m) -> std::uint32_t {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Insert> || std::is_same_v<T, pgoutput::Update> ||
                      std::is_same_v<T, pgoutput::Delete>) {
          return 1;
        } else if constexpr (std::is_same_v<T, pgoutput::Truncate>) {
          return static_cast<std::uint32_t>(m.relation_oids.size());
        } else if constexpr (std::is_same_v<T, pgoutput::LogicalMessage>) {
          return log::publications_marker(message) == nullptr ? 1 : 0;
        } else {
          return 0;
        }
      },
      message);
}

class ReaderRelations final : public pgoutput::RelationLookup {
 public:
  explicit ReaderRelations(const log::ChangeReader& reader) : reader_(reader) {}
  const pgoutput::Relation* find(pgoutput::Oid oid) const override { return reader_.relation(oid); }

 private:
  const log::ChangeReader& reader_;
};

}  // namespace

EntryMessages::EntryMessages(const log::EntryMeta& meta, ByteView data, const Subjects& subjects,
                             std::size_t part_size)
    : meta_(meta), data_(data), subjects_(&subjects), part_size_(part_size), reader_(meta) {}

Result<EntryMessages> EntryMessages::make(const log::EntryMeta& meta, ByteView data,
                                          const Subjects& subjects, std::size_t part_size) {
  EntryMessages out(meta, data, subjects, std::max<std::size_t>(part_size, 1));
  log::ChangeReader counter(meta);
  counter.feed(data);
  for (;;) {
    auto change = counter.next();
    PGRELAY_TRY(change);
    if (!*change) break;
    out.change_count_ += messages_of((*change)->message);
  }
  PGRELAY_TRY(counter.finish());
  ByteWriter bytes;
  log::encode_entry_meta(meta, bytes);
  out.meta_bytes_ = std::move(bytes).take();
  const std::size_t total = out.meta_bytes_.size() + data.size();
  out.part_count_ = static_cast<std::uint32_t>(
      std::max<std::size_t>(1, (total + out.part_size_ - 1) / out.part_size_));
  out.reader_.feed(out.data_);
  return out;
}

Status EntryMessages::skip(std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    auto message = next();
    PGRELAY_TRY(message);
    if (!*message) break;
  }
  return {};
}

Result<bool> EntryMessages::render_next_change() {
  for (;;) {
    auto change = reader_.next();
    PGRELAY_TRY(change);
    if (!*change) {
      PGRELAY_TRY(reader_.finish());
      return false;
    }
    const log::Change& c = **change;
    const std::uint32_t n = messages_of(c.message);
    if (n == 0) continue;
    // The subjects, in the order append_json_lines writes the change's lines.
    std::vector<std::string> subjects;
    bool unknown_relation = false;
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          auto subject_of = [&](pgoutput::Oid oid) {
            const pgoutput::Relation* relation = reader_.relation(oid);
            if (relation == nullptr) {
              unknown_relation = true;
              return;
            }
            subjects.push_back(subjects_->table(relation->schema(), relation->name));
          };
          if constexpr (std::is_same_v<T, pgoutput::Truncate>) {
            for (pgoutput::Oid oid : m.relation_oids) subject_of(oid);
          } else if constexpr (std::is_same_v<T, pgoutput::LogicalMessage>) {
            subjects.push_back(subjects_->messages());
          } else if constexpr (std::is_same_v<T, pgoutput::Insert> ||
                               std::is_same_v<T, pgoutput::Update> ||
                               std::is_same_v<T, pgoutput::Delete>) {
            subject_of(m.relation_oid);
          }
        },
        c.message);
    if (unknown_relation) {
      return Error::make(sqlstate::kDataCorrupted,
                         "the change at " + c.lsn.to_string() +
                             " of the transaction committed at " + meta_.commit_lsn.to_string() +
                             " names a table it never describes",
                         "Run `pgrelay log verify` on the data directory.");
    }
    const pgoutput::TransactionInfo txn{meta_.xid, meta_.commit_time};
    std::string lines;
    pgoutput::append_json_lines(log::to_message(c.message), c.lsn,
                                meta_.kind == log::EntryKind::kTransaction ? &txn : nullptr,
                                ReaderRelations(reader_), lines);
    std::size_t start = 0;
    for (const std::string& subject : subjects) {
      const std::size_t end = lines.find('\n', start);
      // Each line is a JSON object: the three fields go in before its closing brace.
      std::string payload = lines.substr(start, end - start - 1);
      payload += ",\"commit_lsn\":\"" + meta_.commit_lsn.to_string() +
                 "\",\"index\":" + std::to_string(next_change_) +
                 ",\"count\":" + std::to_string(change_count_) + "}";
      pending_.push_back(OutMessage{subject, MessageId{meta_.commit_lsn, false, next_change_},
                                    c.lsn, std::move(payload), false});
      ++next_change_;
      start = end + 1;
    }
    return true;
  }
}

OutMessage EntryMessages::part(std::uint32_t k) const {
  // Bytes [begin, end) of the metadata followed by the data, taken from each in place.
  const std::size_t total = meta_bytes_.size() + data_.size();
  const std::size_t begin = std::size_t{k} * part_size_;
  const std::size_t end = std::min(total, begin + part_size_);
  std::string payload;
  payload.reserve(end - begin);
  auto take = [&](ByteView from, std::size_t at) {  // `from` starts at offset `at` of the whole
    const std::size_t lo = std::max(begin, at);
    const std::size_t hi = std::min(end, at + from.size());
    if (lo < hi) payload.append(reinterpret_cast<const char*>(from.data()) + (lo - at), hi - lo);
  };
  take(meta_bytes_, 0);
  take(data_, meta_bytes_.size());
  return OutMessage{subjects_->transactions(), MessageId{meta_.commit_lsn, true, k},
                    meta_.commit_lsn, std::move(payload), k + 1 == part_count_};
}

Result<std::optional<OutMessage>> EntryMessages::next() {
  if (returned_ >= size()) return std::optional<OutMessage>();
  if (returned_ < change_count_) {
    if (pending_.empty()) {
      auto rendered = render_next_change();
      PGRELAY_TRY(rendered);
      if (!*rendered || pending_.empty()) {
        return Error::make(sqlstate::kInternalError,
                           "the transaction committed at " + meta_.commit_lsn.to_string() +
                               " gave fewer change messages than it counted");
      }
    }
    OutMessage message = std::move(pending_.front());
    pending_.pop_front();
    ++returned_;
    return std::optional<OutMessage>(std::move(message));
  }
  const auto k = static_cast<std::uint32_t>(returned_ - change_count_);
  ++returned_;
  return std::optional<OutMessage>(part(k));
}

}  // namespace pgrelay::nats
