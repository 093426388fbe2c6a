// Row filter evaluation (parse + typed evaluation over text values) and the publication view's
// column lists and row-filter transforms, without a server.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "log/change_view.h"
#include "log/transaction.h"
#include "server/row_filter.h"

namespace pgrelay::server {
namespace {

using pgoutput::Column;
using pgoutput::Relation;
using pgoutput::Tuple;
using pgoutput::TupleValue;

// id int4, i2 int2, big int8, n numeric, f4 real, f8 float8, flag bool, t text, v varchar,
// c bpchar, nm name, tc text COLLATE "C", ts timestamptz, o oid
Relation table() {
  Relation r;
  r.oid = 16400;
  r.namespace_name = "public";
  r.name = "t";
  r.columns = {Column{1, "id", 23, -1},   Column{0, "i2", 21, -1},  Column{0, "big", 20, -1},
               Column{0, "n", 1700, -1},  Column{0, "f4", 700, -1}, Column{0, "f8", 701, -1},
               Column{0, "flag", 16, -1}, Column{0, "t", 25, -1},   Column{0, "v", 1043, -1},
               Column{0, "c", 1042, -1},  Column{0, "nm", 19, -1},  Column{0, "tc", 25, -1},
               Column{0, "ts", 1184, -1}, Column{0, "o", 26, -1}};
  return r;
}

FilterContext context(bool database_c = false) {
  FilterContext c;
  c.database_collation_is_c = database_c;
  for (const auto& col : table().columns) c.columns[col.name] = FilterColumn{};
  c.columns["nm"].collation = "C";
  c.columns["tc"].collation = "C";
  c.columns["ts"].collation = "";
  c.columns["ts"].type_name = "timestamp with time zone";
  return c;
}

using Values = std::vector<std::optional<std::string>>;  // by column, nullopt = NULL

Tuple tuple(const Values& values) {
  Tuple t;
  for (std::size_t i = 0; i < table().columns.size(); ++i) {
    if (i < values.size() && values[i]) {
      t.columns.push_back(TupleValue::text(*values[i]));
    } else {
      t.columns.push_back(TupleValue::null());
    }
  }
  return t;
}

// A row with every column set.
Values full_row() {
  return {"5",     "-3", "9223372036854775807",    "1.50", "1.5", "0.1", "t", "abc", "vv", "ab   ",
          "name1", "m",  "2024-01-01 00:00:00+00", "7"};
}

Result<bool> eval(const std::string& expr, const Values& values, bool database_c = false) {
  auto filter = make_row_filter({expr}, context(database_c));
  if (!filter.ok()) return filter.error();
  auto bound = (*filter)->bind(table());
  if (!bound.ok()) return bound.error();
  return (*bound)(tuple(values));
}

struct Case {
  const char* expr;
  bool expected;
};

TEST(RowFilterTest, EvaluatesTheSupportedSubsetAsPostgresDoes) {
  const Values row = full_row();
  // Deparsed forms (pg_get_expr output for the filters users write) and raw ones.
  const Case cases[] = {
      {"(id > 5)", false},
      {"(id >= 5)", true},
      {"(id = 5)", true},
      {"(id <> 5)", false},
      {"id != 4", true},
      {"(i2 < 3)", true},
      {"(big = '9223372036854775807'::bigint)", true},
      {"(big > '-5'::integer)", true},
      {"(big > 9223372036854775806)", true},
      {"(o = (7)::oid)", true},
      {"(n > 1.5)", false},
      {"(n = 1.5)", true},  // numeric equality ignores scale: 1.50 = 1.5
      {"(n = (1.500)::numeric)", true},
      {"(n < '-2.25'::numeric)", false},
      {"((id)::numeric > '4.99'::numeric)", true},
      {"((id)::numeric = 5.0)", true},
      {"(f4 > (1.5)::double precision)", false},
      {"(f4 = (1.5)::double precision)", true},
      {"(f8 = (0.1)::double precision)", true},
      {"(f8 > ('-1.5'::numeric)::double precision)", true},
      {"((big)::double precision > (1e18)::double precision)", true},
      {"(f4 = f8)", false},  // real 1.5 vs double 0.1
      {"flag", true},
      {"(NOT flag)", false},
      {"(flag = true)", true},
      {"(flag IS TRUE)", true},
      {"(flag IS NOT FALSE)", true},
      {"(flag IS UNKNOWN)", false},
      {"(t = 'abc'::text)", true},
      {"((v)::text = 'vv'::text)", true},
      {"(c = 'ab'::bpchar)", true},  // char(n) padding is not significant
      {"(c = 'ab  '::bpchar)", true},
      {"((c)::text = 'ab'::text)", true},
      {"(nm = 'name1'::name)", true},
      {"(nm < 'name2'::name)", true},
      {"(tc < 'n'::text)", true},
      {"(t < ('b'::text COLLATE \"C\"))", true},
      {"(id = ANY (ARRAY[1, 2, 5]))", true},
      {"(id <> ALL (ARRAY[4, 5]))", false},
      {"id IN (1, 2, 3)", false},
      {"id NOT IN (1, 2, 3)", true},
      {"(t = ANY (ARRAY['a'::text, 'abc'::text]))", true},
      {"((id >= 1) AND (id <= 5))", true},
      {"id BETWEEN 6 AND 9", false},
      {"id NOT BETWEEN 6 AND 9", true},
      {"(ts IS NOT NULL)", true},
      {"(t IS NULL)", false},
      {"(id IS DISTINCT FROM 3)", true},
      {"(id IS NOT DISTINCT FROM 5)", true},
      {"true", true},
      {"NULL::boolean", false},
      {"(id > NULL::integer)", false},
      {"((id > 1) IS UNKNOWN)", false},
      {"(id = 5) OR (id > NULL::integer)", true},
      {"(id = 5) AND (id > NULL::integer)", false},
      {"(f8 = 'NaN'::double precision)", false},
      {"(id = 5)", true},
      {"(id = '5')", true},
      {"id = - 5", false},
  };
  for (const Case& c : cases) {
    auto r = eval(c.expr, row);
    ASSERT_TRUE(r.ok()) << c.expr << ": " << r.error().message;
    EXPECT_EQ(*r, c.expected) << c.expr;
  }
}

TEST(RowFilterTest, ThreeValuedLogic) {
  // flag NULL: AND/OR/NOT follow SQL's truth tables; a NULL result does not match.
  Values row = full_row();
  row[6] = std::nullopt;
  const Case cases[] = {
      {"flag", false},
      {"(NOT flag)", false},
      {"(flag AND false)", false},
      {"(NOT (flag AND false))", true},  // NULL AND false = false
      {"(NOT (flag AND true))", false},  // NULL AND true = NULL
      {"(flag OR true)", true},
      {"(NOT (flag OR false))", false},  // NULL OR false = NULL
      {"(flag IS UNKNOWN)", true},
      {"(flag IS NOT TRUE)", true},
      {"(flag IS NOT FALSE)", true},
      {"(flag IS TRUE)", false},
      {"(flag IS NULL)", true},
      {"(id = ANY (ARRAY[1, NULL::integer]))", false},  // no match and a NULL: NULL
      {"(NOT (id = ANY (ARRAY[1, NULL::integer])))", false},
      {"(id = ANY (ARRAY[5, NULL::integer]))", true},
      {"(NOT (id <> ALL (ARRAY[1, NULL::integer])))", false},
      {"(flag IS DISTINCT FROM NULL::boolean)", false},
      {"(flag IS DISTINCT FROM true)", true},
  };
  for (const Case& c : cases) {
    auto r = eval(c.expr, row);
    ASSERT_TRUE(r.ok()) << c.expr << ": " << r.error().message;
    EXPECT_EQ(*r, c.expected) << c.expr;
  }
}

TEST(RowFilterTest, TypeEdgeCases) {
  struct Edge {
    const char* expr;
    int column;
    const char* value;
    bool expected;
  };
  const Edge cases[] = {
      {"(big = '-9223372036854775808'::bigint)", 2, "-9223372036854775808", true},
      {"(big < '-9223372036854775807'::bigint)", 2, "-9223372036854775808", true},
      {"(big > 9223372036854775806)", 2, "9223372036854775807", true},
      {"((big)::numeric > 9223372036854775807.5)", 2, "9223372036854775807", false},
      {"((big)::numeric < 9223372036854775807.5)", 2, "9223372036854775807", true},
      // int8 -> float8 rounds as Postgres's (float8) cast does: 2^63-1 becomes 2^63.
      {"((big)::double precision = '9.223372036854775808e18'::double precision)", 2,
       "9223372036854775807", true},
      {"(n = 1.0)", 3, "1", true},
      {"(n = (1)::numeric)", 3, "1.000", true},
      {"(n > 0.99999999999999999999)", 3, "1", true},
      {"(n < 1.00000000000000000001)", 3, "1", true},
      {"(n = 0.1)", 3, "0.10", true},
      {"(n < (0)::numeric)", 3, "-0.000100", true},
      {"(n > '-0.0002'::numeric)", 3, "-0.000100", true},
      {"(n = (0)::numeric)", 3, "-0.00", true},
      {"(n > '1e20'::numeric)", 3, "100000000000000000001", true},
      {"(n > 'Infinity'::numeric)", 3, "NaN", true},  // NaN sorts above everything
      {"(n = 'NaN'::numeric)", 3, "NaN", true},
      {"(n < '-1e100'::numeric)", 3, "-Infinity", true},
      {"(n > 1e100)", 3, "Infinity", true},
      {"(f8 > 'Infinity'::double precision)", 5, "NaN", true},
      {"(f8 = 'NaN'::double precision)", 5, "NaN", true},
      {"(f8 = (0)::double precision)", 5, "-0", true},
      {"(f8 < '-1e308'::double precision)", 5, "-Infinity", true},
      {"(f8 = (0.30000000000000004)::double precision)", 5, "0.30000000000000004", true},
      {"(f8 > (0.3)::double precision)", 5, "0.30000000000000004", true},
      {"(f4 = (0.1)::double precision)", 4, "0.1", false},  // real 0.1 widened is not 0.1
      {"(f4 = (0.1)::real)", 4, "0.1", true},
      {"(f4 > (id)::double precision)", 4, "5.5", true},
      {"(i2 = '-32768'::integer)", 1, "-32768", true},
      {"(t = ''::text)", 7, "", true},
      {"(t < 'a'::text COLLATE \"C\")", 7, "B", true},  // byte order: upper case first
      {"(t > 'a'::text COLLATE \"POSIX\")", 7, "\xc3\xa9", true},
      {"(c = ''::bpchar)", 9, "     ", true},
  };
  for (const Edge& c : cases) {
    Values row = full_row();
    row[c.column] = c.value;
    auto r = eval(c.expr, row);
    ASSERT_TRUE(r.ok()) << c.expr << ": " << r.error().message;
    EXPECT_EQ(*r, c.expected) << c.expr << " with " << c.value;
  }
}

TEST(RowFilterTest, DatabaseCollationDecidesTextOrdering) {
  EXPECT_TRUE(*eval("(t > 'abb'::text)", full_row(), /*database_c=*/true));
  auto refused = eval("(t > 'abb'::text)", full_row(), /*database_c=*/false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().sqlstate, "0A000");
  EXPECT_NE(refused.error().message.find("collation"), std::string::npos);
  // Equality needs no particular collation; a column declared COLLATE "C" orders by bytes.
  EXPECT_TRUE(*eval("(t = 'abc'::text)", full_row(), false));
  EXPECT_TRUE(*eval("(tc < 'n'::text)", full_row(), false));
  // A non-default implicit collation wins over the default one, as in parse_collate.c.
  EXPECT_TRUE(*eval("(t < tc)", full_row(), false));
}

TEST(RowFilterTest, RefusesWhatItCannotEvaluateExactly) {
  const char* refused[] = {
      "(t ~~ 'a%'::text)",                // LIKE
      "upper(t) = 'X'::text",             // function call
      "(id = (2 + 3))",                   // arithmetic
      "(id = (- id))",                    // unary minus on a column
      "(id = ANY ('{1,2}'::integer[]))",  // array literal
      "(ts > now())",
      "(ts > '2024-01-01'::timestamp with time zone)",  // type not supported
      "(n = (1.5)::numeric(10,2))",                     // type modifier
      "((f8)::real > (1)::real)",                       // float8 -> real
      "((big)::integer = 5)",                           // narrowing a column
      "(f4 > n)",                                       // real vs numeric without cast
      "(id > (1.5)::numeric)",                          // int vs numeric without cast
      "(t > 'a'::text COLLATE \"en_US\")",
      "(c = t)",   // bpchar vs text without cast
      "(t = id)",  // text vs integer
      "id BETWEEN SYMMETRIC 1 AND 5",
      "(SELECT true)",
      "CASE WHEN flag THEN true END",
      "t.id = 5",
      "id",  // not boolean
  };
  for (const char* expr : refused) {
    auto r = eval(expr, full_row(), true);
    ASSERT_FALSE(r.ok()) << expr << " was accepted";
    EXPECT_EQ(r.error().sqlstate, "0A000") << expr << ": " << r.error().message;
  }
  auto bad = make_row_filter({"(id = "}, context());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().sqlstate, "42601");
  auto two = make_row_filter({"true; DROP TABLE t"}, context());
  ASSERT_FALSE(two.ok());
  // A column the Relation no longer has: 55000 at bind time.
  auto filter = make_row_filter({"(gone = 1)"}, context());
  ASSERT_TRUE(filter.ok());
  auto bound = (*filter)->bind(table());
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.error().sqlstate, "55000");
}

TEST(RowFilterTest, OrCombinesFiltersAndUnchangedToastIsAnError) {
  auto filter = make_row_filter({"(id = 1)", "(id = 5)"}, context());
  ASSERT_TRUE(filter.ok());
  auto bound = (*filter)->bind(table());
  ASSERT_TRUE(bound.ok());
  EXPECT_TRUE(*(*bound)(tuple(full_row())));
  Values other = full_row();
  other[0] = "2";
  EXPECT_FALSE(*(*bound)(tuple(other)));

  auto on_text = make_row_filter({"(t = 'abc'::text)"}, context());
  auto text_bound = (*on_text)->bind(table());
  Tuple toasted = tuple(full_row());
  toasted.columns[7] = TupleValue::unchanged();
  auto r = (*text_bound)(toasted);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, "0A000");
  // Short-circuit as the executor does: the unchanged value is never looked at.
  auto guarded = make_row_filter({"((id = 1) AND (t = 'abc'::text))"}, context());
  auto guarded_bound = (*guarded)->bind(table());
  auto g = (*guarded_bound)(toasted);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(*g);
}

// --- the view: column lists and row-filter transforms ---

Relation items() {
  Relation r;
  r.oid = 100;
  r.namespace_name = "public";
  r.name = "items";
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1}, Column{0, "qty", 23, -1},
               Column{0, "note", 25, -1}, Column{0, "mood", 16500, -1}};
  return r;
}

TupleValue tv(const char* s) {
  return TupleValue::text(s);
}

log::ViewOptions view_with(log::TableRule rule) {
  log::ViewOptions options;
  log::PublicationTables pubs;
  pubs.tables[100] = std::move(rule);
  pubs.names[{"public", "items"}] = 100;
  options.publications = std::move(pubs);
  return options;
}

std::vector<log::Change> run(const log::ViewOptions& options, std::vector<log::ChangeMessage> in) {
  log::Transaction txn;
  txn.header.begin_lsn = wire::Lsn(0x100);
  txn.header.commit_lsn = wire::Lsn(0x200);
  txn.header.end_lsn = wire::Lsn(0x208);
  std::uint64_t lsn = 0x101;
  for (auto& m : in) txn.changes.push_back({wire::Lsn(lsn++), std::move(m)});
  auto out = log::apply_view(options, txn);
  EXPECT_TRUE(out.ok()) << out.error().message;
  if (!out.ok() || !*out) return {};
  return (*out)->changes;
}

TEST(PublicationViewTest, ColumnListProjectsRelationTypesAndEveryTuple) {
  log::TableRule rule;
  rule.operations = log::kAllOperations;
  rule.columns = std::vector<std::string>{"id", "note"};
  pgoutput::Type mood{std::nullopt, 16500, "public", "mood"};
  auto out =
      run(view_with(rule),
          {mood, items(),
           pgoutput::Insert{std::nullopt, 100, Tuple{{tv("1"), tv("2"), tv("x"), tv("ok")}}},
           pgoutput::Update{std::nullopt, 100,
                            pgoutput::OldTuple{pgoutput::OldKind::kKey,
                                               Tuple{{tv("1"), TupleValue::null(),
                                                      TupleValue::null(), TupleValue::null()}}},
                            Tuple{{tv("2"), tv("3"), TupleValue::unchanged(), tv("ok")}}},
           pgoutput::Delete{std::nullopt, 100,
                            pgoutput::OldTuple{pgoutput::OldKind::kKey,
                                               Tuple{{tv("2"), TupleValue::null(),
                                                      TupleValue::null(), TupleValue::null()}}}}});
  ASSERT_EQ(out.size(), 4u);  // the Type of a column left out is not sent
  auto& rel = std::get<Relation>(out[0].message);
  ASSERT_EQ(rel.columns.size(), 2u);
  EXPECT_EQ(rel.columns[0].name, "id");
  EXPECT_TRUE(rel.columns[0].is_key());
  EXPECT_EQ(rel.columns[1].name, "note");
  EXPECT_EQ(std::get<pgoutput::Insert>(out[1].message).new_tuple, (Tuple{{tv("1"), tv("x")}}));
  auto& up = std::get<pgoutput::Update>(out[2].message);
  EXPECT_EQ(up.old->tuple, (Tuple{{tv("1"), TupleValue::null()}}));
  EXPECT_EQ(up.new_tuple, (Tuple{{tv("2"), TupleValue::unchanged()}}));
  EXPECT_EQ(std::get<pgoutput::Delete>(out[3].message).old.tuple,
            (Tuple{{tv("2"), TupleValue::null()}}));

  // A schema change mid-transaction: the new Relation is projected by name, and later tuples
  // with it.
  Relation altered = items();
  altered.columns.insert(altered.columns.begin() + 1, Column{0, "added", 25, -1});
  auto out2 = run(
      view_with(rule),
      {items(), pgoutput::Insert{std::nullopt, 100, Tuple{{tv("1"), tv("2"), tv("x"), tv("ok")}}},
       altered,
       pgoutput::Insert{std::nullopt, 100,
                        Tuple{{tv("3"), tv("new"), tv("4"), tv("y"), tv("ok")}}}});
  ASSERT_EQ(out2.size(), 4u);
  EXPECT_EQ(std::get<Relation>(out2[2].message).columns.size(), 2u);
  EXPECT_EQ(std::get<pgoutput::Insert>(out2[3].message).new_tuple, (Tuple{{tv("3"), tv("y")}}));
}

TEST(PublicationViewTest, UpdatesMoveInAndOutOfTheFilter) {
  FilterContext ctx;
  auto filter = make_row_filter({"(qty > 10)"}, ctx);
  ASSERT_TRUE(filter.ok());
  log::TableRule rule;
  rule.operations = log::kOpInsert | log::kOpUpdate | log::kOpDelete;
  for (auto& f : rule.filters) f = *filter;
  rule.columns = std::vector<std::string>{"id", "note"};
  auto full = [](const char* id, const char* qty, const char* note) {
    return Tuple{{tv(id), tv(qty), note ? tv(note) : TupleValue::unchanged(), tv("ok")}};
  };
  auto update = [&](Tuple old_row, Tuple new_row) {
    return pgoutput::Update{std::nullopt, 100,
                            pgoutput::OldTuple{pgoutput::OldKind::kFull, std::move(old_row)},
                            std::move(new_row)};
  };
  auto out =
      run(view_with(rule),
          {items(), pgoutput::Insert{std::nullopt, 100, full("1", "5", "a")},  // dropped
           pgoutput::Insert{std::nullopt, 100, full("2", "50", "b")},          // sent
           update(full("1", "5", "a"), full("1", "6", "a")),                   // neither: dropped
           update(full("1", "6", "big"), full("1", "60", nullptr)),            // in: INSERT
           update(full("1", "60", "a"), full("1", "61", "a")),                 // both: UPDATE
           update(full("1", "61", "a"), full("1", "1", "a")),                  // out: DELETE
           pgoutput::Update{std::nullopt, 100, std::nullopt, full("2", "51", "b")},
           pgoutput::Delete{std::nullopt, 100,
                            pgoutput::OldTuple{pgoutput::OldKind::kFull, full("2", "9", "b")}}});
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(std::get<pgoutput::Insert>(out[1].message).new_tuple, (Tuple{{tv("2"), tv("b")}}));
  // The unchanged TOAST value is taken from the old row for the INSERT (tmp_new_slot).
  EXPECT_EQ(std::get<pgoutput::Insert>(out[2].message).new_tuple, (Tuple{{tv("1"), tv("big")}}));
  auto& kept = std::get<pgoutput::Update>(out[3].message);
  EXPECT_EQ(kept.old->kind, pgoutput::OldKind::kFull);
  EXPECT_EQ(kept.new_tuple, (Tuple{{tv("1"), tv("a")}}));
  auto& out_of = std::get<pgoutput::Delete>(out[4].message);
  EXPECT_EQ(out_of.old.kind, pgoutput::OldKind::kFull);
  EXPECT_EQ(out_of.old.tuple, (Tuple{{tv("1"), tv("a")}}));
  EXPECT_TRUE(std::holds_alternative<pgoutput::Update>(out[5].message));  // no old: new decides
}

TEST(PublicationViewTest, PerTableActionsAndDeferredColumnListConflict) {
  log::TableRule rule;
  rule.operations = log::kOpInsert;
  auto ins = pgoutput::Insert{std::nullopt, 100, Tuple{{tv("1"), tv("2"), tv("x"), tv("ok")}}};
  auto del = pgoutput::Delete{
      std::nullopt, 100,
      pgoutput::OldTuple{pgoutput::OldKind::kKey, Tuple{{tv("1"), TupleValue::null(),
                                                         TupleValue::null(), TupleValue::null()}}}};
  auto out = run(view_with(rule), {items(), del, ins});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<pgoutput::Insert>(out[1].message));

  rule.error = Error::make("0A000",
                           "cannot use different column lists for table \"public.items\" "
                           "in different publications");
  log::Transaction txn;
  txn.header.begin_lsn = wire::Lsn(0x100);
  txn.header.commit_lsn = wire::Lsn(0x200);
  txn.header.end_lsn = wire::Lsn(0x208);
  txn.changes = {{wire::Lsn(0x101), items()}, {wire::Lsn(0x102), del}};
  auto failed = log::apply_view(view_with(rule), txn);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().sqlstate, "0A000");

  // A table not in the map: the FOR ALL TABLES / IN SCHEMA actions, no list, no filter.
  log::ViewOptions options;
  options.publications.emplace();
  options.publications->schemas["public"] = log::kOpDelete;
  auto later = run(options, {items(), ins, del});
  ASSERT_EQ(later.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<pgoutput::Delete>(later[1].message));
  options.publications->schemas.clear();
  EXPECT_TRUE(run(options, {items(), ins, del}).empty());
}

}  // namespace
}  // namespace pgrelay::server
