// Renders change-log entries and changes as JSON objects for `pgrelay log dump`.
#include "cli/change_json.h"

namespace pgrelay::cli {

namespace {

std::string hex_bytes(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "\\x";
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

// A tuple as {column: value}; NULL is null, an unchanged TOASTed value is
// {"unchanged_toast": true}, a binary value {"binary": "\\x..."}.
nlohmann::json tuple_json(const pgoutput::Tuple& tuple, const pgoutput::Relation* relation) {
  nlohmann::json out = nlohmann::json::object();
  for (std::size_t i = 0; i < tuple.columns.size(); ++i) {
    std::string name = relation != nullptr && i < relation->columns.size()
                           ? relation->columns[i].name
                           : "column_" + std::to_string(i + 1);
    const pgoutput::TupleValue& v = tuple.columns[i];
    switch (v.kind) {
      case pgoutput::ValueKind::kNull:
        out[name] = nullptr;
        break;
      case pgoutput::ValueKind::kUnchanged:
        out[name] = {{"unchanged_toast", true}};
        break;
      case pgoutput::ValueKind::kText:
        out[name] = v.bytes;
        break;
      case pgoutput::ValueKind::kBinary:
        out[name] = {{"binary", hex_bytes(v.bytes)}};
        break;
    }
  }
  return out;
}

void add_table(nlohmann::json& j, std::uint32_t oid, const pgoutput::Relation* relation) {
  j["relation_oid"] = oid;
  if (relation != nullptr) {
    j["schema"] = relation->schema();
    j["table"] = relation->name;
  }
}

}  // namespace

nlohmann::json entry_begin_json(const log::EntryMeta& meta) {
  nlohmann::json j;
  j["type"] = meta.kind == log::EntryKind::kMessage ? "message" : "begin";
  j["xid"] = meta.xid;
  j["begin_lsn"] = meta.begin_lsn.to_string();
  j["commit_lsn"] = meta.commit_lsn.to_string();
  j["end_lsn"] = meta.end_lsn.to_string();
  j["commit_time"] = format_pg_time(meta.commit_time);
  if (!meta.origin.empty()) {
    j["origin"] = meta.origin;
    j["origin_lsn"] = meta.origin_lsn.to_string();
  }
  return j;
}

nlohmann::json entry_commit_json(const log::EntryMeta& meta) {
  nlohmann::json j;
  j["type"] = "commit";
  j["xid"] = meta.xid;
  j["commit_lsn"] = meta.commit_lsn.to_string();
  j["end_lsn"] = meta.end_lsn.to_string();
  j["commit_time"] = format_pg_time(meta.commit_time);
  return j;
}

nlohmann::json change_json(const log::Change& change, RelationMap& relations) {
  auto lookup = [&](pgoutput::Oid oid) -> const pgoutput::Relation* {
    auto it = relations.find(oid);
    return it == relations.end() ? nullptr : &it->second;
  };
  nlohmann::json j;
  j["lsn"] = change.lsn.to_string();
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Relation>) {
          j["type"] = "relation";
          relations[m.oid] = m;
          add_table(j, m.oid, &m);
          j["replica_identity"] = std::string(1, m.replica_identity);
          nlohmann::json cols = nlohmann::json::array();
          for (const auto& c : m.columns) {
            cols.push_back({{"name", c.name},
                            {"type_oid", c.type_oid},
                            {"typmod", c.type_modifier},
                            {"key", (c.flags & 1) != 0}});
          }
          j["columns"] = cols;
        } else if constexpr (std::is_same_v<T, pgoutput::Type>) {
          j["type"] = "type";
          j["type_oid"] = m.oid;
          j["schema"] = m.namespace_name;
          j["name"] = m.name;
        } else if constexpr (std::is_same_v<T, pgoutput::Insert>) {
          const auto* rel = lookup(m.relation_oid);
          j["type"] = "insert";
          add_table(j, m.relation_oid, rel);
          j["new"] = tuple_json(m.new_tuple, rel);
        } else if constexpr (std::is_same_v<T, pgoutput::Update>) {
          const auto* rel = lookup(m.relation_oid);
          j["type"] = "update";
          add_table(j, m.relation_oid, rel);
          if (m.old) {
            j[m.old->kind == pgoutput::OldKind::kKey ? "key" : "old"] =
                tuple_json(m.old->tuple, rel);
          }
          j["new"] = tuple_json(m.new_tuple, rel);
        } else if constexpr (std::is_same_v<T, pgoutput::Delete>) {
          const auto* rel = lookup(m.relation_oid);
          j["type"] = "delete";
          add_table(j, m.relation_oid, rel);
          j[m.old.kind == pgoutput::OldKind::kKey ? "key" : "old"] = tuple_json(m.old.tuple, rel);
        } else if constexpr (std::is_same_v<T, pgoutput::Truncate>) {
          j["type"] = "truncate";
          nlohmann::json tables = nlohmann::json::array();
          for (auto oid : m.relation_oids) {
            nlohmann::json t;
            add_table(t, oid, lookup(oid));
            tables.push_back(t);
          }
          j["tables"] = tables;
          j["cascade"] = m.cascade;
          j["restart_identity"] = m.restart_identity;
        } else if constexpr (std::is_same_v<T, pgoutput::LogicalMessage>) {
          j["type"] = "logical_message";
          j["transactional"] = m.transactional;
          j["prefix"] = m.prefix;
          j["content"] = m.content;
        }
      },
      change.message);
  return j;
}

}  // namespace pgrelay::cli
