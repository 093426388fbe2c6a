// Assembles transactions with their schema records; moves large ones to spill files.
#include "log/transaction_builder.h"

#include <limits>
#include <vector>

#include "pgoutput/encoder.h"

namespace pgrelay::log {

namespace {

Error not_open(const char* what) {
  return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                     std::string("cannot ") + what + ": no transaction is being built",
                     "Call begin() first.");
}

Error invalid(std::string message, std::string hint = {}) {
  return Error::make(sqlstate::kInvalidParameterValue, std::move(message), std::move(hint));
}

}  // namespace

// --- SchemaCatalog ---

void SchemaCatalog::put(pgoutput::Relation relation) {
  relation.xid.reset();
  const pgoutput::Oid oid = relation.oid;
  relations_.insert_or_assign(oid,
                              Versioned<pgoutput::Relation>{std::move(relation), next_version_++});
}

void SchemaCatalog::put(pgoutput::Type type) {
  type.xid.reset();
  const pgoutput::Oid oid = type.oid;
  types_.insert_or_assign(oid, Versioned<pgoutput::Type>{std::move(type), next_version_++});
}

const pgoutput::Relation* SchemaCatalog::relation(pgoutput::Oid oid) const {
  auto it = relations_.find(oid);
  return it == relations_.end() ? nullptr : &it->second.value;
}

const pgoutput::Type* SchemaCatalog::type(pgoutput::Oid oid) const {
  auto it = types_.find(oid);
  return it == types_.end() ? nullptr : &it->second.value;
}

std::uint64_t SchemaCatalog::relation_version(pgoutput::Oid oid) const {
  auto it = relations_.find(oid);
  return it == relations_.end() ? 0 : it->second.version;
}

std::uint64_t SchemaCatalog::type_version(pgoutput::Oid oid) const {
  auto it = types_.find(oid);
  return it == types_.end() ? 0 : it->second.version;
}

// --- TransactionBuilder ---

TransactionBuilder::TransactionBuilder(const SchemaCatalog& catalog, BuilderOptions options)
    : catalog_(catalog), options_(std::move(options)) {}

TransactionBuilder::~TransactionBuilder() = default;

void TransactionBuilder::reset() {
  open_ = false;
  failed_.reset();
  out_ = ByteWriter();
  spill_.reset();
  size_ = 0;
  count_ = 0;
  marked_ = false;
  sent_relations_.clear();
  sent_types_.clear();
}

void TransactionBuilder::abort() {
  reset();
}

Status TransactionBuilder::failure(Error error) {
  failed_ = error;
  return error;
}

Status TransactionBuilder::begin(const TransactionHeader& header) {
  reset();
  open_ = true;
  header_ = header;
  return {};
}

void TransactionBuilder::set_origin(std::string name, Lsn origin_lsn) {
  header_.origin = std::move(name);
  header_.origin_lsn = origin_lsn;
}

Status TransactionBuilder::add(Lsn lsn, ChangeMessage message) {
  if (!open_) return not_open("add a change");
  if (failed_) return *failed_;

  // Everything the change needs is checked before anything is written, so a refused change
  // leaves the transaction as it was.
  std::vector<pgoutput::Oid> relations;
  Status refused = std::visit(
      [&](auto& m) -> Status {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Relation> || std::is_same_v<T, pgoutput::Type>) {
          return invalid("Relation and Type records cannot be added to a transaction directly",
                         "Put them into the SchemaCatalog; the builder adds them where needed.");
        } else {
          if constexpr (std::is_same_v<T, pgoutput::Truncate>) {
            relations = m.relation_oids;
          } else if constexpr (std::is_same_v<T, pgoutput::LogicalMessage>) {
            if (!m.transactional) {
              return invalid("a non-transactional logical message cannot be part of a transaction",
                             "Store it as its own entry with build_message_entry().");
            }
          } else {
            relations.push_back(m.relation_oid);
          }
          return {};
        }
      },
      message);
  if (!refused.ok()) return refused;
  for (pgoutput::Oid oid : relations) {
    if (catalog_.relation(oid) == nullptr) {
      return Error::make(sqlstate::kUndefinedObject,
                         "no Relation known for relation OID " + std::to_string(oid) +
                             " of the change at LSN " + lsn.to_string(),
                         "Upstream sends a Relation message before a table's first change; put "
                         "it into the SchemaCatalog.");
    }
  }
  const bool marker = publications_marker(message) != nullptr;
  const pgoutput::Message wire = to_message(std::move(message));
  if (pgoutput::encoded_size(wire) > kMaxChangeMessageSize) {
    return Error::make(sqlstate::kProgramLimitExceeded,
                       "change at LSN " + lsn.to_string() + " is too large to store");
  }

  for (pgoutput::Oid oid : relations) PGRELAY_TRY(ensure_relation(lsn, oid));
  PGRELAY_TRY(append(lsn, wire));
  marked_ = marked_ || marker;
  return {};
}

Status TransactionBuilder::ensure_relation(Lsn lsn, pgoutput::Oid oid) {
  const std::uint64_t version = catalog_.relation_version(oid);
  auto sent = sent_relations_.find(oid);
  if (sent != sent_relations_.end() && sent->second == version) return {};
  const pgoutput::Relation& rel = *catalog_.relation(oid);
  // Types first, as pgoutput sends them, so a reader knows them when it sees the Relation.
  for (const pgoutput::Column& column : rel.columns) {
    const pgoutput::Type* type = catalog_.type(column.type_oid);
    if (type == nullptr) continue;
    const std::uint64_t type_version = catalog_.type_version(column.type_oid);
    auto& sent_type = sent_types_[column.type_oid];
    if (sent_type == type_version) continue;
    PGRELAY_TRY(append(lsn, pgoutput::Message(*type)));
    sent_type = type_version;
  }
  PGRELAY_TRY(append(lsn, pgoutput::Message(rel)));
  sent_relations_[oid] = version;
  return {};
}

Status TransactionBuilder::append(Lsn lsn, const pgoutput::Message& message) {
  if (count_ == std::numeric_limits<std::uint32_t>::max()) {
    return failure(Error::make(
        sqlstate::kProgramLimitExceeded,
        "transaction " + std::to_string(header_.xid) + " has too many changes to store"));
  }
  const std::size_t before = out_.size();
  PGRELAY_TRY(encode_change(header_.begin_lsn, lsn, message, out_));
  size_ += out_.size() - before;
  ++count_;
  if (spilled()) {
    if (out_.size() >= options_.spill_buffer) return flush_spill();
  } else if (size_ > options_.spill_threshold) {
    return start_spill();
  }
  return {};
}

Status TransactionBuilder::start_spill() {
  const std::string& dir = options_.spill_dir;
  if (dir.empty()) {
    return failure(invalid("transaction " + std::to_string(header_.xid) +
                           " passed the spill "
                           "threshold of " +
                           std::to_string(options_.spill_threshold) +
                           " bytes, but no spill directory is configured"));
  }
  ByteWriter meta;
  encode_entry_meta(entry_meta(EntryKind::kTransaction, header_, 0), meta);
  auto writer =
      SpillWriter::create(dir, "xid-" + std::to_string(header_.xid) + ".spill", meta.size());
  if (!writer.ok()) return failure(writer.error());
  spill_.emplace(std::move(*writer));
  PGRELAY_TRY(flush_spill());
  // The in-memory buffer grew to the threshold; give it back.
  out_ = ByteWriter();
  return {};
}

Result<TransactionBuilder::SpillForReading> TransactionBuilder::spill_for_reading() const {
  if (!spill_) return invalid("transaction " + std::to_string(header_.xid) + " has not spilled");
  auto file = spill_->reopen_for_reading();
  if (!file.ok()) return file.error();
  return SpillForReading{std::move(*file), spill_->data_start(), spill_->name()};
}

Status TransactionBuilder::flush_spill() {
  if (Status st = spill_->write(out_.bytes()); !st.ok()) return failure(st.error());
  Bytes buf = std::move(out_).take();
  buf.clear();
  // One huge change may have grown the buffer far beyond its usual size.
  if (buf.capacity() > 4 * options_.spill_buffer) Bytes().swap(buf);
  out_ = ByteWriter(std::move(buf));
  return {};
}

Result<BuiltEntry> TransactionBuilder::finish() {
  if (!open_) return not_open("finish a transaction");
  if (failed_) return *failed_;
  BuiltEntry entry;
  entry.meta = entry_meta(EntryKind::kTransaction, header_, count_);
  entry.marked = marked_;
  if (spilled()) {
    PGRELAY_TRY(flush_spill());
    auto file = spill_->finish();
    if (!file.ok()) {
      (void)failure(file.error());
      return file.error();
    }
    entry.spill = std::move(*file);
  } else {
    entry.data = std::move(out_).take();
  }
  reset();
  return entry;
}

Status TransactionBuilder::rewind(const Mark& mark) {
  if (!open_) return not_open("rewind a transaction");
  if (failed_) return *failed_;
  if (mark.size > size_ || mark.count > count_) {
    return invalid("cannot rewind transaction " + std::to_string(header_.xid) +
                   " to a point it has not reached");
  }
  const std::uint64_t in_file = size_ - out_.size();
  if (mark.size >= in_file) {
    out_.truncate(static_cast<std::size_t>(mark.size - in_file));
  } else {
    // The point is in the spill file: cut the file there and write on from it.
    out_.truncate(0);
    if (Status st = spill_->rewind(mark.size); !st.ok()) return failure(st.error());
  }
  size_ = mark.size;
  count_ = mark.count;
  marked_ = mark.marked;
  sent_relations_ = mark.sent_relations;
  sent_types_ = mark.sent_types;
  return {};
}

Result<BuiltEntry> TransactionBuilder::finish(Lsn commit_lsn, Lsn end_lsn) {
  if (!open_) return not_open("finish a transaction");
  header_.commit_lsn = commit_lsn;
  header_.end_lsn = end_lsn;
  return finish();
}

Result<BuiltEntry> build_message_entry(const TransactionHeader& header, Lsn lsn,
                                       pgoutput::LogicalMessage message) {
  if (message.transactional) {
    return invalid("a transactional logical message belongs to its transaction",
                   "Add it to the transaction with TransactionBuilder::add().");
  }
  message.xid.reset();
  const bool message_marked = message.prefix == kPublicationsChangedPrefix;
  ByteWriter out;
  PGRELAY_TRY(encode_change(header.begin_lsn, lsn, pgoutput::Message(std::move(message)), out));
  BuiltEntry entry;
  entry.meta = entry_meta(EntryKind::kMessage, header, 1);
  entry.marked = message_marked;
  entry.data = std::move(out).take();
  return entry;
}

std::optional<std::int64_t> last_commit_time(std::span<const BuiltEntry> entries) {
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (it->meta.kind == EntryKind::kTransaction) return it->meta.commit_time;
  }
  return std::nullopt;
}

}  // namespace pgrelay::log
