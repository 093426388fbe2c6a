// Filters stored changes by table and operation, and reduces updates to deltas.
#include "log/change_view.h"

#include <algorithm>
#include <charconv>
#include <functional>

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

// A Relation and the Types stored before it, as send_relation_and_attrs writes them; with a
// column list (`keep` not empty), only the kept columns and the Types of those.
void append_relation(const pgoutput::Relation& relation, const std::vector<Change>& types,
                     const std::vector<bool>& keep, Lsn lsn, std::vector<Change>& out) {
  if (keep.empty()) {
    for (const Change& type : types) out.push_back(type);
    out.push_back(Change{lsn, relation});
    return;
  }
  pgoutput::Relation projected = relation;
  projected.columns.clear();
  std::set<pgoutput::Oid> kept_types;
  for (std::size_t i = 0; i < relation.columns.size(); ++i) {
    if (!keep[i]) continue;
    kept_types.insert(relation.columns[i].type_oid);
    projected.columns.push_back(relation.columns[i]);
  }
  for (const Change& type : types) {
    const auto* t = std::get_if<pgoutput::Type>(&type.message);
    if (t == nullptr || kept_types.count(t->oid) != 0) out.push_back(type);
  }
  out.push_back(Change{lsn, std::move(projected)});
}

// Per column of `relation`, whether the column list (by name) keeps it.
std::vector<bool> kept_columns(const pgoutput::Relation& relation,
                               const std::vector<std::string>& columns) {
  std::vector<bool> keep(relation.columns.size());
  for (std::size_t i = 0; i < relation.columns.size(); ++i) {
    keep[i] = std::find(columns.begin(), columns.end(), relation.columns[i].name) != columns.end();
  }
  return keep;
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
  const std::string schema(relation.schema());
  return names_.count({schema, relation.name}) != 0 || schemas_.count(schema) != 0;
}

// --- PublicationTables ---

std::optional<TableRule> PublicationTables::rule_for(const pgoutput::Relation& relation) const {
  // By name, as TableFilter matches (and as the tables were listed when the view was made).
  const std::string schema(relation.schema());
  auto named = names.find({schema, relation.name});
  if (named != names.end()) {
    auto it = tables.find(named->second);
    if (it != tables.end()) return it->second;
  }
  // A change logged before its table was renamed, read after the publications were (the log
  // holds the upstream's OIDs): the table is the one published, as Postgres decides by OID.
  if (auto it = tables.find(relation.oid); it != tables.end()) return it->second;
  OperationSet ops = all_tables;
  auto s = schemas.find(schema);
  if (s != schemas.end()) ops |= s->second;
  if (all_tables == 0 && s == schemas.end()) return std::nullopt;
  TableRule rule;
  rule.operations = ops;
  return rule;
}

std::string PublicationTables::key() const {
  // Length-prefixed fields: no separator inside a name or an expression can fake another key.
  std::string out;
  auto field = [&out](const std::string& s) {
    out += std::to_string(s.size());
    out += ':';
    out += s;
  };
  field("all=" + std::to_string(all_tables));
  for (const auto& [schema, ops] : schemas) {
    field("schema");
    field(schema);
    field(std::to_string(ops));
  }
  for (const auto& [name, oid] : names) {
    field("name");
    field(name.first);
    field(name.second);
    field(std::to_string(oid));
  }
  for (const auto& [oid, rule] : tables) {
    field("table");
    field(std::to_string(oid));
    field(std::to_string(rule.operations));
    if (rule.columns) {
      field("columns=" + std::to_string(rule.columns->size()));
      for (const auto& c : *rule.columns) field(c);
    }
    for (int a = 0; a < 3; ++a) {
      if (rule.filters[a]) {
        field("filter" + std::to_string(a));
        field(rule.filters[a]->key());
      }
    }
    if (rule.error) {
      field("error");
      field(rule.error->sqlstate);
      field(rule.error->message);
    }
    if (rule.publish_as) {
      const PublishedAs& as = *rule.publish_as;
      field("as");
      field(std::to_string(as.relation.oid));
      field(as.relation.namespace_name);
      field(as.relation.name);
      field(std::string(1, as.relation.replica_identity));
      field(std::to_string(as.leaves) + (as.truncate ? "t" : "-"));
      for (const pgoutput::Column& c : as.relation.columns) {
        field(c.name);
        field(std::to_string(c.flags) + ":" + std::to_string(c.type_oid) + ":" +
              std::to_string(c.type_modifier));
      }
    }
  }
  return out;
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

// --- PublicationsChange ---

PublicationsChange parse_publications_change(std::string_view content) {
  const std::size_t xid_end = std::min(content.find('\n'), content.size());
  std::uint64_t xid = 0;
  auto [at, ec] = std::from_chars(content.data(), content.data() + xid_end, xid);
  // Empty is invalid_argument; a sign or a space stops short of the end.
  if (ec != std::errc() || at != content.data() + xid_end) return {};
  PublicationsChange out;
  out.xid = xid;
  if (xid_end == content.size()) return out;
  const std::string_view catalogs = content.substr(xid_end + 1);
  const std::size_t split = catalogs.find('\n');
  if (split == std::string_view::npos || catalogs.find('\n', split + 1) != std::string_view::npos) {
    return {};
  }
  auto text = [](std::string_view catalog) -> std::shared_ptr<const std::string> {
    if (catalog.empty()) return nullptr;
    return std::make_shared<const std::string>(catalog);
  };
  out.before = text(catalogs.substr(0, split));
  out.after = text(catalogs.substr(split + 1));
  return out;
}

// --- ChangeView ---

void ChangeView::start(const EntryMeta& meta) {
  meta_ = meta;
  relations_.clear();
  pending_types_.clear();
  transaction_types_.clear();
  targets_sent_.clear();
  sent_any_ = false;
  publications_changed_ = false;
  change_ = {};
  pause_pending_ = false;
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
  state.sent = true;
  // Published via an ancestor: the ancestor's schema first, then the partition's own
  // (maybe_send_schema), each under the column list.
  if (state.publish_as) {
    append_relation(state.target, state.target_types, state.keep, state.lsn, out);
    append_relation(state.relation, state.types, state.leaf_keep, state.lsn, out);
    return;
  }
  append_relation(state.relation, state.types, state.keep, state.lsn, out);
}

void ChangeView::send_target(const RelationState& state, std::vector<Change>& out) {
  if (!targets_sent_.insert(state.target.oid).second) return;
  append_relation(state.target, state.target_types, state.keep, state.lsn, out);
}

void ChangeView::replace_options(ViewOptions options) {
  options_ = std::move(options);
  pause_pending_ = false;
  targets_sent_.clear();
  for (auto& [oid, state] : relations_) {
    state.sent = false;
    describe_relation(state);
  }
}

void ChangeView::describe_relation(RelationState& state) {
  const pgoutput::Relation& relation = state.relation;
  state.allowed = !options_.tables || options_.tables->matches(relation);
  state.table_operations = kAllOperations;
  state.keep.clear();
  state.leaf_keep.clear();
  state.publish_as.reset();
  state.target = pgoutput::Relation{};
  state.target_types.clear();
  state.source.clear();
  for (auto& f : state.filters) f.reset();
  for (auto& e : state.filter_errors) e.reset();
  state.error.reset();
  std::optional<TableRule> rule;
  if (options_.publications) {
    rule = options_.publications->rule_for(relation);
    if (!rule) state.allowed = false;
  }
  if (rule && rule->publish_as) {
    state.publish_as = rule->publish_as;
    describe_target(state);
  }
  // What the changes are sent as: the table itself, or the ancestor it is published via.
  const pgoutput::Relation& sent_as = state.publish_as ? state.target : relation;
  if (options_.delta_updates) {
    state.key = key_columns(
        sent_as, options_.delta_keys ? options_.delta_keys(sent_as) : std::vector<std::string>());
  }
  if (!rule) return;
  state.table_operations = rule->operations;
  state.error = rule->error;
  // Filters see the whole tuple, column list or not, as in pgoutput.
  for (int a = 0; a < 3; ++a) {
    if (!rule->filters[a]) continue;
    auto bound = rule->filters[a]->bind(sent_as);
    if (bound.ok()) {
      state.filters[a] = std::move(*bound);
    } else {
      state.filter_errors[a] = bound.error();
    }
  }
  if (rule->columns) {
    // By name: the Relation describes the layout in force for the changes that follow, so a
    // column added later is left out and the tuples stay aligned with the Relation.
    state.keep = kept_columns(sent_as, *rule->columns);
    // pgoutput applies the ancestor's list to the partition's Relation by attribute number;
    // pgrelay, which keeps no attribute numbers, by name (the same where the two align).
    if (state.publish_as) state.leaf_keep = kept_columns(relation, *rule->columns);
  }
  if (state.publish_as) {
    // The ancestor's Types, from those stored with the partition's Relation (the same types):
    // one per column sent, in the ancestor's order, as send_relation_and_attrs writes them.
    for (std::size_t i = 0; i < state.target.columns.size(); ++i) {
      if (!state.keep.empty() && !state.keep[i]) continue;
      for (const Change& type : state.types) {
        const auto* t = std::get_if<pgoutput::Type>(&type.message);
        if (t != nullptr && t->oid == state.target.columns[i].type_oid) {
          state.target_types.push_back(type);
          break;
        }
      }
    }
  }
}

void ChangeView::describe_target(RelationState& state) {
  const pgoutput::Relation& ancestor = state.publish_as->relation;
  const pgoutput::Relation& leaf = state.relation;
  pgoutput::Relation& target = state.target;
  target.xid = leaf.xid;
  target.oid = ancestor.oid;
  target.namespace_name = ancestor.namespace_name;
  target.name = ancestor.name;
  target.replica_identity = ancestor.replica_identity;
  // The ancestor's columns in its order, as build_attrmap_by_name maps them, typed as the
  // stored Relation says. A partition has exactly its root's columns; should the view's copy
  // of the ancestor disagree with the stored layout (the view is read when the stream starts
  // and at each mark), the stored layout wins: its columns the ancestor lacks follow at the
  // end, and the ancestor's it lacks are left out, so that no value is ever made up.
  std::vector<bool> used(leaf.columns.size(), false);
  for (const pgoutput::Column& column : ancestor.columns) {
    for (std::size_t i = 0; i < leaf.columns.size(); ++i) {
      if (used[i] || leaf.columns[i].name != column.name) continue;
      used[i] = true;
      pgoutput::Column mapped = leaf.columns[i];
      mapped.flags = column.flags;
      target.columns.push_back(std::move(mapped));
      state.source.push_back(i);
      break;
    }
  }
  const bool full = ancestor.replica_identity == pgoutput::kReplicaIdentityFull;
  for (std::size_t i = 0; i < leaf.columns.size(); ++i) {
    if (used[i]) continue;
    pgoutput::Column extra = leaf.columns[i];
    extra.flags = full ? pgoutput::kColumnIsKey : 0;
    target.columns.push_back(std::move(extra));
    state.source.push_back(i);
  }
}

void ChangeView::map_to_target(const RelationState& state, ChangeMessage& message) const {
  auto remap = [&](pgoutput::Tuple& tuple) {
    std::vector<pgoutput::TupleValue> mapped;
    mapped.reserve(state.source.size());
    for (std::size_t i : state.source) {
      mapped.push_back(i < tuple.columns.size() ? std::move(tuple.columns[i])
                                                : pgoutput::TupleValue::null());
    }
    tuple.columns = std::move(mapped);
  };
  // logicalrep_write_update and _delete flag the old tuple by the relation written: the
  // ancestor's replica identity, whatever the partition's.
  const pgoutput::OldKind old_kind = state.target.replica_identity == pgoutput::kReplicaIdentityFull
                                         ? pgoutput::OldKind::kFull
                                         : pgoutput::OldKind::kKey;
  if (auto* insert = std::get_if<pgoutput::Insert>(&message)) {
    insert->relation_oid = state.target.oid;
    remap(insert->new_tuple);
  } else if (auto* update = std::get_if<pgoutput::Update>(&message)) {
    update->relation_oid = state.target.oid;
    if (update->old) {
      remap(update->old->tuple);
      update->old->kind = old_kind;
    }
    remap(update->new_tuple);
  } else if (auto* del = std::get_if<pgoutput::Delete>(&message)) {
    del->relation_oid = state.target.oid;
    remap(del->old.tuple);
    del->old.kind = old_kind;
  }
}

Result<bool> ChangeView::apply_row_filter(RelationState& state, ChangeMessage& message) {
  int action = -1;
  if (std::holds_alternative<pgoutput::Insert>(message)) action = kFilterInsert;
  if (std::holds_alternative<pgoutput::Update>(message)) action = kFilterUpdate;
  if (std::holds_alternative<pgoutput::Delete>(message)) action = kFilterDelete;
  if (action < 0) return true;
  if (state.filter_errors[action]) return *state.filter_errors[action];
  if (!state.filters[action]) return true;
  const TupleFilter& filter = *state.filters[action];
  if (auto* insert = std::get_if<pgoutput::Insert>(&message)) return filter(insert->new_tuple);
  if (auto* del = std::get_if<pgoutput::Delete>(&message)) return filter(del->old.tuple);
  auto& update = std::get<pgoutput::Update>(message);
  if (!update.old) return filter(update.new_tuple);
  // An unchanged TOAST value of the new tuple is only in the old one: take it from there
  // (pgoutput_row_filter's tmp_new_slot).
  pgoutput::Tuple merged = update.new_tuple;
  const auto& old_values = update.old->tuple.columns;
  for (std::size_t i = 0; i < merged.columns.size() && i < old_values.size(); ++i) {
    if (merged.columns[i].kind == pgoutput::ValueKind::kUnchanged &&
        old_values[i].kind != pgoutput::ValueKind::kNull &&
        old_values[i].kind != pgoutput::ValueKind::kUnchanged) {
      merged.columns[i] = old_values[i];
    }
  }
  auto old_matched = filter(update.old->tuple);
  if (!old_matched.ok()) return old_matched.error();
  auto new_matched = filter(merged);
  if (!new_matched.ok()) return new_matched.error();
  if (!*old_matched && !*new_matched) return false;
  if (!*old_matched) {
    message = pgoutput::Insert{update.xid, update.relation_oid, std::move(merged)};
  } else if (!*new_matched) {
    message = pgoutput::Delete{update.xid, update.relation_oid, std::move(*update.old)};
  }
  return true;
}

void ChangeView::project(const RelationState& state, ChangeMessage& message) const {
  if (state.keep.empty()) return;
  auto cut = [&](pgoutput::Tuple& tuple) {
    std::vector<pgoutput::TupleValue> kept;
    for (std::size_t i = 0; i < tuple.columns.size(); ++i) {
      if (i < state.keep.size() && state.keep[i]) kept.push_back(std::move(tuple.columns[i]));
    }
    tuple.columns = std::move(kept);
  };
  if (auto* insert = std::get_if<pgoutput::Insert>(&message)) {
    cut(insert->new_tuple);
  } else if (auto* update = std::get_if<pgoutput::Update>(&message)) {
    if (update->old) cut(update->old->tuple);
    cut(update->new_tuple);
  } else if (auto* del = std::get_if<pgoutput::Delete>(&message)) {
    cut(del->old.tuple);
  }
}

Status ChangeView::push(Change change, std::vector<Change>& out) {
  if (const auto* marker = publications_marker(change.message)) {
    publications_changed_ = true;  // capture's own record, for walsenders, not for consumers
    change_ = parse_publications_change(marker->content);
    pause_pending_ = pause_at_markers_;
    return {};
  }
  if (auto* type = std::get_if<pgoutput::Type>(&change.message)) {
    transaction_types_.insert_or_assign(type->oid, change);
    pending_types_.push_back(std::move(change));
    return {};
  }
  if (auto* rel = std::get_if<pgoutput::Relation>(&change.message)) {
    // A Relation re-sent within the transaction (the table's schema changed) replaces the
    // earlier one and is sent again before the table's next change that is sent.
    RelationState& state = relations_[rel->oid];
    state.sent = false;
    state.lsn = change.lsn;
    state.types = std::move(pending_types_);
    pending_types_.clear();
    // The Types of its columns stored before an earlier Relation of the transaction.
    for (const pgoutput::Column& column : rel->columns) {
      auto known = transaction_types_.find(column.type_oid);
      if (known == transaction_types_.end()) continue;
      const bool has = std::any_of(state.types.begin(), state.types.end(), [&](const Change& t) {
        return std::get<pgoutput::Type>(t.message).oid == column.type_oid;
      });
      if (!has) state.types.push_back(known->second);
    }
    state.relation = std::move(*rel);
    describe_relation(state);
    return {};
  }
  if (options_.refused && !std::holds_alternative<pgoutput::LogicalMessage>(change.message)) {
    return *options_.refused;
  }
  if (!operation_allowed(options_.operations, change.message)) return {};

  if (std::holds_alternative<pgoutput::Truncate>(change.message)) {
    return push_truncate(std::move(change), out);
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
  RelationState& rs = **state;
  if (!rs.allowed) return {};
  if (rs.error) return *rs.error;
  if (!operation_allowed(rs.table_operations, change.message)) return {};
  // The ancestor's filter judges the tuple converted to the ancestor's columns.
  if (rs.publish_as) map_to_target(rs, change.message);
  auto pass = apply_row_filter(rs, change.message);
  if (!pass.ok()) return pass.error();
  if (!*pass) return {};
  send_relation(rs, out);
  if (options_.delta_updates) {
    if (auto* update = std::get_if<pgoutput::Update>(&change.message)) {
      *update = delta_update(rs.key, std::move(*update));
    }
  }
  project(rs, change.message);
  out.push_back(std::move(change));
  sent_any_ = true;
  return {};
}

Status ChangeView::push_truncate(Change change, std::vector<Change>& out) {
  auto& truncate = std::get<pgoutput::Truncate>(change.message);
  // In the order the Truncate names them: tables sent as themselves, and the ancestors that
  // partitions are published via, each at its first partition (a TRUNCATE lists a table just
  // before its partitions).
  struct Sent {
    RelationState* state;
    bool as_target;
  };
  std::vector<Sent> order;
  std::map<pgoutput::Oid, std::size_t> partitions_named;  // per ancestor
  // The Relations of what is kept, in order (the ancestors once all their leaves are named).
  auto send_relations = [&](std::vector<pgoutput::Oid>& kept) {
    for (const Sent& s : order) {
      if (!s.as_target) {
        send_relation(*s.state, out);
        kept.push_back(s.state->relation.oid);
        continue;
      }
      const PublishedAs& as = *s.state->publish_as;
      if (!as.truncate || partitions_named[s.state->target.oid] < as.leaves) continue;
      send_target(*s.state, out);
      kept.push_back(s.state->target.oid);
    }
  };
  std::vector<pgoutput::Oid> kept;
  for (pgoutput::Oid oid : truncate.relation_oids) {
    auto state = state_for(oid, change.lsn);
    if (!state.ok()) return state.error();
    RelationState& rs = **state;
    if (!rs.allowed) continue;
    if (rs.error) {
      // pgoutput_truncate has sent the schema of the tables before this one (and Begin)
      // when it fails here: the caller sends them, then the error.
      send_relations(kept);
      return *rs.error;
    }
    if (rs.publish_as) {
      // pgoutput_truncate never sends a partition published via an ancestor.
      if (partitions_named[rs.target.oid]++ == 0) order.push_back({&rs, true});
      continue;
    }
    if ((rs.table_operations & kOpTruncate) == 0) continue;
    order.push_back({&rs, false});
  }
  send_relations(kept);
  if (kept.empty()) return {};
  truncate.relation_oids = std::move(kept);
  out.push_back(std::move(change));
  sent_any_ = true;
  return {};
}

bool ChangeView::finish() {
  pending_types_.clear();
  transaction_types_.clear();
  if (meta_.kind == EntryKind::kMessage) return sent_any_;
  return sent_any_ || options_.empty_transactions == EmptyTransactions::kKeep;
}

// --- ViewReader ---

ViewReader::ViewReader(ChangeView& view, Cursor& cursor, const EntryMeta& meta)
    : view_(view), reader_(cursor, meta) {
  view_.start(meta);
}

Result<std::optional<Change>> ViewReader::next() {
  paused_ = false;
  while (true) {
    if (queue_pos_ < queue_.size()) return std::optional<Change>(std::move(queue_[queue_pos_++]));
    queue_.clear();
    queue_pos_ = 0;
    if (refused_) return *refused_;
    if (done_) return std::optional<Change>();
    if (view_.take_pause()) {
      paused_ = true;
      return std::optional<Change>();
    }
    auto change = reader_.next();
    if (!change.ok()) return change.take_error();
    if (!*change) {
      done_ = true;
      send_entry_ = view_.finish();
      return std::optional<Change>();
    }
    // What the view sent before refusing the change (a Truncate's Relations) goes out first.
    if (Status pushed = view_.push(std::move(**change), queue_); !pushed.ok()) {
      refused_ = pushed.error();
    }
  }
}

namespace {

// Whether the data of the entry `cursor` has just returned holds `needle`, read through to its
// end a piece at a time, without decoding it (a match in a row's values is possible: the
// caller decodes the entry to be sure).
Result<bool> entry_holds(Cursor& cursor, std::string_view needle) {
  const std::size_t keep = needle.size() - 1;
  std::string carry;  // the last `keep` bytes before this piece, for a match across pieces
  bool found = false;
  for (;;) {
    auto piece = cursor.next_data();
    if (!piece.ok()) return piece.error();
    if (!*piece) return found;
    if (found) continue;
    const std::string_view data = as_chars(**piece);
    std::string across = carry;
    across.append(data.substr(0, std::min(keep, data.size())));
    found = across.find(needle) != std::string::npos || data.find(needle) != std::string::npos;
    if (data.size() >= keep) {
      carry.assign(data.substr(data.size() - keep));
    } else {
      carry.append(data);
      if (carry.size() > keep) carry.erase(0, carry.size() - keep);
    }
  }
}

// The marker in the entry at `commit_lsn`, decoded; nullopt if only its values held the prefix.
Result<std::optional<PublicationsChange>> marker_in(ChangeLog& log, Lsn commit_lsn) {
  auto cursor = log.open_cursor(commit_lsn);
  if (!cursor.ok()) return cursor.error();
  auto meta = (*cursor)->next_entry();
  if (!meta.ok()) return meta.error();
  if (!meta->has_value()) return std::optional<PublicationsChange>();
  EntryReader reader(**cursor, **meta);
  for (;;) {
    auto change = reader.next();
    if (!change.ok()) return change.error();
    if (!change->has_value()) return std::optional<PublicationsChange>();
    if (const auto* marker = publications_marker((*change)->message)) {
      return std::optional<PublicationsChange>(parse_publications_change(marker->content));
    }
  }
}

}  // namespace

namespace {

// Calls `visit` with the commit LSN of each entry in [start, through] whose data holds the
// marker prefix's bytes, in commit order, until it returns true. For the entries appended before
// the log listed those that hold a marker (PendingEntry::marked, MarkedEntries::unmarked_through).
Status for_each_unlisted_holder(ChangeLog& log, Lsn start, Lsn through,
                                const std::function<Result<bool>(Lsn)>& visit) {
  auto cursor = log.open_cursor(start);
  if (!cursor.ok()) return cursor.error();
  for (;;) {
    auto meta = (*cursor)->next_entry();
    if (!meta.ok()) return meta.error();
    if (!meta->has_value() || (*meta)->commit_lsn > through) return {};
    auto holds = entry_holds(**cursor, kPublicationsChangedPrefix);
    if (!holds.ok()) return holds.error();
    if (!*holds) continue;
    auto done = visit((*meta)->commit_lsn);
    if (!done.ok()) return done.error();
    if (*done) return {};
  }
}

}  // namespace

Result<std::optional<PublicationsChange>> first_publications_change(ChangeLog& log, Lsn start) {
  // The log lists the entries that hold a marker, so only those are read; entries from before
  // it kept that list are searched for the prefix's bytes, and only those that hold them decoded.
  const MarkedEntries marked = log.marked_entries(start);
  const Lsn unmarked_through = marked.unmarked_through;
  std::optional<PublicationsChange> found;
  const auto decode = [&](Lsn lsn) -> Result<bool> {
    auto marker = marker_in(log, lsn);
    if (!marker.ok()) return marker.error();
    found = std::move(*marker);
    return found.has_value();  // only a value held the prefix's bytes: go on
  };
  if (unmarked_through.is_valid() && start <= unmarked_through) {
    PGRELAY_TRY(for_each_unlisted_holder(log, start, unmarked_through, decode));
    if (found) return found;
  }
  for (Lsn lsn : marked.commit_lsns) {
    if (unmarked_through.is_valid() && lsn <= unmarked_through) continue;  // searched above
    auto done = decode(lsn);
    if (!done.ok()) return done.error();
    if (*done) return found;
  }
  return std::optional<PublicationsChange>();
}

Result<std::optional<PublicationsChange>> last_publications_change(ChangeLog& log, Lsn start) {
  // Newest first: the listed entries, and only when none of them holds a marker, the data of
  // the entries from before the log kept that list.
  const MarkedEntries marked = log.marked_entries(start);
  const Lsn unmarked_through = marked.unmarked_through;
  for (auto it = marked.commit_lsns.rbegin(); it != marked.commit_lsns.rend(); ++it) {
    if (unmarked_through.is_valid() && *it <= unmarked_through) break;  // searched below
    auto marker = marker_in(log, *it);
    if (!marker.ok() || marker->has_value()) return marker;
  }
  std::vector<Lsn> holding;
  if (unmarked_through.is_valid() && start <= unmarked_through) {
    PGRELAY_TRY(
        for_each_unlisted_holder(log, start, unmarked_through, [&](Lsn lsn) -> Result<bool> {
          holding.push_back(lsn);
          return false;
        }));
  }
  for (auto it = holding.rbegin(); it != holding.rend(); ++it) {
    auto marker = marker_in(log, *it);
    if (!marker.ok() || marker->has_value()) return marker;
  }
  return std::optional<PublicationsChange>();
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
