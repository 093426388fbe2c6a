// Tests the publications' catalog: its JSON parsed, and the views made from it without the
// upstream, as a walsender makes them where a marker logged the catalog.
#include "pgoutput/publication_catalog.h"

#include <gtest/gtest.h>

#include "server/publications.h"

namespace pgrelay {
namespace {

// What publication_catalog_query answered on PostgreSQL 15 for: a (id pk, v), a publication pa
// FOR TABLE a (id) WHERE (id > 3), p partitioned with its partition p1 and pr FOR TABLE p WITH
// (publish_via_partition_root), ps FOR TABLES IN SCHEMA s holding s.t, and pall FOR ALL TABLES.
constexpr const char* kCatalog =
    R"j({"version" : 1, "publications" : [[16407, "pa", false, true, true, true, true, false],)j"
    R"j( [16409, "pr", false, true, true, true, true, true],)j"
    R"j( [16411, "ps", false, true, true, true, true, false],)j"
    R"j( [16413, "pall", true, true, true, true, true, false]],)j"
    R"j( "rels" : [[16407, 16384], [16409, 16391]], "schemas" : [[16411, 16403, "s"]],)j"
    R"j( "tables" : [[16407, 16384, "public", "a", 2, false, false, false, true, true, ["id"],)j"
    R"j( 1, "(id > 3)"], [16409, 16391, "public", "p", 2, true, false, false, true, false, null,)j"
    R"j( null, null], [16411, 16404, "s", "t", 1, false, false, true, false, false, null, null,)j"
    R"j( null]], "filter_columns" : [[16384, [["id", 23, "integer", "", true], ["v", 25, "text",)j"
    R"j( "default", true]]]], "tree" : [[16391, true, 2200, "public", "p", []], [16396, false,)j"
    R"j( 2200, "public", "p1", [16391]]], "partitioned" : [[16391, "public", "p", "d", [["id", 23,)j"
    R"j( -1, true], ["r", 25, -1, true]]]]})j";

TEST(PublicationCatalog, ParsesWhatTheQueryAnswered) {
  auto catalog = pgoutput::parse_publication_catalog(kCatalog);
  ASSERT_TRUE(catalog.ok()) << catalog.error().message;
  ASSERT_EQ(catalog->publications.size(), 4u);
  EXPECT_EQ(catalog->publications[0].name, "pa");
  EXPECT_TRUE(catalog->publications[1].via_root);
  EXPECT_TRUE(catalog->publications[3].all_tables);
  EXPECT_EQ(catalog->schema_names.at(16403), "s");
  ASSERT_EQ(catalog->tables.size(), 3u);
  const pgoutput::CatalogTable& a = catalog->tables[0];
  EXPECT_EQ(a.columns, std::optional<std::vector<std::string>>(std::vector<std::string>{"id"}));
  EXPECT_EQ(a.qual, std::optional<std::string>("(id > 3)"));
  EXPECT_TRUE(catalog->tables[1].partitioned);
  EXPECT_TRUE(catalog->tables[2].via_schema);
  EXPECT_EQ(catalog->filter_columns.at(16384).at(1).collation, "default");
  ASSERT_EQ(catalog->tree.size(), 2u);
  EXPECT_EQ(catalog->tree[1].ancestors, std::vector<pgoutput::Oid>{16391});
  const pgoutput::Relation& p = catalog->partitioned.at(16391);
  EXPECT_EQ(p.name, "p");
  EXPECT_EQ(p.columns.size(), 2u);
  EXPECT_TRUE(p.columns[1].is_key());
}

TEST(PublicationCatalog, TextItDidNotWriteIsCorruption) {
  for (const char* bad : {"", "{", "[]", R"({"version": 2})", R"({"version": 1})",
                          R"({"version": 1, "publications": [[1.5, "p"]], "rels": null})",
                          R"({"version": 1, "publications": [[4294967296, "p", false, true, true,)"
                          R"( true, true, false]]})"}) {
    auto catalog = pgoutput::parse_publication_catalog(bad);
    ASSERT_FALSE(catalog.ok()) << bad;
    EXPECT_EQ(catalog.error().sqlstate, sqlstate::kDataCorrupted) << bad;
  }
}

TEST(PublicationCatalog, AViewIsMadeFromTheCatalogAlone) {
  auto pa = server::publication_view_at(kCatalog, {"pa"}, false);
  ASSERT_TRUE(pa.ok()) << pa.error().message;
  ASSERT_TRUE(pa->publications.has_value());
  const log::TableRule& a = pa->publications->tables.at(16384);
  EXPECT_EQ(a.columns, std::optional<std::vector<std::string>>(std::vector<std::string>{"id"}));
  EXPECT_NE(a.filters[log::kFilterInsert], nullptr);
  EXPECT_EQ(pa->publications->names.at({"public", "a"}), 16384u);
  EXPECT_EQ(pa->publications->all_tables, 0);

  // FOR ALL TABLES beside a column list: no filter, and the lists differ (Postgres's error at
  // the table's first change).
  auto both = server::publication_view_at(kCatalog, {"pall", "pa"}, false);
  ASSERT_TRUE(both.ok()) << both.error().message;
  const log::TableRule& a2 = both->publications->tables.at(16384);
  EXPECT_EQ(a2.filters[log::kFilterInsert], nullptr);
  ASSERT_TRUE(a2.error.has_value());
  EXPECT_EQ(a2.error->sqlstate, sqlstate::kFeatureNotSupported);
  EXPECT_EQ(both->publications->all_tables,
            log::kOpInsert | log::kOpUpdate | log::kOpDelete | log::kOpTruncate);

  // Via the root: the partition's changes go out as the root's.
  auto pr = server::publication_view_at(kCatalog, {"pr"}, false);
  ASSERT_TRUE(pr.ok()) << pr.error().message;
  const log::TableRule& p1 = pr->publications->tables.at(16396);
  ASSERT_NE(p1.publish_as, nullptr);
  EXPECT_EQ(p1.publish_as->relation.oid, 16391u);
  EXPECT_EQ(p1.publish_as->leaves, 1u);

  auto ps = server::publication_view_at(kCatalog, {"ps"}, true);
  ASSERT_TRUE(ps.ok()) << ps.error().message;
  EXPECT_NE(ps->publications->schemas.count("s"), 0u);
  EXPECT_NE(ps->operations & log::kOpMessage, 0);

  auto missing = server::publication_view_at(kCatalog, {"pa", "nope"}, false);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().sqlstate, sqlstate::kUndefinedObject);
  EXPECT_EQ(missing.error().message, "publication \"nope\" does not exist");
}

}  // namespace
}  // namespace pgrelay
