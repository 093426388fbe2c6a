// Evaluates PostgreSQL 15 publication row filters (WHERE) over pgoutput tuples' text values.
#include "server/row_filter.h"

#include <pg_query.h>
#include <pg_query/pg_query.pb-c.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <variant>

namespace pgrelay::server {
namespace {

// ---------------------------------------------------------------------------------------------
// Untyped expression tree, read from libpg_query's parse tree.

struct Expr {
  enum class Kind {
    kColumn,      // text: column name
    kInt,         // ival; bits: 4 or 8 (int4 or int8 literal)
    kNumeric,     // text: decimal literal
    kString,      // text: string literal (type unknown until context decides)
    kBool,        // bval
    kNull,        // untyped NULL
    kCast,        // text: target type; args[0]
    kCollate,     // text: collation name; args[0]
    kCompare,     // text: operator; args[0], args[1]
    kAnd,         // args
    kOr,          // args
    kNot,         // args[0]
    kNullTest,    // negate: IS NOT NULL; args[0]
    kBoolTest,    // test: PgQuery__BoolTestType; args[0]
    kQuantified,  // text: operator; all: ALL rather than ANY; args[0] scalar, args[1..] elements
    kDistinct,    // negate: IS NOT DISTINCT FROM; args[0], args[1]
  };
  Kind kind = Kind::kNull;
  std::string text;
  std::int64_t ival = 0;
  int bits = 4;
  bool bval = false;
  bool negate = false;
  bool all = false;
  int test = 0;
  std::vector<Expr> args;
};

Error unsupported(const std::string& what) {
  return Error::make(sqlstate::kFeatureNotSupported, what);
}

std::string string_of(const PgQuery__Node* node) {
  if (node != nullptr && node->node_case == PG_QUERY__NODE__NODE_STRING &&
      node->string != nullptr && node->string->sval != nullptr) {
    return node->string->sval;
  }
  return {};
}

// The name of an unsupported node, as the parse tree calls it ("FuncCall", "SubLink", ...).
std::string node_name(const PgQuery__Node* node) {
  if (node == nullptr) return "empty expression";
  const ProtobufCFieldDescriptor* field =
      protobuf_c_message_descriptor_get_field(node->base.descriptor, node->node_case);
  if (field != nullptr && field->descriptor != nullptr) {
    return static_cast<const ProtobufCMessageDescriptor*>(field->descriptor)->short_name;
  }
  return "expression";
}

// Built-in type names a cast may name, as the parser leaves them (SQL-standard spellings come
// out as pg_catalog.int4, pg_catalog.float8, ...).
const char* const kCastTypes[] = {"bool",   "int2",   "int4", "int8",    "oid",    "numeric",
                                  "float4", "float8", "text", "varchar", "bpchar", "name"};

Result<std::string> cast_type_name(const PgQuery__TypeName* type) {
  if (type == nullptr || type->n_names == 0) return unsupported("a cast without a type");
  std::string name = string_of(type->names[type->n_names - 1]);
  std::string shown = name;
  if (type->n_names == 2) shown = string_of(type->names[0]) + "." + name;
  if (type->n_names > 2 || (type->n_names == 2 && string_of(type->names[0]) != "pg_catalog")) {
    return unsupported("a cast to type " + shown);
  }
  if (type->n_array_bounds > 0) return unsupported("a cast to array type " + shown + "[]");
  if (type->n_typmods > 0 || type->setof || type->pct_type) {
    return unsupported("a cast to " + shown + " with a type modifier");
  }
  for (const char* known : kCastTypes) {
    if (name == known) return name;
  }
  return unsupported("a cast to type " + shown);
}

Result<Expr> convert(const PgQuery__Node* node, int depth);

Result<std::vector<Expr>> convert_list(PgQuery__Node* const* items, std::size_t n, int depth) {
  std::vector<Expr> out;
  for (std::size_t i = 0; i < n; ++i) {
    auto e = convert(items[i], depth + 1);
    if (!e.ok()) return e.error();
    out.push_back(std::move(*e));
  }
  return out;
}

Result<Expr> convert_const(const PgQuery__AConst* c) {
  Expr e;
  if (c->isnull) {
    e.kind = Expr::Kind::kNull;
    return e;
  }
  switch (c->val_case) {
    case PG_QUERY__A__CONST__VAL_IVAL:
      e.kind = Expr::Kind::kInt;
      e.ival = c->ival != nullptr ? c->ival->ival : 0;
      return e;
    case PG_QUERY__A__CONST__VAL_FVAL: {
      // Postgres types a numeric literal without a point or exponent as int8 when it fits.
      std::string text = c->fval != nullptr && c->fval->fval != nullptr ? c->fval->fval : "";
      std::int64_t v = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec == std::errc() && ptr == text.data() + text.size()) {
        e.kind = Expr::Kind::kInt;
        e.ival = v;
        e.bits = 8;
        return e;
      }
      e.kind = Expr::Kind::kNumeric;
      e.text = std::move(text);
      return e;
    }
    case PG_QUERY__A__CONST__VAL_SVAL:
      e.kind = Expr::Kind::kString;
      e.text = c->sval != nullptr && c->sval->sval != nullptr ? c->sval->sval : "";
      return e;
    case PG_QUERY__A__CONST__VAL_BOOLVAL:
      e.kind = Expr::Kind::kBool;
      e.bval = c->boolval != nullptr && c->boolval->boolval;
      return e;
    default:
      return unsupported("a bit string constant");
  }
}

Result<Expr> convert_a_expr(const PgQuery__AExpr* a, int depth) {
  std::string op = a->n_name == 1 ? string_of(a->name[0]) : std::string();
  if (a->n_name == 2 && string_of(a->name[0]) == "pg_catalog") op = string_of(a->name[1]);
  auto side = [&](const PgQuery__Node* n) { return convert(n, depth + 1); };
  const bool comparison =
      op == "=" || op == "<>" || op == "<" || op == "<=" || op == ">" || op == ">=";
  Expr e;
  switch (a->kind) {
    case PG_QUERY__A__EXPR__KIND__AEXPR_OP: {
      if (op == "-" && a->lexpr == nullptr && a->rexpr != nullptr &&
          a->rexpr->node_case == PG_QUERY__NODE__NODE_A_CONST) {
        // The parser folds "-5" into the constant; this is "- (5)" written with a space.
        auto inner = side(a->rexpr);
        if (!inner.ok()) return inner.error();
        if (inner->kind == Expr::Kind::kInt &&
            inner->ival != std::numeric_limits<std::int64_t>::min()) {
          inner->ival = -inner->ival;
          return inner;
        }
        if (inner->kind == Expr::Kind::kNumeric) {
          inner->text = inner->text.rfind('-', 0) == 0 ? inner->text.substr(1) : "-" + inner->text;
          return inner;
        }
      }
      if (!comparison || a->lexpr == nullptr || a->rexpr == nullptr) {
        return unsupported("operator " + (op.empty() ? std::string("(qualified)") : op));
      }
      auto l = side(a->lexpr);
      if (!l.ok()) return l.error();
      auto r = side(a->rexpr);
      if (!r.ok()) return r.error();
      e.kind = Expr::Kind::kCompare;
      e.text = op;
      e.args = {std::move(*l), std::move(*r)};
      return e;
    }
    case PG_QUERY__A__EXPR__KIND__AEXPR_OP_ANY:
    case PG_QUERY__A__EXPR__KIND__AEXPR_OP_ALL:
    case PG_QUERY__A__EXPR__KIND__AEXPR_IN: {
      const bool in = a->kind == PG_QUERY__A__EXPR__KIND__AEXPR_IN;
      if (!comparison) return unsupported("operator " + op + " with ANY/ALL");
      PgQuery__Node* const* items = nullptr;
      std::size_t n = 0;
      if (in) {
        if (a->rexpr == nullptr || a->rexpr->node_case != PG_QUERY__NODE__NODE_LIST) {
          return unsupported("IN with a subquery");
        }
        items = a->rexpr->list->items;
        n = a->rexpr->list->n_items;
      } else {
        if (a->rexpr == nullptr || a->rexpr->node_case != PG_QUERY__NODE__NODE_A_ARRAY_EXPR) {
          return unsupported("ANY/ALL over something other than ARRAY[...]");
        }
        items = a->rexpr->a_array_expr->elements;
        n = a->rexpr->a_array_expr->n_elements;
      }
      auto l = side(a->lexpr);
      if (!l.ok()) return l.error();
      auto elements = convert_list(items, n, depth);
      if (!elements.ok()) return elements.error();
      e.kind = Expr::Kind::kQuantified;
      e.text = op;
      // x IN (...) is x = ANY (...); x NOT IN (...) is x <> ALL (...).
      e.all = in ? op == "<>" : a->kind == PG_QUERY__A__EXPR__KIND__AEXPR_OP_ALL;
      e.args.push_back(std::move(*l));
      for (auto& el : *elements) e.args.push_back(std::move(el));
      return e;
    }
    case PG_QUERY__A__EXPR__KIND__AEXPR_DISTINCT:
    case PG_QUERY__A__EXPR__KIND__AEXPR_NOT_DISTINCT: {
      auto l = side(a->lexpr);
      if (!l.ok()) return l.error();
      auto r = side(a->rexpr);
      if (!r.ok()) return r.error();
      e.kind = Expr::Kind::kDistinct;
      e.negate = a->kind == PG_QUERY__A__EXPR__KIND__AEXPR_NOT_DISTINCT;
      e.args = {std::move(*l), std::move(*r)};
      return e;
    }
    case PG_QUERY__A__EXPR__KIND__AEXPR_BETWEEN:
    case PG_QUERY__A__EXPR__KIND__AEXPR_NOT_BETWEEN: {
      if (a->rexpr == nullptr || a->rexpr->node_case != PG_QUERY__NODE__NODE_LIST ||
          a->rexpr->list->n_items != 2) {
        return unsupported("a malformed BETWEEN");
      }
      const bool negated = a->kind == PG_QUERY__A__EXPR__KIND__AEXPR_NOT_BETWEEN;
      auto x = side(a->lexpr);
      if (!x.ok()) return x.error();
      auto lo = side(a->rexpr->list->items[0]);
      if (!lo.ok()) return lo.error();
      auto hi = side(a->rexpr->list->items[1]);
      if (!hi.ok()) return hi.error();
      // As the parser rewrites it: x >= lo AND x <= hi; NOT BETWEEN: x < lo OR x > hi.
      Expr low, high;
      low.kind = high.kind = Expr::Kind::kCompare;
      low.text = negated ? "<" : ">=";
      high.text = negated ? ">" : "<=";
      low.args = {*x, std::move(*lo)};
      high.args = {std::move(*x), std::move(*hi)};
      e.kind = negated ? Expr::Kind::kOr : Expr::Kind::kAnd;
      e.args = {std::move(low), std::move(high)};
      return e;
    }
    case PG_QUERY__A__EXPR__KIND__AEXPR_LIKE:
      return unsupported("LIKE");
    case PG_QUERY__A__EXPR__KIND__AEXPR_ILIKE:
      return unsupported("ILIKE");
    case PG_QUERY__A__EXPR__KIND__AEXPR_SIMILAR:
      return unsupported("SIMILAR TO");
    case PG_QUERY__A__EXPR__KIND__AEXPR_NULLIF:
      return unsupported("NULLIF");
    default:
      return unsupported("BETWEEN SYMMETRIC");
  }
}

Result<Expr> convert(const PgQuery__Node* node, int depth) {
  if (depth > 200) return unsupported("an expression nested this deeply");
  if (node == nullptr) return unsupported("an empty expression");
  Expr e;
  switch (node->node_case) {
    case PG_QUERY__NODE__NODE_COLUMN_REF: {
      const PgQuery__ColumnRef* c = node->column_ref;
      if (c->n_fields != 1 || c->fields[0]->node_case != PG_QUERY__NODE__NODE_STRING) {
        return unsupported("a qualified column reference");
      }
      e.kind = Expr::Kind::kColumn;
      e.text = string_of(c->fields[0]);
      return e;
    }
    case PG_QUERY__NODE__NODE_A_CONST:
      return convert_const(node->a_const);
    case PG_QUERY__NODE__NODE_TYPE_CAST: {
      auto type = cast_type_name(node->type_cast->type_name);
      if (!type.ok()) return type.error();
      auto arg = convert(node->type_cast->arg, depth + 1);
      if (!arg.ok()) return arg.error();
      e.kind = Expr::Kind::kCast;
      e.text = std::move(*type);
      e.args.push_back(std::move(*arg));
      return e;
    }
    case PG_QUERY__NODE__NODE_COLLATE_CLAUSE: {
      const PgQuery__CollateClause* c = node->collate_clause;
      std::string name = c->n_collname > 0 ? string_of(c->collname[c->n_collname - 1]) : "";
      if (c->n_collname == 2 && string_of(c->collname[0]) != "pg_catalog") name.clear();
      if (c->n_collname > 2 || (name != "C" && name != "POSIX" && name != "default")) {
        return unsupported("COLLATE other than \"C\", \"POSIX\" or \"default\"");
      }
      auto arg = convert(c->arg, depth + 1);
      if (!arg.ok()) return arg.error();
      e.kind = Expr::Kind::kCollate;
      e.text = std::move(name);
      e.args.push_back(std::move(*arg));
      return e;
    }
    case PG_QUERY__NODE__NODE_A_EXPR:
      return convert_a_expr(node->a_expr, depth);
    case PG_QUERY__NODE__NODE_BOOL_EXPR: {
      const PgQuery__BoolExpr* b = node->bool_expr;
      auto args = convert_list(b->args, b->n_args, depth);
      if (!args.ok()) return args.error();
      switch (b->boolop) {
        case PG_QUERY__BOOL_EXPR_TYPE__AND_EXPR:
          e.kind = Expr::Kind::kAnd;
          break;
        case PG_QUERY__BOOL_EXPR_TYPE__OR_EXPR:
          e.kind = Expr::Kind::kOr;
          break;
        default:
          if (args->size() != 1) return unsupported("a malformed NOT");
          e.kind = Expr::Kind::kNot;
          break;
      }
      e.args = std::move(*args);
      return e;
    }
    case PG_QUERY__NODE__NODE_NULL_TEST: {
      if (node->null_test->argisrow) return unsupported("IS NULL on a row");
      auto arg = convert(node->null_test->arg, depth + 1);
      if (!arg.ok()) return arg.error();
      e.kind = Expr::Kind::kNullTest;
      e.negate = node->null_test->nulltesttype == PG_QUERY__NULL_TEST_TYPE__IS_NOT_NULL;
      e.args.push_back(std::move(*arg));
      return e;
    }
    case PG_QUERY__NODE__NODE_BOOLEAN_TEST: {
      auto arg = convert(node->boolean_test->arg, depth + 1);
      if (!arg.ok()) return arg.error();
      e.kind = Expr::Kind::kBoolTest;
      e.test = node->boolean_test->booltesttype;
      e.args.push_back(std::move(*arg));
      return e;
    }
    case PG_QUERY__NODE__NODE_FUNC_CALL: {
      const PgQuery__FuncCall* f = node->func_call;
      std::string name;
      for (std::size_t i = 0; i < f->n_funcname; ++i) {
        if (i) name += '.';
        name += string_of(f->funcname[i]);
      }
      return unsupported("function call " + name + "()");
    }
    default:
      return unsupported("expression node " + node_name(node));
  }
}

// Parses a deparsed filter as `SELECT <expr>`.
Result<Expr> parse_filter(const std::string& expression) {
  if (expression.find('\0') != std::string::npos) {
    return Error::make(sqlstate::kSyntaxError, "row filter contains a NUL byte");
  }
  const std::string sql = "SELECT " + expression;
  PgQueryProtobufParseResult parsed = pg_query_parse_protobuf(sql.c_str());
  std::unique_ptr<PgQueryProtobufParseResult, void (*)(PgQueryProtobufParseResult*)> parsed_guard(
      &parsed, [](PgQueryProtobufParseResult* p) { pg_query_free_protobuf_parse_result(*p); });
  if (parsed.error != nullptr) {
    return Error::make(sqlstate::kSyntaxError,
                       std::string("could not parse row filter: ") +
                           (parsed.error->message ? parsed.error->message : "syntax error"));
  }
  PgQuery__ParseResult* tree =
      pg_query__parse_result__unpack(nullptr, parsed.parse_tree.len,
                                     reinterpret_cast<const std::uint8_t*>(parsed.parse_tree.data));
  if (tree == nullptr) {
    return Error::make(sqlstate::kInternalError, "could not read the SQL parser's output");
  }
  std::unique_ptr<PgQuery__ParseResult, void (*)(PgQuery__ParseResult*)> tree_guard(
      tree, [](PgQuery__ParseResult* t) { pg_query__parse_result__free_unpacked(t, nullptr); });
  const PgQuery__SelectStmt* select = nullptr;
  if (tree->n_stmts == 1 && tree->stmts[0]->stmt != nullptr &&
      tree->stmts[0]->stmt->node_case == PG_QUERY__NODE__NODE_SELECT_STMT) {
    select = tree->stmts[0]->stmt->select_stmt;
  }
  if (select == nullptr || select->n_target_list != 1 || select->n_from_clause != 0 ||
      select->where_clause != nullptr || select->n_group_clause != 0 ||
      select->having_clause != nullptr || select->n_sort_clause != 0 ||
      select->limit_count != nullptr || select->with_clause != nullptr ||
      select->n_distinct_clause != 0 || select->larg != nullptr ||
      select->target_list[0]->node_case != PG_QUERY__NODE__NODE_RES_TARGET ||
      (select->target_list[0]->res_target->name != nullptr &&
       select->target_list[0]->res_target->name[0] != '\0')) {
    return Error::make(sqlstate::kSyntaxError, "row filter is not a single expression");
  }
  return convert(select->target_list[0]->res_target->val, 0);
}

// ---------------------------------------------------------------------------------------------
// Values.

// An exact decimal: value = 0.digits × 10^exponent, or NaN / ±Infinity.
struct Decimal {
  enum Kind : std::uint8_t { kNegInf = 0, kFinite = 1, kPosInf = 2, kNaN = 3 };
  Kind kind = kFinite;
  bool negative = false;
  std::string digits;  // no leading or trailing zeros; empty for zero
  std::int64_t exponent = 0;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' ||
                        s.front() == '\r' || s.front() == '\f' || s.front() == '\v'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' ||
                        s.back() == '\r' || s.back() == '\f' || s.back() == '\v'))
    s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == y;
         });
}

// numeric_in's syntax (and numeric_out's output).
std::optional<Decimal> parse_decimal(std::string_view text) {
  std::string_view s = trim(text);
  Decimal d;
  if (iequals(s, "nan")) {
    d.kind = Decimal::kNaN;
    return d;
  }
  if (iequals(s, "infinity") || iequals(s, "+infinity") || iequals(s, "inf") ||
      iequals(s, "+inf")) {
    d.kind = Decimal::kPosInf;
    return d;
  }
  if (iequals(s, "-infinity") || iequals(s, "-inf")) {
    d.kind = Decimal::kNegInf;
    return d;
  }
  std::size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) d.negative = s[i++] == '-';
  std::string all;
  std::int64_t int_digits = 0;
  bool point = false, any = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      all += c;
      any = true;
      if (!point) ++int_digits;
    } else if (c == '.' && !point) {
      point = true;
    } else {
      break;
    }
  }
  if (!any) return std::nullopt;
  std::int64_t exp = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    const std::size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (i - start > 8) return std::nullopt;  // far beyond numeric's range
      exp = exp * 10 + (s[i] - '0');
      ++i;
    }
    if (i == start) return std::nullopt;
    if (neg) exp = -exp;
  }
  if (i != s.size()) return std::nullopt;
  std::size_t lead = 0;
  while (lead < all.size() && all[lead] == '0') ++lead;
  std::size_t end = all.size();
  while (end > lead && all[end - 1] == '0') --end;
  d.digits = all.substr(lead, end - lead);
  d.exponent = int_digits - static_cast<std::int64_t>(lead) + exp;
  if (d.digits.empty()) {
    d.negative = false;
    d.exponent = 0;
  }
  return d;
}

Decimal decimal_of(std::int64_t v) {
  // Through text: exact, and INT64_MIN has no positive counterpart.
  return *parse_decimal(std::to_string(v));
}

int compare_decimal(const Decimal& a, const Decimal& b) {
  if (a.kind != b.kind) return a.kind < b.kind ? -1 : 1;
  if (a.kind != Decimal::kFinite) return 0;
  const int sa = a.digits.empty() ? 0 : (a.negative ? -1 : 1);
  const int sb = b.digits.empty() ? 0 : (b.negative ? -1 : 1);
  if (sa != sb) return sa < sb ? -1 : 1;
  if (sa == 0) return 0;
  int magnitude = 0;
  if (a.exponent != b.exponent) {
    magnitude = a.exponent < b.exponent ? -1 : 1;
  } else {
    const int c = a.digits.compare(b.digits);
    magnitude = c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  return sa < 0 ? -magnitude : magnitude;
}

// "0.<digits>e<exponent>", which from_chars reads with correct rounding (float8in's strtod).
std::string scientific(const Decimal& d) {
  if (d.digits.empty()) return "0";
  return std::string(d.negative ? "-" : "") + "0." + d.digits + "e" + std::to_string(d.exponent);
}

// float4in / float8in for the texts float4out, float8out and literals produce.
template <typename F>
std::optional<F> parse_float(std::string_view text) {
  std::string_view s = trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  F v{};
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

int compare_float(double a, double b) {
  if (std::isnan(a)) return std::isnan(b) ? 0 : 1;
  if (std::isnan(b)) return -1;
  return a < b ? -1 : (a > b ? 1 : 0);
}

std::optional<bool> parse_bool(std::string_view text) {
  std::string s(trim(text));
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto prefix_of = [&](std::string_view word, std::size_t min) {
    return s.size() >= min && s.size() <= word.size() && word.substr(0, s.size()) == s;
  };
  if (prefix_of("true", 1) || prefix_of("yes", 1) || prefix_of("on", 2) || s == "1") return true;
  if (prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) || s == "0") return false;
  return std::nullopt;
}

std::optional<std::int64_t> parse_int(std::string_view text, std::int64_t lo, std::int64_t hi) {
  std::string_view s = trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || v < lo || v > hi) {
    return std::nullopt;
  }
  return v;
}

enum class Ty {
  kBool,
  kInt2,
  kInt4,
  kInt8,
  kOid,
  kNumeric,
  kFloat4,
  kFloat8,
  kText,
  kVarchar,
  kBpchar,
  kName,
  kUnknown,  // a string literal whose type the context decides
  kNull,     // an untyped NULL
  kOther,    // a column of a type the filter may only test for NULL
};

const char* ty_name(Ty t) {
  switch (t) {
    case Ty::kBool:
      return "boolean";
    case Ty::kInt2:
      return "smallint";
    case Ty::kInt4:
      return "integer";
    case Ty::kInt8:
      return "bigint";
    case Ty::kOid:
      return "oid";
    case Ty::kNumeric:
      return "numeric";
    case Ty::kFloat4:
      return "real";
    case Ty::kFloat8:
      return "double precision";
    case Ty::kText:
      return "text";
    case Ty::kVarchar:
      return "character varying";
    case Ty::kBpchar:
      return "character";
    case Ty::kName:
      return "name";
    case Ty::kUnknown:
      return "unknown";
    case Ty::kNull:
      return "null";
    case Ty::kOther:
      return "other";
  }
  return "?";
}

Ty ty_of_oid(pgoutput::Oid oid) {
  switch (oid) {
    case 16:
      return Ty::kBool;
    case 21:
      return Ty::kInt2;
    case 23:
      return Ty::kInt4;
    case 20:
      return Ty::kInt8;
    case 26:
      return Ty::kOid;
    case 1700:
      return Ty::kNumeric;
    case 700:
      return Ty::kFloat4;
    case 701:
      return Ty::kFloat8;
    case 25:
      return Ty::kText;
    case 1043:
      return Ty::kVarchar;
    case 1042:
      return Ty::kBpchar;
    case 19:
      return Ty::kName;
    default:
      return Ty::kOther;
  }
}

Ty ty_of_name(const std::string& n) {
  if (n == "bool") return Ty::kBool;
  if (n == "int2") return Ty::kInt2;
  if (n == "int4") return Ty::kInt4;
  if (n == "int8") return Ty::kInt8;
  if (n == "oid") return Ty::kOid;
  if (n == "numeric") return Ty::kNumeric;
  if (n == "float4") return Ty::kFloat4;
  if (n == "float8") return Ty::kFloat8;
  if (n == "text") return Ty::kText;
  if (n == "varchar") return Ty::kVarchar;
  if (n == "bpchar") return Ty::kBpchar;
  return Ty::kName;  // cast_type_name admits nothing else
}

bool is_int(Ty t) {
  return t == Ty::kInt2 || t == Ty::kInt4 || t == Ty::kInt8;
}
bool is_float(Ty t) {
  return t == Ty::kFloat4 || t == Ty::kFloat8;
}
bool is_string(Ty t) {
  return t == Ty::kText || t == Ty::kVarchar || t == Ty::kBpchar || t == Ty::kName;
}
int int_rank(Ty t) {
  return t == Ty::kInt2 ? 2 : (t == Ty::kInt4 ? 4 : 8);
}
std::int64_t int_min(Ty t) {
  return t == Ty::kInt2 ? INT16_MIN : (t == Ty::kInt4 ? INT32_MIN : INT64_MIN);
}
std::int64_t int_max(Ty t) {
  return t == Ty::kInt2 ? INT16_MAX : (t == Ty::kInt4 ? INT32_MAX : INT64_MAX);
}

std::string rtrim_spaces(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

using Datum = std::variant<std::monostate, bool, std::int64_t, Decimal, double, std::string>;
struct Value {
  bool null = true;
  Datum d;
};
Value null_value() {
  return Value{};
}
Value value(Datum d) {
  return Value{false, std::move(d)};
}

struct EvalCtx {
  const pgoutput::Tuple* tuple = nullptr;
  std::optional<Error> error;  // first failure; the result is then meaningless
};
using Eval = std::function<Value(EvalCtx&)>;

// Collation of an expression and how it was derived (parse_collate.c's strengths).
struct Coll {
  enum Strength { kNone, kImplicit, kExplicit } strength = kNone;
  std::string name;  // "default", "C", "POSIX" or another pg_collation name
  bool deterministic = true;
};

struct Typed {
  Ty ty = Ty::kNull;
  std::string other_type;  // kOther: the column's type, for messages
  Eval eval;
  Coll coll;
  bool constant = false;
  std::string literal;  // kUnknown: the string
};

std::string shown_type(const Typed& t) {
  return t.ty == Ty::kOther ? "type " + t.other_type : std::string(ty_name(t.ty));
}

Coll type_default_collation(Ty t) {
  if (t == Ty::kName) return Coll{Coll::kImplicit, "C", true};
  if (is_string(t)) return Coll{Coll::kImplicit, "default", true};
  return Coll{};
}

Typed constant(Ty ty, Value v) {
  Typed t;
  t.ty = ty;
  t.constant = true;
  t.coll = type_default_collation(ty);
  t.eval = [v = std::move(v)](EvalCtx&) { return v; };
  return t;
}

// The input function of `ty` applied to a literal (errors mean Postgres would have rejected
// the literal, or would transform it in ways not reproduced here).
Result<Value> parse_literal(Ty ty, const std::string& s) {
  auto bad = [&] { return unsupported("the literal '" + s + "' as " + ty_name(ty)); };
  switch (ty) {
    case Ty::kBool: {
      auto b = parse_bool(s);
      if (!b) return bad();
      return value(*b);
    }
    case Ty::kInt2:
    case Ty::kInt4:
    case Ty::kInt8: {
      auto v = parse_int(s, int_min(ty), int_max(ty));
      if (!v) return bad();
      return value(*v);
    }
    case Ty::kOid: {
      auto v = parse_int(s, 0, UINT32_MAX);
      if (!v) return bad();
      return value(*v);
    }
    case Ty::kNumeric: {
      auto d = parse_decimal(s);
      if (!d) return bad();
      return value(std::move(*d));
    }
    case Ty::kFloat4: {
      auto f = parse_float<float>(s);
      if (!f) return bad();
      return value(static_cast<double>(*f));
    }
    case Ty::kFloat8: {
      auto f = parse_float<double>(s);
      if (!f) return bad();
      return value(*f);
    }
    case Ty::kName:
      if (s.size() > 63) return bad();  // namein truncates
      return value(s);
    case Ty::kText:
    case Ty::kVarchar:
    case Ty::kBpchar:
      return value(s);
    default:
      return bad();
  }
}

// A value of a column, from its text in the tuple.
Value column_value(EvalCtx& ctx, std::size_t index, Ty ty, const std::string& name) {
  if (ctx.tuple == nullptr) return null_value();
  if (index >= ctx.tuple->columns.size()) {
    if (!ctx.error) {
      ctx.error = Error::make(
          sqlstate::kDataCorrupted,
          "a tuple has fewer columns than its Relation (row filter column \"" + name + "\")");
    }
    return null_value();
  }
  const pgoutput::TupleValue& tv = ctx.tuple->columns[index];
  switch (tv.kind) {
    case pgoutput::ValueKind::kNull:
      return null_value();
    case pgoutput::ValueKind::kText:
      break;
    default:
      if (!ctx.error) {
        ctx.error = Error::make(
            sqlstate::kFeatureNotSupported,
            "row filter needs column \"" + name +
                "\", whose value the change does not carry "
                "(an unchanged TOAST value)",
            "Set REPLICA IDENTITY FULL on the table, so that updates carry the old values.");
      }
      return null_value();
  }
  if (ty == Ty::kOther) return value(std::monostate{});
  auto parsed = parse_literal(ty, tv.bytes);
  if (!parsed.ok() || (ty == Ty::kBool && tv.bytes != "t" && tv.bytes != "f")) {
    if (!ctx.error) {
      ctx.error =
          Error::make(sqlstate::kDataCorrupted, "column \"" + name + "\" holds \"" + tv.bytes +
                                                    "\", which is not a " + ty_name(ty) + " value");
    }
    return null_value();
  }
  return *parsed;
}

// Three-way comparison of two non-null values of one comparison class.
enum class Cls { kInt, kNumeric, kFloat, kBool, kText, kBpchar };
int compare_values(Cls cls, const Datum& a, const Datum& b) {
  switch (cls) {
    case Cls::kInt: {
      auto x = std::get<std::int64_t>(a), y = std::get<std::int64_t>(b);
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    case Cls::kNumeric:
      return compare_decimal(std::get<Decimal>(a), std::get<Decimal>(b));
    case Cls::kFloat:
      return compare_float(std::get<double>(a), std::get<double>(b));
    case Cls::kBool: {
      int x = std::get<bool>(a), y = std::get<bool>(b);
      return x - y;
    }
    case Cls::kText: {
      int c = std::string_view(std::get<std::string>(a)).compare(std::get<std::string>(b));
      return c < 0 ? -1 : (c > 0 ? 1 : 0);
    }
    case Cls::kBpchar: {
      std::string_view x = std::get<std::string>(a), y = std::get<std::string>(b);
      while (!x.empty() && x.back() == ' ') x.remove_suffix(1);
      while (!y.empty() && y.back() == ' ') y.remove_suffix(1);
      int c = x.compare(y);
      return c < 0 ? -1 : (c > 0 ? 1 : 0);
    }
  }
  return 0;
}

bool op_holds(const std::string& op, int c) {
  if (op == "=") return c == 0;
  if (op == "<>") return c != 0;
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;  // ">="
}

class Compiler {
 public:
  Compiler(const pgoutput::Relation& relation, const FilterContext& context)
      : relation_(relation), context_(context) {}

  Result<Typed> compile(const Expr& e);
  // The whole filter: a boolean (an unknown literal or NULL is coerced, as the parser does).
  Result<Typed> compile_filter(const Expr& e) {
    auto t = compile(e);
    if (!t.ok()) return t.error();
    return as_bool(std::move(*t));
  }

 private:
  Result<Typed> column(const Expr& e);
  Result<Typed> cast(const Expr& e);
  Result<Typed> cast_to(Typed arg, Ty to);
  Result<Typed> boolean(const Expr& e);
  Result<Typed> as_bool(Typed t);
  // Resolves an unknown literal against the other side; checks the pair has an operator.
  Result<Cls> comparable(Typed& l, Typed& r, const std::string& op);
  Result<Typed> compare(const Expr& e);
  Result<Typed> quantified(const Expr& e);
  Result<Typed> distinct(const Expr& e);

  const pgoutput::Relation& relation_;
  const FilterContext& context_;
};

Result<Typed> Compiler::column(const Expr& e) {
  for (std::size_t i = 0; i < relation_.columns.size(); ++i) {
    const pgoutput::Column& col = relation_.columns[i];
    if (col.name != e.text) continue;
    Typed t;
    t.ty = ty_of_oid(col.type_oid);
    auto info = context_.columns.find(col.name);
    if (t.ty == Ty::kOther) {
      t.other_type = info != context_.columns.end() && !info->second.type_name.empty()
                         ? info->second.type_name
                         : "OID " + std::to_string(col.type_oid);
    }
    if (is_string(t.ty)) {
      t.coll.strength = Coll::kImplicit;
      t.coll.name = info != context_.columns.end() ? info->second.collation : "default";
      t.coll.deterministic = info == context_.columns.end() || info->second.deterministic;
      if (t.coll.name.empty()) t.coll.name = "default";
    }
    const Ty ty = t.ty;
    const std::string name = col.name;
    t.eval = [i, ty, name](EvalCtx& ctx) { return column_value(ctx, i, ty, name); };
    return t;
  }
  return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                     "row filter names column \"" + e.text + "\", which table \"" +
                         relation_.namespace_name + "." + relation_.name + "\" does not have now",
                     "Restart replication so that pgrelay reads the publication again.");
}

Result<Typed> Compiler::cast_to(Typed arg, Ty to) {
  const Ty from = arg.ty;
  Coll coll = is_string(to) ? (arg.coll.strength != Coll::kNone && is_string(from)
                                   ? arg.coll
                                   : type_default_collation(to))
                            : Coll{};
  auto with = [&](std::function<Value(Value)> f) {
    Typed t;
    t.ty = to;
    t.coll = coll;
    t.constant = arg.constant;
    t.eval = [inner = std::move(arg.eval), f = std::move(f)](EvalCtx& ctx) {
      Value v = inner(ctx);
      if (v.null) return v;
      return f(std::move(v));
    };
    return t;
  };
  auto identity = [](Value v) { return v; };
  if (from == Ty::kNull) {
    Typed t = constant(to, null_value());
    t.coll = coll;
    return t;
  }
  if (from == Ty::kUnknown) {
    auto v = parse_literal(to, arg.literal);
    if (!v.ok()) return v.error();
    Typed t = constant(to, std::move(*v));
    t.coll = coll;
    return t;
  }
  if (from == to) return with(identity);
  const std::string what = std::string("a cast from ") + ty_name(from) + " to " + ty_name(to);
  if (is_int(from) && is_int(to)) {
    if (int_rank(to) >= int_rank(from)) return with(identity);
    if (arg.constant) {  // narrowing a constant: exact when it fits
      EvalCtx ctx;
      Value v = arg.eval(ctx);
      if (v.null || (std::get<std::int64_t>(v.d) >= int_min(to) &&
                     std::get<std::int64_t>(v.d) <= int_max(to))) {
        return constant(to, std::move(v));
      }
    }
    return unsupported(what);
  }
  if (is_int(from) && to == Ty::kOid && arg.constant) {
    EvalCtx ctx;
    Value v = arg.eval(ctx);
    if (v.null) return constant(to, v);
    std::int64_t x = std::get<std::int64_t>(v.d);
    if (from != Ty::kInt8 && x < 0) x += std::int64_t(1) << 32;  // int4 -> oid wraps
    if (x >= 0 && x <= UINT32_MAX) return constant(to, value(x));
    return unsupported(what);
  }
  if (is_int(from) && to == Ty::kNumeric) {
    return with([](Value v) { return value(decimal_of(std::get<std::int64_t>(v.d))); });
  }
  if (is_int(from) && to == Ty::kFloat8) {
    return with([](Value v) { return value(static_cast<double>(std::get<std::int64_t>(v.d))); });
  }
  if (is_int(from) && to == Ty::kFloat4) {
    return with([](Value v) {
      return value(static_cast<double>(static_cast<float>(std::get<std::int64_t>(v.d))));
    });
  }
  if (from == Ty::kNumeric && is_float(to)) {
    // numeric_float8/numeric_float4 print the numeric and read it with float8in/float4in.
    const bool single = to == Ty::kFloat4;
    auto f = [single](const Decimal& d) -> std::optional<double> {
      switch (d.kind) {
        case Decimal::kNaN:
          return std::numeric_limits<double>::quiet_NaN();
        case Decimal::kPosInf:
          return std::numeric_limits<double>::infinity();
        case Decimal::kNegInf:
          return -std::numeric_limits<double>::infinity();
        default:
          break;
      }
      const std::string s = scientific(d);
      if (single) {
        auto v = parse_float<float>(s);
        if (!v) return std::nullopt;
        return static_cast<double>(*v);
      }
      return parse_float<double>(s);
    };
    Typed t;
    t.ty = to;
    t.constant = arg.constant;
    t.eval = [inner = std::move(arg.eval), f, single](EvalCtx& ctx) {
      Value v = inner(ctx);
      if (v.null) return v;
      auto r = f(std::get<Decimal>(v.d));
      if (!r) {
        if (!ctx.error) {
          ctx.error =
              Error::make("22003", std::string("value out of range for type ") +
                                       (single ? "real" : "double precision") + " in a row filter");
        }
        return null_value();
      }
      return value(*r);
    };
    if (t.constant) {  // an out-of-range constant would fail every row: refuse now
      EvalCtx ctx;
      t.eval(ctx);
      if (ctx.error) return unsupported(what + " of an out-of-range constant");
    }
    return t;
  }
  if (from == Ty::kFloat4 && to == Ty::kFloat8) return with(identity);
  if (is_string(from) && (to == Ty::kText || to == Ty::kVarchar)) {
    if (from == Ty::kBpchar) {  // rtrim1: char(n) loses its padding
      return with([](Value v) { return value(rtrim_spaces(std::get<std::string>(v.d))); });
    }
    return with(identity);
  }
  if ((from == Ty::kText || from == Ty::kVarchar) && to == Ty::kBpchar) return with(identity);
  if (is_string(from) && to == Ty::kName && arg.constant) {
    EvalCtx ctx;
    Value v = arg.eval(ctx);
    if (!v.null && from == Ty::kBpchar) v = value(rtrim_spaces(std::get<std::string>(v.d)));
    if (v.null || std::get<std::string>(v.d).size() <= 63) {
      Typed t = constant(to, std::move(v));
      return t;
    }
  }
  return unsupported(what);
}

Result<Typed> Compiler::cast(const Expr& e) {
  auto arg = compile(e.args[0]);
  if (!arg.ok()) return arg.error();
  if (arg->ty == Ty::kOther) return unsupported("a cast from " + shown_type(*arg));
  return cast_to(std::move(*arg), ty_of_name(e.text));
}

Result<Typed> Compiler::as_bool(Typed t) {
  if (t.ty == Ty::kBool) return t;
  if (t.ty == Ty::kNull || t.ty == Ty::kUnknown) return cast_to(std::move(t), Ty::kBool);
  return unsupported("a " + shown_type(t) + " value where a boolean is needed");
}

Result<Cls> Compiler::comparable(Typed& l, Typed& r, const std::string& op) {
  if (l.ty == Ty::kUnknown && r.ty == Ty::kUnknown) {
    auto a = cast_to(std::move(l), Ty::kText);
    if (!a.ok()) return a.error();
    l = std::move(*a);
    auto b = cast_to(std::move(r), Ty::kText);
    if (!b.ok()) return b.error();
    r = std::move(*b);
  }
  if (l.ty == Ty::kUnknown && r.ty != Ty::kNull && r.ty != Ty::kOther) {
    auto a = cast_to(std::move(l), r.ty);
    if (!a.ok()) return a.error();
    l = std::move(*a);
  }
  if (r.ty == Ty::kUnknown && l.ty != Ty::kNull && l.ty != Ty::kOther) {
    auto b = cast_to(std::move(r), l.ty);
    if (!b.ok()) return b.error();
    r = std::move(*b);
  }
  if (l.ty == Ty::kOther || r.ty == Ty::kOther) {
    return unsupported("comparison of " + shown_type(l) + " with " + shown_type(r));
  }
  if (l.ty == Ty::kNull || r.ty == Ty::kNull) {
    return Cls::kInt;  // never compared: one side is always NULL
  }
  const std::string what = "comparison of " + shown_type(l) + " with " + shown_type(r);
  if (is_int(l.ty) && is_int(r.ty)) return Cls::kInt;
  if (l.ty == Ty::kOid && r.ty == Ty::kOid) return Cls::kInt;
  if (l.ty == Ty::kNumeric && r.ty == Ty::kNumeric) return Cls::kNumeric;
  if (is_float(l.ty) && is_float(r.ty)) return Cls::kFloat;
  if (l.ty == Ty::kBool && r.ty == Ty::kBool) return Cls::kBool;
  const bool bpchar = l.ty == Ty::kBpchar && r.ty == Ty::kBpchar;
  const bool texty =
      l.ty != Ty::kBpchar && r.ty != Ty::kBpchar && is_string(l.ty) && is_string(r.ty);
  if (!bpchar && !texty) return unsupported(what);
  // The collation the operator runs with: explicit beats implicit, a non-default implicit
  // beats the default one (parse_collate.c's merge_collation_state).
  Coll c = l.coll;
  const Coll& o = r.coll;
  if (o.strength > c.strength) {
    c = o;
  } else if (o.strength == c.strength && o.name != c.name) {
    if (c.strength == Coll::kExplicit) return unsupported("conflicting COLLATE clauses");
    if (c.name == "default") {
      c = o;
    } else if (o.name != "default") {
      return unsupported("a comparison of values with different collations");
    }
  }
  const bool is_c = c.name == "C" || c.name == "POSIX" ||
                    (c.name == "default" && context_.database_collation_is_c);
  const bool deterministic = c.name == "default" || is_c || c.deterministic;
  if (op == "=" || op == "<>") {
    if (!deterministic) {
      return unsupported("equality under the nondeterministic collation \"" + c.name + "\"");
    }
  } else if (!is_c) {
    return unsupported("operator " + op + " on text under collation \"" + c.name +
                       (c.name == "default" ? "\" (the database's, not \"C\")" : "\"") +
                       "; only \"C\" and \"POSIX\" order text as pgrelay can");
  }
  return bpchar ? Cls::kBpchar : Cls::kText;
}

Result<Typed> Compiler::compare(const Expr& e) {
  auto l = compile(e.args[0]);
  if (!l.ok()) return l.error();
  auto r = compile(e.args[1]);
  if (!r.ok()) return r.error();
  auto cls = comparable(*l, *r, e.text);
  if (!cls.ok()) return cls.error();
  Typed t;
  t.ty = Ty::kBool;
  t.constant = l->constant && r->constant;
  t.eval = [le = std::move(l->eval), re = std::move(r->eval), c = *cls,
            op = e.text](EvalCtx& ctx) -> Value {
    Value a = le(ctx);
    Value b = re(ctx);
    if (a.null || b.null) return null_value();
    return value(op_holds(op, compare_values(c, a.d, b.d)));
  };
  return t;
}

Result<Typed> Compiler::quantified(const Expr& e) {
  auto scalar = compile(e.args[0]);
  if (!scalar.ok()) return scalar.error();
  std::vector<Eval> elements;
  std::vector<Cls> classes;
  Typed resolved = *scalar;
  for (std::size_t i = 1; i < e.args.size(); ++i) {
    auto el = compile(e.args[i]);
    if (!el.ok()) return el.error();
    Typed l = *scalar;
    auto cls = comparable(l, *el, e.text);
    if (!cls.ok()) return cls.error();
    if (scalar->ty == Ty::kUnknown) resolved = l;
    elements.push_back(std::move(el->eval));
    classes.push_back(*cls);
  }
  Typed t;
  t.ty = Ty::kBool;
  t.eval = [se = std::move(resolved.eval), elements = std::move(elements),
            classes = std::move(classes), op = e.text, all = e.all](EvalCtx& ctx) -> Value {
    // ExecEvalScalarArrayOp: an empty array gives false (ANY) or true (ALL) even for a NULL
    // scalar; otherwise a NULL scalar gives NULL.
    if (elements.empty()) return value(all);
    Value s = se(ctx);
    if (s.null) return null_value();
    bool saw_null = false;
    for (std::size_t i = 0; i < elements.size(); ++i) {
      Value v = elements[i](ctx);
      if (v.null) {
        saw_null = true;
        continue;
      }
      const bool holds = op_holds(op, compare_values(classes[i], s.d, v.d));
      if (!all && holds) return value(true);
      if (all && !holds) return value(false);
    }
    if (saw_null) return null_value();
    return value(all);
  };
  return t;
}

Result<Typed> Compiler::distinct(const Expr& e) {
  auto l = compile(e.args[0]);
  if (!l.ok()) return l.error();
  auto r = compile(e.args[1]);
  if (!r.ok()) return r.error();
  auto cls = comparable(*l, *r, "=");
  if (!cls.ok()) return cls.error();
  Typed t;
  t.ty = Ty::kBool;
  t.eval = [le = std::move(l->eval), re = std::move(r->eval), c = *cls,
            negate = e.negate](EvalCtx& ctx) -> Value {
    Value a = le(ctx);
    Value b = re(ctx);
    bool is_distinct;
    if (a.null || b.null) {
      is_distinct = a.null != b.null;
    } else {
      is_distinct = compare_values(c, a.d, b.d) != 0;
    }
    return value(negate ? !is_distinct : is_distinct);
  };
  return t;
}

Result<Typed> Compiler::boolean(const Expr& e) {
  std::vector<Eval> args;
  for (const Expr& a : e.args) {
    auto t = compile(a);
    if (!t.ok()) return t.error();
    auto b = as_bool(std::move(*t));
    if (!b.ok()) return b.error();
    args.push_back(std::move(b->eval));
  }
  Typed t;
  t.ty = Ty::kBool;
  if (e.kind == Expr::Kind::kNot) {
    t.eval = [a = std::move(args[0])](EvalCtx& ctx) -> Value {
      Value v = a(ctx);
      if (v.null) return v;
      return value(!std::get<bool>(v.d));
    };
    return t;
  }
  const bool is_and = e.kind == Expr::Kind::kAnd;
  // ExecEvalBoolAnd/Or: left to right, stopping at the first false (AND) or true (OR).
  t.eval = [args = std::move(args), is_and](EvalCtx& ctx) -> Value {
    bool saw_null = false;
    for (const Eval& a : args) {
      Value v = a(ctx);
      if (v.null) {
        saw_null = true;
        continue;
      }
      if (std::get<bool>(v.d) != is_and) return v;
    }
    if (saw_null) return null_value();
    return value(is_and);
  };
  return t;
}

Result<Typed> Compiler::compile(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kColumn:
      return column(e);
    case Expr::Kind::kInt:
      return constant(
          e.bits == 8 || e.ival < INT32_MIN || e.ival > INT32_MAX ? Ty::kInt8 : Ty::kInt4,
          value(e.ival));
    case Expr::Kind::kNumeric: {
      auto d = parse_decimal(e.text);
      if (!d) return unsupported("the numeric literal " + e.text);
      return constant(Ty::kNumeric, value(std::move(*d)));
    }
    case Expr::Kind::kString: {
      Typed t = constant(Ty::kUnknown, value(e.text));
      t.literal = e.text;
      t.coll = Coll{};
      return t;
    }
    case Expr::Kind::kBool:
      return constant(Ty::kBool, value(e.bval));
    case Expr::Kind::kNull: {
      Typed t = constant(Ty::kNull, null_value());
      return t;
    }
    case Expr::Kind::kCast:
      return cast(e);
    case Expr::Kind::kCollate: {
      auto arg = compile(e.args[0]);
      if (!arg.ok()) return arg.error();
      if (arg->ty == Ty::kUnknown) {
        auto text = cast_to(std::move(*arg), Ty::kText);
        if (!text.ok()) return text.error();
        arg = std::move(*text);
      }
      if (!is_string(arg->ty)) return unsupported("COLLATE on a non-text value");
      arg->coll = Coll{Coll::kExplicit, e.text, true};
      return arg;
    }
    case Expr::Kind::kCompare:
      return compare(e);
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr:
    case Expr::Kind::kNot:
      return boolean(e);
    case Expr::Kind::kNullTest: {
      auto arg = compile(e.args[0]);
      if (!arg.ok()) return arg.error();
      Typed t;
      t.ty = Ty::kBool;
      t.eval = [a = std::move(arg->eval), negate = e.negate](EvalCtx& ctx) -> Value {
        return value(a(ctx).null != negate);
      };
      return t;
    }
    case Expr::Kind::kBoolTest: {
      auto arg = compile(e.args[0]);
      if (!arg.ok()) return arg.error();
      auto b = as_bool(std::move(*arg));
      if (!b.ok()) return b.error();
      Typed t;
      t.ty = Ty::kBool;
      t.eval = [a = std::move(b->eval), test = e.test](EvalCtx& ctx) -> Value {
        Value v = a(ctx);
        const bool is_true = !v.null && std::get<bool>(v.d);
        const bool is_false = !v.null && !std::get<bool>(v.d);
        switch (test) {
          case PG_QUERY__BOOL_TEST_TYPE__IS_TRUE:
            return value(is_true);
          case PG_QUERY__BOOL_TEST_TYPE__IS_NOT_TRUE:
            return value(!is_true);
          case PG_QUERY__BOOL_TEST_TYPE__IS_FALSE:
            return value(is_false);
          case PG_QUERY__BOOL_TEST_TYPE__IS_NOT_FALSE:
            return value(!is_false);
          case PG_QUERY__BOOL_TEST_TYPE__IS_UNKNOWN:
            return value(v.null);
          default:
            return value(!v.null);
        }
      };
      return t;
    }
    case Expr::Kind::kQuantified:
      return quantified(e);
    case Expr::Kind::kDistinct:
      return distinct(e);
  }
  return unsupported("expression");
}

class CompiledRowFilter final : public log::RowFilter {
 public:
  CompiledRowFilter(Expr expr, std::string key, FilterContext context)
      : expr_(std::move(expr)), key_(std::move(key)), context_(std::move(context)) {}

  Result<log::TupleFilter> bind(const pgoutput::Relation& relation) const override {
    Compiler compiler(relation, context_);
    auto typed = compiler.compile_filter(expr_);
    if (!typed.ok()) return typed.error();
    auto eval = std::make_shared<Eval>(std::move(typed->eval));
    return log::TupleFilter([eval](const pgoutput::Tuple& tuple) -> Result<bool> {
      EvalCtx ctx;
      ctx.tuple = &tuple;
      Value v = (*eval)(ctx);
      if (ctx.error) return *ctx.error;
      return !v.null && std::get<bool>(v.d);
    });
  }

  std::string key() const override { return key_; }

 private:
  Expr expr_;
  std::string key_;
  FilterContext context_;
};

}  // namespace

Result<std::shared_ptr<const log::RowFilter>> make_row_filter(
    const std::vector<std::string>& expressions, FilterContext context) {
  if (expressions.empty()) {
    return Error::make(sqlstate::kInternalError, "make_row_filter needs an expression");
  }
  Expr combined;
  combined.kind = Expr::Kind::kOr;
  std::string key;
  for (const std::string& text : expressions) {
    auto e = parse_filter(text);
    if (!e.ok()) return e.error();
    combined.args.push_back(std::move(*e));
    key += std::to_string(text.size()) + ":" + text;
  }
  Expr root = combined.args.size() == 1 ? std::move(combined.args[0]) : std::move(combined);
  return std::shared_ptr<const log::RowFilter>(
      std::make_shared<CompiledRowFilter>(std::move(root), std::move(key), std::move(context)));
}

}  // namespace pgrelay::server
