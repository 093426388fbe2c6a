// Redirects the few catalog names pgrelay answers for to its upstream schema, token by token.
//
// The parse tree (libpg_query, as protobuf) says which names are the catalog objects; the real
// scanner's tokens at the tree's locations say which bytes to replace. Everything else in the
// text is copied unchanged.
#include "server/sql_rewrite.h"

#include <pg_query.h>
#include <pg_query/pg_query.pb-c.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace pgrelay::server {
namespace {

// Relations whose views pgrelay keeps under the same name in its schema.
// pg_publication_tables leaves out pgrelay's own schema and publications.
constexpr std::array<std::string_view, 4> kRelations = {
    "pg_replication_slots", "pg_stat_replication", "pg_settings", "pg_publication_tables"};

struct FunctionTarget {
  std::string_view name;
  std::string_view replacement;  // the function's name in pgrelay's schema
  // A slot function: sessions through pgrelay reach relay_<name without pg_> or
  // denied_<name without pg_> by their SlotAccess (see sql_rewrite.h).
  bool by_access = false;
};
constexpr std::array<FunctionTarget, 9> kFunctions = {{
    {"pg_create_logical_replication_slot", "pg_create_logical_replication_slot", true},
    {"pg_drop_replication_slot", "pg_drop_replication_slot", true},
    {"pg_terminate_backend", "pg_terminate_backend", true},
    {"pg_logical_emit_message", "emit_message"},
    {"pg_current_wal_lsn", "pg_current_wal_lsn"},
    {"pg_current_wal_insert_lsn", "pg_current_wal_insert_lsn"},
    {"pg_current_wal_flush_lsn", "pg_current_wal_flush_lsn"},
    {"current_setting", "current_setting"},
    {"pg_get_publication_tables", "pg_get_publication_tables"},
}};

std::string replacement(const FunctionTarget& target, SlotAccess access) {
  if (!target.by_access || access == SlotAccess::kChecked) return std::string(target.replacement);
  const std::string_view rest = target.name.substr(std::string_view("pg_").size());
  return (access == SlotAccess::kGranted ? "relay_" : "denied_") + std::string(rest);
}

// What pg_dump reads to find pgrelay's objects: in its sessions, set-returning functions of the
// same name with a dump_ prefix in pgrelay's schema (virtual_catalog.cc says what each leaves
// out; pg_dump refuses to read non-system views).
constexpr std::array<std::string_view, 6> kDumpRelations = {
    "pg_namespace",   "pg_trigger",         "pg_event_trigger",
    "pg_publication", "pg_publication_rel", "pg_publication_namespace"};

// Settings whose SHOW becomes a SELECT of pgrelay's current_setting().
constexpr std::array<std::string_view, 4> kShowSettings = {"wal_level", "max_replication_slots",
                                                           "max_wal_senders", "wal_sender_timeout"};

// Every statement that needs a rewrite contains one of these (ASCII case-insensitively).
constexpr std::array<std::string_view, 15> kNeedles = {"pg_replication_slots",
                                                       "pg_stat_replication",
                                                       "pg_settings",
                                                       "pg_create_logical_replication_slot",
                                                       "pg_drop_replication_slot",
                                                       "pg_terminate_backend",
                                                       "pg_logical_emit_message",
                                                       "pg_current_wal_",
                                                       "current_setting",
                                                       "wal_level",
                                                       "max_replication_slots",
                                                       "max_wal_senders",
                                                       "wal_sender_timeout",
                                                       "pg_publication_tables",
                                                       "pg_get_publication_tables"};

// Bodies of functions created inside function bodies are rewritten to this depth.
constexpr int kMaxBodyDepth = 4;
// Parse trees deeper than this (protobuf nesting levels) are passed unchanged.
constexpr int kMaxTreeDepth = 1000;

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool starts_with_ci(std::string_view text, std::size_t at, std::string_view needle) {
  if (text.size() - at < needle.size()) return false;
  for (std::size_t i = 0; i < needle.size(); ++i) {
    if (lower(text[at + i]) != needle[i]) return false;
  }
  return true;
}

template <typename Range>
bool contains(const Range& range, std::string_view name) {
  return std::find(range.begin(), range.end(), name) != range.end();
}

const FunctionTarget* find_function(std::string_view name) {
  for (const FunctionTarget& f : kFunctions) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool is_identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || static_cast<unsigned char>(c) >= 0x80;
}

bool mentions_catalog(std::string_view sql, bool pg_dump = false) {
  for (std::size_t i = 0; i < sql.size(); ++i) {
    switch (lower(sql[i])) {
      case 'p':
      case 'c':
      case 'w':
      case 'm':
        break;
      default:
        continue;
    }
    for (std::string_view needle : kNeedles) {
      if (needle.front() == lower(sql[i]) && starts_with_ci(sql, i, needle)) return true;
    }
    if (pg_dump) {
      for (std::string_view needle : kDumpRelations) {
        if (needle.front() == lower(sql[i]) && starts_with_ci(sql, i, needle)) return true;
      }
    }
  }
  return false;
}

// ---- Tokens of the real scanner, comments left out ----

struct Token {
  std::size_t start = 0;
  std::size_t end = 0;
  PgQuery__Token kind = PG_QUERY__TOKEN__NUL;
};

class Tokens {
 public:
  explicit Tokens(std::string_view text) : text_(text) {}

  // nullopt when the scanner rejects the text.
  static std::optional<Tokens> scan(const std::string& text) {
    PgQueryScanResult result = pg_query_scan(text.c_str());
    std::optional<Tokens> out;
    if (result.error == nullptr) {
      PgQuery__ScanResult* scan = pg_query__scan_result__unpack(
          nullptr, result.pbuf.len, reinterpret_cast<const std::uint8_t*>(result.pbuf.data));
      if (scan != nullptr) {
        out.emplace(text);
        for (std::size_t i = 0; i < scan->n_tokens; ++i) {
          const PgQuery__ScanToken* t = scan->tokens[i];
          if (t->token == PG_QUERY__TOKEN__SQL_COMMENT || t->token == PG_QUERY__TOKEN__C_COMMENT)
            continue;
          if (t->start < 0 || t->end < t->start || static_cast<std::size_t>(t->end) > text.size())
            continue;
          out->tokens_.push_back(Token{static_cast<std::size_t>(t->start),
                                       static_cast<std::size_t>(t->end), t->token});
        }
        pg_query__scan_result__free_unpacked(scan, nullptr);
      }
    }
    pg_query_free_scan_result(result);
    return out;
  }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  std::size_t size() const { return tokens_.size(); }
  const Token& operator[](std::size_t i) const { return tokens_[i]; }
  std::string_view text(std::size_t i) const {
    return std::string_view(text_).substr(tokens_[i].start, tokens_[i].end - tokens_[i].start);
  }
  PgQuery__Token kind(std::size_t i) const {
    return i < tokens_.size() ? tokens_[i].kind : PG_QUERY__TOKEN__NUL;
  }

  // The token starting exactly at `offset`, or npos.
  std::size_t at(std::int64_t offset) const {
    if (offset < 0) return npos;
    auto it = std::lower_bound(tokens_.begin(), tokens_.end(), static_cast<std::size_t>(offset),
                               [](const Token& t, std::size_t off) { return t.start < off; });
    if (it == tokens_.end() || it->start != static_cast<std::size_t>(offset)) return npos;
    return static_cast<std::size_t>(it - tokens_.begin());
  }
  // The first token starting at or after `offset`, or npos.
  std::size_t first_from(std::size_t offset) const {
    auto it = std::lower_bound(tokens_.begin(), tokens_.end(), offset,
                               [](const Token& t, std::size_t off) { return t.start < off; });
    return it == tokens_.end() ? npos : static_cast<std::size_t>(it - tokens_.begin());
  }

  // The name an identifier token denotes (case-folded or unquoted); nullopt for other tokens and
  // for Unicode-escaped identifiers (never one of the catalog names in practice).
  std::optional<std::string> identifier(std::size_t i) const {
    if (i >= tokens_.size() || tokens_[i].kind != PG_QUERY__TOKEN__IDENT) return std::nullopt;
    const std::string_view raw = text(i);
    std::string name;
    if (!raw.empty() && raw.front() == '"') {
      if (raw.size() < 2 || raw.back() != '"') return std::nullopt;
      const std::string_view inner = raw.substr(1, raw.size() - 2);
      for (std::size_t k = 0; k < inner.size(); ++k) {
        name += inner[k];
        if (inner[k] == '"') ++k;  // "" inside a quoted identifier is one quote
      }
      return name;
    }
    for (char c : raw) name += lower(c);
    return name;
  }
  bool is_identifier(std::size_t i, std::string_view name) const {
    auto id = identifier(i);
    return id && *id == name;
  }

 private:
  std::string_view text_;
  std::vector<Token> tokens_;
};

// ---- Edits ----

struct Edit {
  std::size_t begin = 0;
  std::size_t end = 0;  // begin == end: an insertion
  std::string text;
  bool operator==(const Edit&) const = default;
};

// nullopt when edits overlap (never expected; the text then passes unchanged).
std::optional<std::string> apply_edits(std::string_view text, std::vector<Edit> edits) {
  std::sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  edits.erase(std::unique(edits.begin(), edits.end()), edits.end());
  std::string out;
  out.reserve(text.size() + 64);
  std::size_t pos = 0;
  for (std::size_t i = 0; i < edits.size(); ++i) {
    const Edit& e = edits[i];
    if (e.begin < pos || e.end < e.begin || e.end > text.size()) return std::nullopt;
    if (i > 0 && e.begin == edits[i - 1].begin) return std::nullopt;
    out.append(text.substr(pos, e.begin - pos));
    out += e.text;
    pos = e.end;
  }
  out.append(text.substr(pos));
  return out;
}

// A dollar-quoted literal holding `body`, keeping `original`'s tag when it still fits.
std::string dollar_quote(std::string_view body, std::string_view original) {
  std::vector<std::string> tags;
  if (!original.empty() && original.front() == '$') {
    const std::size_t close = original.find('$', 1);
    if (close != std::string_view::npos) tags.emplace_back(original.substr(0, close + 1));
  }
  tags.emplace_back("$$");
  tags.emplace_back("$pgrelay$");
  for (int n = 1;; ++n) {
    for (const std::string& tag : tags) {
      // The tag must first appear where the closing one starts.
      std::string probe(body);
      probe += tag;
      if (probe.find(tag) == body.size()) return tag + std::string(body) + tag;
    }
    tags.assign(1, "$pgrelay" + std::to_string(n) + "$");
  }
}

std::string quote_identifier(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    out += c;
    if (c == '"') out += '"';
  }
  return out + "\"";
}

// ---- The rewriter proper ----

const ProtobufCMessage* field_message(const ProtobufCMessage* m,
                                      const ProtobufCFieldDescriptor& f) {
  const char* base = reinterpret_cast<const char*>(m);
  if ((f.flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0) {
    const auto which = *reinterpret_cast<const std::uint32_t*>(base + f.quantifier_offset);
    if (which != f.id) return nullptr;
  }
  return *reinterpret_cast<const ProtobufCMessage* const*>(base + f.offset);
}

const char* node_string(const PgQuery__Node* node) {
  if (node == nullptr || node->node_case != PG_QUERY__NODE__NODE_STRING || node->string == nullptr)
    return nullptr;
  return node->string->sval;
}

// The parse tree of `text`: null when it does not parse (the upstream reports the syntax error
// itself), an error when the parser's output cannot be read.
using ParseTree = std::unique_ptr<PgQuery__ParseResult, void (*)(PgQuery__ParseResult*)>;
Result<ParseTree> parse_tree(const std::string& text) {
  PgQueryProtobufParseResult parsed = pg_query_parse_protobuf(text.c_str());
  std::unique_ptr<PgQueryProtobufParseResult, void (*)(PgQueryProtobufParseResult*)> guard(
      &parsed, [](PgQueryProtobufParseResult* p) { pg_query_free_protobuf_parse_result(*p); });
  auto free_tree = [](PgQuery__ParseResult* t) {
    pg_query__parse_result__free_unpacked(t, nullptr);
  };
  if (parsed.error != nullptr) return ParseTree(nullptr, free_tree);
  PgQuery__ParseResult* tree =
      pg_query__parse_result__unpack(nullptr, parsed.parse_tree.len,
                                     reinterpret_cast<const std::uint8_t*>(parsed.parse_tree.data));
  if (tree == nullptr) {
    return Error::make(sqlstate::kInternalError, "could not read the SQL parser's output");
  }
  return ParseTree(tree, free_tree);
}

class TextRewriter {
 public:
  TextRewriter(const std::string& quoted_schema, const StatementSource& source, int depth)
      : quoted_schema_(quoted_schema),
        access_(source.slots),
        pg_dump_(source.pg_dump),
        depth_(depth) {}

  // Statement text → rewritten text, nullopt to leave it, or an error from the parser's output.
  Result<std::optional<std::string>> run(std::string_view sql) {
    if (depth_ > kMaxBodyDepth || sql.find('\0') != std::string_view::npos)
      return std::optional<std::string>();
    text_.assign(sql);
    auto parsed = parse_tree(text_);
    if (!parsed.ok()) return parsed.error();
    if (!*parsed) return std::optional<std::string>();
    const PgQuery__ParseResult* tree = parsed->get();
    tokens_ = Tokens::scan(text_);
    if (!tokens_) return std::optional<std::string>();

    for (std::size_t i = 0; i < tree->n_stmts; ++i) {
      const PgQuery__RawStmt* raw = tree->stmts[i];
      if (raw == nullptr || raw->stmt == nullptr) continue;
      if (raw->stmt->node_case == PG_QUERY__NODE__NODE_VARIABLE_SHOW_STMT) {
        on_show(*raw);
        continue;
      }
      walk(&raw->stmt->base, false, 0);
    }
    if (error_) return *error_;
    if (too_deep_ || edits_.empty()) return std::optional<std::string>();
    return apply_edits(text_, std::move(edits_));
  }

 private:
  void walk(const ProtobufCMessage* m, bool from_item, int level) {
    if (m == nullptr || error_ || too_deep_) return;
    if (level > kMaxTreeDepth) {
      too_deep_ = true;
      return;
    }
    const ProtobufCMessageDescriptor* d = m->descriptor;
    if (d == &pg_query__range_var__descriptor) {
      if (from_item) on_range_var(*reinterpret_cast<const PgQuery__RangeVar*>(m));
      return;
    }
    if (d == &pg_query__column_ref__descriptor) {
      on_column_ref(*reinterpret_cast<const PgQuery__ColumnRef*>(m));
      return;
    }
    if (d == &pg_query__res_target__descriptor) {
      on_res_target(*reinterpret_cast<const PgQuery__ResTarget*>(m));
    }
    if (d == &pg_query__func_call__descriptor) {
      on_func_call(*reinterpret_cast<const PgQuery__FuncCall*>(m));
    } else if (d == &pg_query__create_function_stmt__descriptor) {
      const auto& f = *reinterpret_cast<const PgQuery__CreateFunctionStmt*>(m);
      on_body(f.options, f.n_options, false);
    } else if (d == &pg_query__do_stmt__descriptor) {
      const auto& s = *reinterpret_cast<const PgQuery__DoStmt*>(m);
      on_body(s.args, s.n_args, true);
      return;
    }

    // A WITH clause: each CTE sees the earlier ones (all of them when RECURSIVE), the rest of
    // the statement sees all of them.
    const ProtobufCFieldDescriptor* with_field =
        protobuf_c_message_descriptor_get_field_by_name(d, "with_clause");
    const std::size_t scope = ctes_.size();
    if (with_field != nullptr) {
      const auto* with =
          reinterpret_cast<const PgQuery__WithClause*>(field_message(m, *with_field));
      if (with != nullptr) {
        if (with->recursive) {
          for (std::size_t i = 0; i < with->n_ctes; ++i) push_cte(with->ctes[i]);
        }
        for (std::size_t i = 0; i < with->n_ctes; ++i) {
          walk(with->ctes[i] != nullptr ? &with->ctes[i]->base : nullptr, false, level + 1);
          if (!with->recursive) push_cte(with->ctes[i]);
        }
      }
    }
    const bool is_node = d == &pg_query__node__descriptor;
    for (unsigned i = 0; i < d->n_fields; ++i) {
      const ProtobufCFieldDescriptor& f = d->fields[i];
      if (f.type != PROTOBUF_C_TYPE_MESSAGE || &f == with_field) continue;
      // A Node only wraps one node: whether it is a FROM item is its parent's business.
      const bool child_from = is_node ? from_item : is_from_field(d, f.name);
      if (f.label == PROTOBUF_C_LABEL_REPEATED) {
        const char* base = reinterpret_cast<const char*>(m);
        const std::size_t n = *reinterpret_cast<const std::size_t*>(base + f.quantifier_offset);
        const auto* items =
            *reinterpret_cast<const ProtobufCMessage* const* const*>(base + f.offset);
        for (std::size_t k = 0; k < n && items != nullptr; ++k)
          walk(items[k], child_from, level + 1);
      } else {
        walk(field_message(m, f), child_from, level + 1);
      }
    }
    ctes_.resize(scope);
  }

  // Positions where a RangeVar is a table read by the query (not a DDL or DML target).
  static bool is_from_field(const ProtobufCMessageDescriptor* d, std::string_view field) {
    if (d == &pg_query__select_stmt__descriptor || d == &pg_query__update_stmt__descriptor)
      return field == "from_clause";
    if (d == &pg_query__join_expr__descriptor) return field == "larg" || field == "rarg";
    if (d == &pg_query__delete_stmt__descriptor) return field == "using_clause";
    if (d == &pg_query__merge_stmt__descriptor) return field == "source_relation";
    return false;
  }

  void push_cte(const PgQuery__Node* node) {
    if (node != nullptr && node->node_case == PG_QUERY__NODE__NODE_COMMON_TABLE_EXPR &&
        node->common_table_expr != nullptr && node->common_table_expr->ctename != nullptr) {
      ctes_.emplace_back(node->common_table_expr->ctename);
    }
  }

  std::string prefix() const { return quoted_schema_ + "."; }

  // `pg_catalog . name` starting at token i.
  bool catalog_qualified(std::size_t i, std::string_view name) const {
    return tokens_->is_identifier(i, "pg_catalog") &&
           tokens_->kind(i + 1) == PG_QUERY__TOKEN__ASCII_46 && tokens_->is_identifier(i + 2, name);
  }

  void replace_token(std::size_t i, std::string text) {
    edits_.push_back(Edit{(*tokens_)[i].start, (*tokens_)[i].end, std::move(text)});
  }
  void insert_before(std::size_t i, std::string text) {
    edits_.push_back(Edit{(*tokens_)[i].start, (*tokens_)[i].start, std::move(text)});
  }

  void on_range_var(const PgQuery__RangeVar& rv) {
    if (rv.relname == nullptr) return;
    const bool dumped = pg_dump_ && contains(kDumpRelations, rv.relname);
    if (!dumped && !contains(kRelations, rv.relname)) return;
    if (rv.catalogname != nullptr && rv.catalogname[0] != '\0') return;
    const std::size_t i = tokens_->at(rv.location);
    if (i == Tokens::npos) return;
    const std::string_view schema = rv.schemaname != nullptr ? rv.schemaname : "";
    if (schema.empty()) {
      if (contains(ctes_, rv.relname)) return;  // the CTE, not the catalog view
      if (!tokens_->is_identifier(i, rv.relname)) return;
      if (dumped) {
        // Unaliased, the call keeps the name column references qualify.
        const bool aliased = rv.alias != nullptr && rv.alias->aliasname != nullptr;
        replace_token(i, prefix() + "dump_" + rv.relname + "()" +
                             (aliased ? std::string() : " " + std::string(rv.relname)));
      } else {
        insert_before(i, prefix());
      }
    } else if (schema == "pg_catalog" && catalog_qualified(i, rv.relname)) {
      replace_token(i, quoted_schema_);
      if (dumped) {
        const bool aliased = rv.alias != nullptr && rv.alias->aliasname != nullptr;
        replace_token(i + 2, std::string("dump_") + rv.relname + "()" +
                                 (aliased ? std::string() : " " + std::string(rv.relname)));
      }
    }
  }

  // pg_catalog.pg_settings.name refers to the relation the FROM clause now names differently.
  void on_column_ref(const PgQuery__ColumnRef& ref) {
    if (ref.n_fields != 3) return;
    const char* schema = node_string(ref.fields[0]);
    const char* rel = node_string(ref.fields[1]);
    if (schema == nullptr || rel == nullptr || std::string_view(schema) != "pg_catalog" ||
        !contains(kRelations, rel))
      return;
    const std::size_t i = tokens_->at(ref.location);
    if (i != Tokens::npos && catalog_qualified(i, rel)) replace_token(i, quoted_schema_);
  }

  // An unnamed output column that is a call: remembered, so that a call given another name keeps
  // the column name Postgres gives it (the function's name; clients read results by it).
  void on_res_target(const PgQuery__ResTarget& target) {
    if ((target.name == nullptr || target.name[0] == '\0') && target.val != nullptr &&
        target.val->node_case == PG_QUERY__NODE__NODE_FUNC_CALL) {
      named_by_call_.push_back(target.val->func_call);
    }
  }

  // The token closing the argument list of the call whose name starts at token i, or npos.
  std::size_t closing_paren(std::size_t i) const {
    while (i < tokens_->size() && tokens_->kind(i) != PG_QUERY__TOKEN__ASCII_40) ++i;
    int depth = 0;
    for (; i < tokens_->size(); ++i) {
      if (tokens_->kind(i) == PG_QUERY__TOKEN__ASCII_40) ++depth;
      if (tokens_->kind(i) == PG_QUERY__TOKEN__ASCII_41 && --depth == 0) return i;
    }
    return Tokens::npos;
  }

  void keep_column_name(const PgQuery__FuncCall& call, std::size_t i, std::string_view name) {
    if (std::find(named_by_call_.begin(), named_by_call_.end(), &call) == named_by_call_.end())
      return;
    const std::size_t close = closing_paren(i);
    if (close == Tokens::npos) return;
    edits_.push_back(
        Edit{(*tokens_)[close].end, (*tokens_)[close].end, " AS " + quote_identifier(name)});
  }

  void on_func_call(const PgQuery__FuncCall& call) {
    if (call.n_funcname == 0 || call.n_funcname > 2) return;
    const char* name = node_string(call.funcname[call.n_funcname - 1]);
    const FunctionTarget* target = name != nullptr ? find_function(name) : nullptr;
    if (target == nullptr) return;
    const std::size_t i = tokens_->at(call.location);
    if (i == Tokens::npos) return;
    const std::string to = replacement(*target, access_);
    if (call.n_funcname == 1) {
      if (!tokens_->is_identifier(i, target->name)) return;
      if (to == target->name) {
        insert_before(i, prefix());
      } else {
        replace_token(i, prefix() + to);
        keep_column_name(call, i, target->name);
      }
      return;
    }
    const char* schema = node_string(call.funcname[0]);
    if (schema == nullptr || std::string_view(schema) != "pg_catalog") return;
    if (!catalog_qualified(i, target->name)) return;
    replace_token(i, quoted_schema_);
    if (to != target->name) {
      replace_token(i + 2, to);
      keep_column_name(call, i, target->name);
    }
  }

  // SHOW wal_level → SELECT "<schema>".current_setting('wal_level') AS wal_level.
  void on_show(const PgQuery__RawStmt& raw) {
    const PgQuery__VariableShowStmt* show = raw.stmt->variable_show_stmt;
    if (show == nullptr || show->name == nullptr || !contains(kShowSettings, show->name)) return;
    const std::size_t begin = static_cast<std::size_t>(std::max(raw.stmt_location, 0));
    const std::size_t end =
        raw.stmt_len > 0 ? std::min(text_.size(), begin + static_cast<std::size_t>(raw.stmt_len))
                         : text_.size();
    const std::size_t first = tokens_->first_from(begin);
    if (first == Tokens::npos || tokens_->kind(first) != PG_QUERY__TOKEN__SHOW) return;
    std::size_t last = first;
    while (last + 1 < tokens_->size() && (*tokens_)[last + 1].end <= end) ++last;
    const std::string name(show->name);
    edits_.push_back(Edit{(*tokens_)[first].start, (*tokens_)[last].end,
                          "SELECT " + prefix() + "current_setting('" + name + "') AS " + name});
  }

  // The AS body of CREATE FUNCTION (options) or DO (args), in plpgsql or sql.
  void on_body(PgQuery__Node* const* options, std::size_t n, bool is_do) {
    const PgQuery__DefElem* as = nullptr;
    std::string language = is_do ? "plpgsql" : "";
    for (std::size_t i = 0; i < n; ++i) {
      const PgQuery__Node* node = options[i];
      if (node == nullptr || node->node_case != PG_QUERY__NODE__NODE_DEF_ELEM) continue;
      const PgQuery__DefElem* def = node->def_elem;
      if (def == nullptr || def->defname == nullptr) continue;
      const std::string_view defname = def->defname;
      if (defname == "as") as = def;
      if (defname == "language") {
        const char* lang = node_string(def->arg);
        if (lang != nullptr) {
          language.clear();
          for (const char* c = lang; *c != '\0'; ++c) language += lower(*c);
        }
      }
    }
    if (as == nullptr || as->arg == nullptr) return;
    const char* body = nullptr;
    if (as->arg->node_case == PG_QUERY__NODE__NODE_STRING) {
      body = node_string(as->arg);
    } else if (as->arg->node_case == PG_QUERY__NODE__NODE_LIST && as->arg->list != nullptr &&
               as->arg->list->n_items == 1) {
      body = node_string(as->arg->list->items[0]);
    }
    if (body == nullptr) return;

    // CREATE FUNCTION's DefElem sits on AS, DO's on the literal itself.
    std::size_t literal = tokens_->at(as->location);
    if (literal != Tokens::npos && tokens_->kind(literal) != PG_QUERY__TOKEN__SCONST) ++literal;
    if (literal == Tokens::npos || tokens_->kind(literal) != PG_QUERY__TOKEN__SCONST) return;
    const std::string_view original = tokens_->text(literal);
    if (!original.empty() && original.front() == '$') {
      // The literal's content must be the body the parser saw.
      const std::size_t tag_end = original.find('$', 1);
      if (tag_end == std::string_view::npos || original.size() < 2 * (tag_end + 1)) return;
      const std::string_view content =
          original.substr(tag_end + 1, original.size() - 2 * (tag_end + 1));
      if (content != body) return;
    }
    if (!mentions_catalog(body)) return;

    std::optional<std::string> rewritten;
    if (language == "plpgsql") {
      rewritten = rewrite_plpgsql(body);
    } else if (language == "sql") {
      TextRewriter inner(quoted_schema_, StatementSource(access_, pg_dump_), depth_ + 1);
      auto r = inner.run(body);
      if (!r.ok()) {
        error_ = r.error();
        return;
      }
      rewritten = std::move(*r);
    }
    if (!rewritten) return;
    std::string quoted = dollar_quote(*rewritten, original);
    const std::size_t start = (*tokens_)[literal].start;
    if (start > 0 && is_identifier_char(text_[start - 1])) quoted.insert(0, " ");
    replace_token(literal, std::move(quoted));
  }

  // plpgsql has no parse tree with offsets here; its scanner is the core one, so the tokens say
  // which identifiers are function calls (followed by '(') or relations (after FROM or JOIN, or
  // qualified by pg_catalog).
  std::optional<std::string> rewrite_plpgsql(const std::string& body) const {
    const std::optional<Tokens> tokens = Tokens::scan(body);
    if (!tokens) return std::nullopt;
    const Tokens& t = *tokens;
    // A name followed by AS may be a CTE or an alias: then unqualified uses are left alone.
    std::vector<std::string> shadowed;
    for (std::size_t i = 0; i + 1 < t.size(); ++i) {
      auto id = t.identifier(i);
      if (id && contains(kRelations, *id) && t.kind(i + 1) == PG_QUERY__TOKEN__AS)
        shadowed.push_back(*id);
    }
    std::vector<Edit> edits;
    auto replace = [&](std::size_t i, std::string text) {
      edits.push_back(Edit{t[i].start, t[i].end, std::move(text)});
    };
    auto qualified_by_catalog = [&](std::size_t i) {
      return i >= 2 && t.kind(i - 1) == PG_QUERY__TOKEN__ASCII_46 &&
             t.is_identifier(i - 2, "pg_catalog") &&
             (i < 3 || t.kind(i - 3) != PG_QUERY__TOKEN__ASCII_46);
    };
    for (std::size_t i = 0; i < t.size(); ++i) {
      const std::optional<std::string> id = t.identifier(i);
      if (!id) continue;
      const bool dotted_before = i >= 1 && t.kind(i - 1) == PG_QUERY__TOKEN__ASCII_46;
      if (t.kind(i + 1) == PG_QUERY__TOKEN__ASCII_40) {
        const FunctionTarget* target = find_function(*id);
        if (target == nullptr) continue;
        const std::string to = replacement(*target, access_);
        const bool renamed = to != target->name;
        if (qualified_by_catalog(i)) {
          replace(i - 2, quoted_schema_);
          if (renamed) replace(i, to);
        } else if (!dotted_before) {
          edits.push_back(Edit{t[i].start, renamed ? t[i].end : t[i].start,
                               prefix() + (renamed ? to : std::string())});
        }
        continue;
      }
      if (!contains(kRelations, *id)) continue;
      if (qualified_by_catalog(i)) {
        replace(i - 2, quoted_schema_);
      } else if (!dotted_before && t.kind(i + 1) != PG_QUERY__TOKEN__ASCII_46 && i >= 1 &&
                 (t.kind(i - 1) == PG_QUERY__TOKEN__FROM ||
                  t.kind(i - 1) == PG_QUERY__TOKEN__JOIN) &&
                 !contains(shadowed, *id)) {
        edits.push_back(Edit{t[i].start, t[i].start, prefix()});
      }
    }
    if (edits.empty()) return std::nullopt;
    return apply_edits(body, std::move(edits));
  }

  const std::string& quoted_schema_;
  SlotAccess access_;
  bool pg_dump_;
  int depth_;
  std::string text_;
  std::optional<Tokens> tokens_;
  std::vector<Edit> edits_;
  std::vector<std::string> ctes_;
  std::vector<const PgQuery__FuncCall*> named_by_call_;
  std::optional<Error> error_;
  bool too_deep_ = false;
};

}  // namespace

SqlRewriter::SqlRewriter(RewriteOptions options)
    : options_(std::move(options)), quoted_schema_(quote_identifier(options_.schema)) {}

bool SqlRewriter::may_need_rewrite(std::string_view sql, const StatementSource& source) const {
  return mentions_catalog(sql, source.pg_dump);
}

Result<std::optional<std::string>> SqlRewriter::rewrite(std::string_view sql,
                                                        const StatementSource& source) const {
  if (!may_need_rewrite(sql, source)) return std::optional<std::string>();
  TextRewriter rewriter(quoted_schema_, source, 0);
  return rewriter.run(sql);
}

namespace {

// Calls `visit` with each statement of `sql` when its text says DATABASE and parses: a cheap
// test first, since every statement through pass-through comes here.
template <typename Visit>
void visit_database_statements(std::string_view sql, Visit visit) {
  static constexpr std::string_view kWord = "database";
  // ASCII folding, as the parser's keywords.
  auto said = std::search(sql.begin(), sql.end(), kWord.begin(), kWord.end(),
                          [](char a, char b) { return lower(a) == b; });
  if (said == sql.end()) return;
  auto parsed = parse_tree(std::string(sql));
  if (!parsed.ok() || !*parsed) return;
  const PgQuery__ParseResult* tree = parsed->get();
  for (std::size_t i = 0; i < tree->n_stmts; ++i) {
    const PgQuery__RawStmt* raw = tree->stmts[i];
    if (raw != nullptr && raw->stmt != nullptr) visit(*raw->stmt);
  }
}

// The option `name` of CREATE or ALTER DATABASE, if it names something (TEMPLATE x,
// TABLESPACE x).
const char* database_option(PgQuery__Node* const* options, std::size_t n, std::string_view name) {
  for (std::size_t i = 0; i < n; ++i) {
    const PgQuery__Node* node = options[i];
    if (node == nullptr || node->node_case != PG_QUERY__NODE__NODE_DEF_ELEM) continue;
    const PgQuery__DefElem* def = node->def_elem;
    if (def != nullptr && def->defname != nullptr && name == def->defname) {
      return node_string(def->arg);
    }
  }
  return nullptr;
}

}  // namespace

std::vector<DatabaseUsedAlone> databases_used_alone(std::string_view sql) {
  std::vector<DatabaseUsedAlone> out;
  visit_database_statements(sql, [&](const PgQuery__Node& node) {
    const PgQuery__Node* stmt = &node;
    const char* name = nullptr;
    const bool dropped = stmt->node_case == PG_QUERY__NODE__NODE_DROPDB_STMT;
    switch (stmt->node_case) {
      case PG_QUERY__NODE__NODE_DROPDB_STMT:
        if (stmt->dropdb_stmt != nullptr) name = stmt->dropdb_stmt->dbname;
        break;
      case PG_QUERY__NODE__NODE_RENAME_STMT:
        if (stmt->rename_stmt != nullptr &&
            stmt->rename_stmt->rename_type == PG_QUERY__OBJECT_TYPE__OBJECT_DATABASE) {
          name = stmt->rename_stmt->subname;
        }
        break;
      case PG_QUERY__NODE__NODE_CREATEDB_STMT:
        if (stmt->createdb_stmt != nullptr) {
          name = database_option(stmt->createdb_stmt->options, stmt->createdb_stmt->n_options,
                                 "template");
          if (name == nullptr) name = "template1";  // Postgres's default template
        }
        break;
      case PG_QUERY__NODE__NODE_ALTER_DATABASE_STMT:
        if (stmt->alter_database_stmt != nullptr &&
            database_option(stmt->alter_database_stmt->options,
                            stmt->alter_database_stmt->n_options, "tablespace") != nullptr) {
          name = stmt->alter_database_stmt->dbname;
        }
        break;
      default:
        break;
    }
    if (name != nullptr && *name != '\0') out.push_back({name, dropped});
  });
  return out;
}

}  // namespace pgrelay::server
