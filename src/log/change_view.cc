// Filters stored changes by table and operation, and reduces updates to deltas.
#include "log/change_view.h"

#include <algorithm>

namespace pgrelay::log {

namespace {

Error bad_name(std::string_view name, const std::string& why) {
  return Error::make(sqlstate::kInvalidName,
                     "invalid table name \"" + std::string(name) + "\": " + why,
                     "Write schema.table; double-quote names with upper case or dots.");
}

// Splits a qualified name into identifiers, following Postgres's rules for quoting and case.
Result<std::vector<std::string>> split_identifiers(std::string_view text) {
  std::vector<std::string> parts;
  std::size_t i = 0;
  while (true) {
    std::string part;
    if (i < text.size() && text[i] == '"') {
      ++i;
      bool closed = false;
      while (i < text.size()) {
        if (text[i] == '"') {
          if (i + 1 < text.size() && text[i + 1] == '"') {
            part += '"';
            i += 2;
            continue;
          }
          ++i;
          closed = true;
          break;
        }
        part += text[i++];
      }
      if (!closed) return bad_name(text, "unterminated quoted identifier");
      if (part.empty()) return bad_name(text, "zero-length quoted identifier");
    } else {
      while (i < text.size() && text[i] != '.') {
        const char c = text[i++];
        if (c == '"') return bad_name(text, "quote inside an unquoted identifier");
        part += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
      }
      if (part.empty()) return bad_name(text, "empty identifier");
    }
    parts.push_back(std::move(part));
    if (i == text.size()) return parts;
    if (text[i] != '.') return bad_name(text, "expected a dot after a quoted identifier");
    ++i;
  }
}

bool operation_allowed(OperationSet set, const ChangeMessage& message) {
  return std::visit(
      [set](const auto& m) -> bool {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Insert>) return (set & kOpInsert) != 0;
        if constexpr (std::is_same_v<T, pgoutput::Update>) return (set & kOpUpdate) != 0;
        if constexpr (std::is_same_v<T, pgoutput::Delete>) return (set & kOpDelete) != 0;
        if constexpr (std::is_same_v<T, pgoutput::Truncate>) return (set & kOpTruncate) != 0;
        if constexpr (std::is_same_v<T, pgoutput::LogicalMessage>) return (set & kOpMessage) != 0;
        return true;  // Relation and Type follow the changes they describe
      },
      message);
}

}  // namespace

// --- TableFilter ---

void TableFilter::add_table(std::string schema, std::string table) {
  names_.emplace(std::move(schema), std::move(table));
}

Status TableFilter::add_name(std::string_view qualified_name) {
  auto parts = split_identifiers(qualified_name);
  if (!parts.ok()) return parts.error();
  if (parts->size() == 1) {
    add_table("public", std::move((*parts)[0]));
  } else if (parts->size() == 2) {
    add_table(std::move((*parts)[0]), std::move((*parts)[1]));
  } else {
    return bad_name(qualified_name, "too many dotted names");
  }
  return {};
}

bool TableFilter::matches(const pgoutput::Relation& relation) const {
  if (oids_.count(relation.oid) != 0) return true;
  const std::string& schema =
      relation.namespace_name.empty() ? std::string("pg_catalog") : relation.namespace_name;
  return names_.count({schema, relation.name}) != 0 || schemas_.count(schema) != 0;
}

// --- delta updates ---

std::vector<bool> key_columns(const pgoutput::Relation& relation,
                              const std::vector<std::string>& names) {
  std::vector<bool> key(relation.columns.size(), false);
  for (std::size_t i = 0; i < relation.columns.size(); ++i) {
    const pgoutput::Column& column = relation.columns[i];
    key[i] = names.empty() ? column.is_key()
                           : std::find(names.begin(), names.end(), column.name) != names.end();
  }
  return key;
}

pgoutput::Update delta_update(const std::vector<bool>& key, pgoutput::Update update) {
  if (!update.old || update.old->kind != pgoutput::OldKind::kFull) return update;
  std::vector<pgoutput::TupleValue>& old_values = update.old->tuple.columns;
  std::vector<pgoutput::TupleValue>& new_values = update.new_tuple.columns;
  if (old_values.size() != key.size() || new_values.size() != key.size()) return update;
  const auto keys = static_cast<std::size_t>(std::count(key.begin(), key.end(), true));
  if (keys == 0 || keys == key.size()) return update;
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (key[i]) continue;
    if (new_values[i] == old_values[i]) new_values[i] = pgoutput::TupleValue::unchanged();
    old_values[i] = pgoutput::TupleValue::null();
  }
  update.old->kind = pgoutput::OldKind::kKey;
  return update;
}

// --- ChangeView ---

void ChangeView::start(const EntryMeta& meta) {
  meta_ = meta;
  relations_.clear();
  pending_types_.clear();
  sent_any_ = false;
}

Result<ChangeView::RelationState*> ChangeView::state_for(pgoutput::Oid oid, Lsn lsn) {
  auto it = relations_.find(oid);
  if (it != relations_.end()) return &it->second;
  return Error::make(sqlstate::kDataCorrupted,
                     "change at LSN " + lsn.to_string() + " of transaction " +
                         std::to_string(meta_.xid) + " (commit LSN " +
                         meta_.commit_lsn.to_string() + ") is for relation OID " +
                         std::to_string(oid) + ", which the transaction does not describe",
                     "Stored transactions carry the Relation of every table they change; the "
                     "data was not written by pgrelay's builder or is damaged.");
}

void ChangeView::send_relation(RelationState& state, std::vector<Change>& out) {
  if (state.sent) return;
  for (Change& type : state.types) out.push_back(std::move(type));
  state.types.clear();
  out.push_back(Change{state.lsn, state.relation});
  state.sent = true;
}

Status ChangeView::push(Change change, std::vector<Change>& out) {
  if (auto* type = std::get_if<pgoutput::Type>(&change.message)) {
    (void)type;
    pending_types_.push_back(std::move(change));
    return {};
  }
  if (auto* rel = std::get_if<pgoutput::Relation>(&change.message)) {
    // A Relation re-sent within the transaction (the table's schema changed) replaces the
    // earlier one and is sent again before the table's next change that is sent.
    RelationState& state = relations_[rel->oid];
    state.allowed = !options_.tables || options_.tables->matches(*rel);
    state.sent = false;
    state.lsn = change.lsn;
    state.types = state.allowed ? std::move(pending_types_) : std::vector<Change>();
    pending_types_.clear();
    if (options_.delta_updates) {
      state.key = key_columns(
          *rel, options_.delta_keys ? options_.delta_keys(*rel) : std::vector<std::string>());
    }
    state.relation = std::move(*rel);
    return {};
  }
  if (!operation_allowed(options_.operations, change.message)) return {};

  if (auto* truncate = std::get_if<pgoutput::Truncate>(&change.message)) {
    std::vector<pgoutput::Oid> kept;
    std::vector<RelationState*> states;
    for (pgoutput::Oid oid : truncate->relation_oids) {
      auto state = state_for(oid, change.lsn);
      if (!state.ok()) return state.error();
      if (!(*state)->allowed) continue;
      kept.push_back(oid);
      states.push_back(*state);
    }
    if (kept.empty()) return {};
    for (RelationState* state : states) send_relation(*state, out);
    truncate->relation_oids = std::move(kept);
    out.push_back(std::move(change));
    sent_any_ = true;
    return {};
  }
  if (std::holds_alternative<pgoutput::LogicalMessage>(change.message)) {
    out.push_back(std::move(change));
    sent_any_ = true;
    return {};
  }

  const pgoutput::Oid oid = std::visit(
      [](const auto& m) -> pgoutput::Oid {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Insert> || std::is_same_v<T, pgoutput::Update> ||
                      std::is_same_v<T, pgoutput::Delete>) {
          return m.relation_oid;
        } else {
          return 0;  // handled above
        }
      },
      change.message);
  auto state = state_for(oid, change.lsn);
  if (!state.ok()) return state.error();
  if (!(*state)->allowed) return {};
  send_relation(**state, out);
  if (options_.delta_updates) {
    if (auto* update = std::get_if<pgoutput::Update>(&change.message)) {
      *update = delta_update((*state)->key, std::move(*update));
    }
  }
  out.push_back(std::move(change));
  sent_any_ = true;
  return {};
}

bool ChangeView::finish() {
  pending_types_.clear();
  if (meta_.kind == EntryKind::kMessage) return sent_any_;
  return sent_any_ || options_.empty_transactions == EmptyTransactions::kKeep;
}

// --- ViewReader ---

ViewReader::ViewReader(ChangeView& view, Cursor& cursor, const EntryMeta& meta)
    : view_(view), reader_(cursor, meta) {
  view_.start(meta);
}

Result<std::optional<Change>> ViewReader::next() {
  while (true) {
    if (queue_pos_ < queue_.size()) return std::optional<Change>(std::move(queue_[queue_pos_++]));
    queue_.clear();
    queue_pos_ = 0;
    if (done_) return std::optional<Change>();
    auto change = reader_.next();
    if (!change.ok()) return change.take_error();
    if (!*change) {
      done_ = true;
      send_entry_ = view_.finish();
      return std::optional<Change>();
    }
    PGRELAY_TRY(view_.push(std::move(**change), queue_));
  }
}

Result<std::optional<Transaction>> apply_view(const ViewOptions& options, const Transaction& txn) {
  ChangeView view(options);
  view.start(entry_meta(txn.kind, txn.header, static_cast<std::uint32_t>(txn.changes.size())));
  Transaction result;
  result.kind = txn.kind;
  result.header = txn.header;
  for (const Change& change : txn.changes) PGRELAY_TRY(view.push(change, result.changes));
  if (!view.finish()) return std::optional<Transaction>();
  return std::optional<Transaction>(std::move(result));
}

}  // namespace pgrelay::log
