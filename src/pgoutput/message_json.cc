// Renders decoded pgoutput changes and logical messages as JSON lines (`pgrelay recv`, NATS).
#include "pgoutput/message_json.h"

#include "base/json_string.h"
#include "base/pg_time.h"
#include "wire/scram.h"

namespace pgrelay::pgoutput {

namespace {

// Lines are written directly (no JSON document is built): this is the hot path of a consumer
// that may read millions of rows, and the shape of each line is fixed.

void append_hex(std::string_view bytes, std::string& out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  out += "\\\\x";  // a JSON string holding \x
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
}

// A name (schema, table, column, prefix): text, or its hex form if it is not UTF-8.
void append_name(std::string_view name, std::string& out) {
  if (is_valid_utf8(name)) {
    append_json_string(out, name);
  } else {
    out += '"';
    append_hex(name, out);
    out += '"';
  }
}

void append_key(std::string_view key, std::string& out) {
  append_name(key, out);
  out += ':';
}

// The conventions of `pgrelay log dump`: NULL is null, an unchanged TOASTed value
// {"unchanged_toast":true}, a binary-format value {"binary":"\\x.."}; and text that is not
// UTF-8 (a database in another encoding) {"hex":"\\x.."}, since JSON strings cannot hold it.
void append_value(const TupleValue& v, std::string& out) {
  switch (v.kind) {
    case ValueKind::kNull:
      out += "null";
      return;
    case ValueKind::kUnchanged:
      out += "{\"unchanged_toast\":true}";
      return;
    case ValueKind::kBinary:
      out += "{\"binary\":\"";
      append_hex(v.bytes, out);
      out += "\"}";
      return;
    case ValueKind::kText:
      break;
  }
  if (is_valid_utf8(v.bytes)) {
    append_json_string(out, v.bytes);
  } else {
    out += "{\"hex\":\"";
    append_hex(v.bytes, out);
    out += "\"}";
  }
}

void append_column_name(const Relation* relation, std::size_t i, std::string& out) {
  if (relation != nullptr && i < relation->columns.size()) {
    append_key(relation->columns[i].name, out);
  } else {
    out += "\"column_" + std::to_string(i + 1) + "\":";
  }
}

// {column: value, ...} in table order.
void append_tuple(const Tuple& tuple, const Relation* relation, std::string& out) {
  out += '{';
  for (std::size_t i = 0; i < tuple.columns.size(); ++i) {
    if (i > 0) out += ',';
    append_column_name(relation, i, out);
    append_value(tuple.columns[i], out);
  }
  out += '}';
}

// The replica identity columns of `tuple` (by the Relation's key flags), or null when the
// table has none (REPLICA IDENTITY NOTHING, or DEFAULT without a primary key) or is unknown.
void append_key_columns(const Tuple& tuple, const Relation* relation, std::string& out) {
  bool any = false;
  if (relation != nullptr) {
    for (std::size_t i = 0; i < tuple.columns.size() && i < relation->columns.size(); ++i) {
      if (!relation->columns[i].is_key()) continue;
      out += any ? ',' : '{';
      any = true;
      append_key(relation->columns[i].name, out);
      append_value(tuple.columns[i], out);
    }
  }
  out += any ? "}" : "null";
}

void start_line(const char* op, const Relation* relation, std::string& out) {
  out += "{\"op\":\"";
  out += op;
  out += "\",\"schema\":";
  if (relation != nullptr) {
    append_name(relation->schema(), out);
    out += ",\"table\":";
    append_name(relation->name, out);
  } else {
    out += "null,\"table\":null";
  }
}

void finish_line(wire::Lsn lsn, const TransactionInfo* txn, std::string& out) {
  out += ",\"lsn\":\"" + lsn.to_string() + '"';
  if (txn != nullptr) {
    out += ",\"xid\":" + std::to_string(txn->xid);
    out += ",\"commit_time\":\"" + format_pg_time(txn->commit_time) + '"';
  }
  out += "}\n";
}

}  // namespace

void append_json_lines(const Message& message, wire::Lsn lsn, const TransactionInfo* txn,
                       const RelationLookup& relations, std::string& out) {
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Insert>) {
          const auto* rel = relations.find(m.relation_oid);
          start_line("insert", rel, out);
          out += ",\"key\":";
          append_key_columns(m.new_tuple, rel, out);
          out += ",\"old\":null,\"new\":";
          append_tuple(m.new_tuple, rel, out);
          finish_line(lsn, txn, out);
        } else if constexpr (std::is_same_v<T, Update>) {
          const auto* rel = relations.find(m.relation_oid);
          start_line("update", rel, out);
          // The old key (a changed key, or the whole old row under REPLICA IDENTITY FULL)
          // names the row that was updated; without it the key did not change.
          out += ",\"key\":";
          append_key_columns(m.old ? m.old->tuple : m.new_tuple, rel, out);
          out += ",\"old\":";
          if (m.old && m.old->kind == OldKind::kFull) {
            append_tuple(m.old->tuple, rel, out);
          } else {
            out += "null";
          }
          out += ",\"new\":";
          append_tuple(m.new_tuple, rel, out);
          finish_line(lsn, txn, out);
        } else if constexpr (std::is_same_v<T, Delete>) {
          const auto* rel = relations.find(m.relation_oid);
          start_line("delete", rel, out);
          out += ",\"key\":";
          append_key_columns(m.old.tuple, rel, out);
          out += ",\"old\":";
          if (m.old.kind == OldKind::kFull) {
            append_tuple(m.old.tuple, rel, out);
          } else {
            out += "null";
          }
          out += ",\"new\":null";
          finish_line(lsn, txn, out);
        } else if constexpr (std::is_same_v<T, Truncate>) {
          for (Oid oid : m.relation_oids) {
            start_line("truncate", relations.find(oid), out);
            out += ",\"key\":null,\"old\":null,\"new\":null,\"cascade\":";
            out += m.cascade ? "true" : "false";
            out += ",\"restart_identity\":";
            out += m.restart_identity ? "true" : "false";
            finish_line(lsn, txn, out);
          }
        } else if constexpr (std::is_same_v<T, LogicalMessage>) {
          out += "{\"op\":\"message\",\"transactional\":";
          out += m.transactional ? "true" : "false";
          out += ",\"prefix\":";
          append_name(m.prefix, out);
          out += ",\"content\":";
          if (is_valid_utf8(m.content)) {
            append_json_string(out, m.content);
            out += ",\"content_encoding\":\"utf8\"";
          } else {
            append_json_string(out, wire::base64_encode(as_bytes(m.content)));
            out += ",\"content_encoding\":\"base64\"";
          }
          finish_line(lsn, m.transactional ? txn : nullptr, out);
        }
      },
      message);
}

}  // namespace pgrelay::pgoutput
