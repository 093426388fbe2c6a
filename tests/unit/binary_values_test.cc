// Binary mode's pure part: which values of a batch of changes are converted, with which types.
#include <gtest/gtest.h>

#include "server/binary_values.h"

namespace pgrelay::server {
namespace {

using pgoutput::TupleValue;

pgoutput::Relation relation(pgoutput::Oid oid, std::vector<pgoutput::Oid> types) {
  pgoutput::Relation rel;
  rel.oid = oid;
  rel.name = "t" + std::to_string(oid);
  for (std::size_t i = 0; i < types.size(); ++i) {
    rel.columns.push_back({0, "c" + std::to_string(i), types[i], -1});
  }
  return rel;
}

TEST(BinaryValuesTest, CollectsTextValuesOfChangesWithTheirRelationsColumnTypes) {
  pgoutput::Insert insert;
  insert.relation_oid = 100;
  insert.new_tuple.columns = {TupleValue::text("1"), TupleValue::null(), TupleValue::text("x")};
  pgoutput::Update update;
  update.relation_oid = 100;
  update.old = pgoutput::OldTuple{pgoutput::OldKind::kFull,
                                  {{TupleValue::text("1"), TupleValue::unchanged()}}};
  update.new_tuple.columns = {TupleValue::text("2"), TupleValue::text("y"),
                              TupleValue::unchanged()};
  pgoutput::Delete del;
  del.relation_oid = 200;
  del.old.tuple.columns = {TupleValue::text("{1,2}")};
  std::vector<pgoutput::Message> messages = {
      pgoutput::Begin{}, relation(100, {23, 25, 1043}), insert, update, relation(200, {1007}), del,
      pgoutput::Commit{}};
  std::vector<pgoutput::Message*> batch;
  for (auto& m : messages) batch.push_back(&m);
  RelationTypes types;
  auto values = collect_text_values(batch, types);
  ASSERT_TRUE(values.ok()) << values.error().message;
  std::vector<std::pair<pgoutput::Oid, std::string>> got;
  for (const auto& v : *values) got.emplace_back(v.type, v.value->bytes);
  // NULL and unchanged TOAST values are left alone; old tuples come before new ones.
  const std::vector<std::pair<pgoutput::Oid, std::string>> want = {
      {23, "1"}, {1043, "x"}, {23, "1"}, {23, "2"}, {25, "y"}, {1007, "{1,2}"}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(types.at(100), (std::vector<pgoutput::Oid>{23, 25, 1043}));
  // The references point into the messages: converting them changes the changes.
  (*values)[1].value->kind = pgoutput::ValueKind::kBinary;
  EXPECT_EQ(std::get<pgoutput::Insert>(messages[2]).new_tuple.columns[2].kind,
            pgoutput::ValueKind::kBinary);
}

TEST(BinaryValuesTest, AChangeWithoutItsRelationOrWithTooManyColumnsIsAnError) {
  pgoutput::Insert insert;
  insert.relation_oid = 100;
  insert.new_tuple.columns = {TupleValue::text("1"), TupleValue::text("2")};
  std::vector<pgoutput::Message> messages = {insert};
  std::vector<pgoutput::Message*> batch = {&messages[0]};
  RelationTypes types;
  EXPECT_FALSE(collect_text_values(batch, types).ok());
  types[100] = {23};
  EXPECT_FALSE(collect_text_values(batch, types).ok());
  types[100] = {23, 23};
  EXPECT_TRUE(collect_text_values(batch, types).ok());
}

TEST(BinaryValuesTest, OneQueryParameterPerValueAndSettingsPinnedInTheStartupOptions) {
  EXPECT_EQ(conversion_query(1), "SELECT $1");
  EXPECT_EQ(conversion_query(3), "SELECT $1, $2, $3");
  const std::string conninfo = conversion_conninfo("host='h' dbname='d'");
  EXPECT_EQ(conninfo.rfind("host='h' dbname='d' ", 0), 0u) << conninfo;
  for (const char* setting : {"DateStyle=ISO,MDY", "IntervalStyle=postgres", "extra_float_digits=3",
                              "bytea_output=hex"}) {
    EXPECT_NE(conninfo.find(std::string("-c ") + setting), std::string::npos) << setting;
  }
}

}  // namespace
}  // namespace pgrelay::server
