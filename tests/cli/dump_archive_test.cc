// What pgrelay dump leaves out and restore skips: table-of-contents lines, event triggers,
// publication names (cli/dump_archive.h). The real pg_dump and pg_restore are in e2e_dump.
#include "cli/dump_archive.h"

#include <gtest/gtest.h>

namespace pgrelay::cli::dump {
namespace {

// As pg_restore 15 --list prints an archive of a database pgrelay and zero-cache ran on.
constexpr std::string_view kListing = R"(;
; Archive created at 2026-12-05 02:30:00 UTC
;     dbname: app
;
; Selected TOC Entries:
;
5; 2615 16386 SCHEMA - app_data postgres
220; 1255 16500 FUNCTION public audit_ddl() postgres
221; 1255 16501 FUNCTION app_data odd name(integer, text) postgres
215; 1259 16387 TABLE public items postgres
216; 1259 16390 TABLE app_data my table postgres
3360; 0 16387 TABLE DATA public items postgres
3361; 2613 16600 BLOB - 16600 postgres
3362; 0 0 BLOBS - BLOBS 
3203; 2606 16430 CONSTRAINT public items items_pkey postgres
3316; 2620 16493 TRIGGER public items _pgrelay_capture_delete postgres
3317; 2620 16494 TRIGGER app_data my table keep_me postgres
3318; 2620 16495 TRIGGER app_data my table unread postgres
3400; 6104 16700 PUBLICATION - _zero_public_0 postgres
3401; 6104 16701 PUBLICATION - _zero_metadata_0 postgres
3402; 6104 16702 PUBLICATION - app_pub postgres
3403; 6104 16703 PUBLICATION - _pgrelay_capture postgres
3404; 6237 16704 PUBLICATION TABLES IN SCHEMA public _zero_public_0 public postgres
3405; 6106 16705 PUBLICATION TABLE public app_pub items postgres
3406; 6106 16706 PUBLICATION TABLE public _pgrelay_capture items postgres
3500; 3466 16800 EVENT TRIGGER - _pgrelay_ddl postgres
3501; 3466 16801 EVENT TRIGGER - zt_ddl_start_0 postgres
3502; 3466 16802 EVENT TRIGGER - audit postgres
)";

constexpr std::string_view kTriggerSql = R"(--
-- PostgreSQL database dump
--
CREATE TRIGGER _pgrelay_capture_delete AFTER DELETE ON public.items REFERENCING OLD TABLE AS pgrelay_old FOR EACH STATEMENT EXECUTE FUNCTION _pgrelay.capture_16385();
CREATE TRIGGER keep_me BEFORE UPDATE OF v ON app_data."my table" FOR EACH ROW EXECUTE FUNCTION app_data."odd name"(1, 'x');
CREATE EVENT TRIGGER _pgrelay_ddl ON ddl_command_end
   EXECUTE FUNCTION _pgrelay.on_ddl();

CREATE EVENT TRIGGER zt_ddl_start_0 ON ddl_command_start
         WHEN TAG IN ('ALTER TABLE', 'CREATE TABLE')
   EXECUTE FUNCTION zt_0.emit_ddl_start();

CREATE EVENT TRIGGER audit ON ddl_command_end
   EXECUTE FUNCTION public.audit_ddl();
)";

TEST(DumpArchive, ParsesTheLinesItReadsAndLeavesTheRest) {
  auto table = parse_toc_line("216; 1259 16390 TABLE app_data my table postgres");
  ASSERT_TRUE(table.has_value());
  EXPECT_EQ(table->desc, "TABLE");
  EXPECT_EQ(table->schema, "app_data");
  EXPECT_EQ(table->tag, "my table");  // a name with a space: the owner is the last word

  auto data = parse_toc_line("3360; 0 16387 TABLE DATA public items postgres");
  ASSERT_TRUE(data.has_value());
  EXPECT_EQ(data->desc, "TABLE DATA");

  auto in_schema = parse_toc_line(
      "3472; 6237 16398 PUBLICATION TABLES IN SCHEMA public _zero_public_0 public postgres");
  ASSERT_TRUE(in_schema.has_value());
  EXPECT_EQ(in_schema->desc, "PUBLICATION TABLES IN SCHEMA");
  EXPECT_EQ(in_schema->schema, "public");
  EXPECT_EQ(in_schema->tag, "_zero_public_0 public");

  auto trigger = parse_toc_line("3317; 2620 16494 TRIGGER app_data my table keep_me postgres");
  ASSERT_TRUE(trigger.has_value());
  EXPECT_EQ(trigger->desc, "TRIGGER");
  EXPECT_EQ(trigger->tag, "my table keep_me");

  for (std::string_view other :
       {";", "; Selected TOC Entries:", "", "3203; 2606 16430 CONSTRAINT public items items_pkey x",
        "3362; 0 0 BLOBS - BLOBS ", "x; 1 2 TABLE public t o", "12 1 2 TABLE public t o",
        "12; 1 TABLE public t o", "12; 1 2 TABLE", "12; 1 2 TABLE "}) {
    EXPECT_FALSE(parse_toc_line(other).has_value()) << other;
  }
}

TEST(DumpArchive, KnowsPgrelaysAndZeroCachesPublicationsByName) {
  const std::vector<std::string> pgrelay = {"_pgrelay", "my_capture"};
  for (std::string_view name :
       {"_pgrelay_capture", "_pgrelay_capture_keyless", "my_capture_capture", "_zero_public_0",
        "_zero_metadata_0", "_zt_public_12", "_my_app_metadata_3"}) {
    EXPECT_TRUE(is_internal_publication(name, pgrelay)) << name;
  }
  for (std::string_view name :
       {"app_pub", "zero_public_0", "_zero_public_", "_zero_public_x", "_public_0", "_metadata_0",
        "_pgrelay_capture2", "pgrelay_capture", "_zero_other_0", ""}) {
    EXPECT_FALSE(is_internal_publication(name, pgrelay)) << name;
  }
}

TEST(DumpArchive, ReadsTheFunctionEachTriggerCalls) {
  auto calls = parse_trigger_calls(kTriggerSql);
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls[0].trigger, "_pgrelay_capture_delete");
  EXPECT_EQ(calls[0].table_schema, "public");
  EXPECT_EQ(calls[0].table, "items");
  EXPECT_EQ(calls[0].schema, "_pgrelay");
  EXPECT_EQ(calls[0].function, "capture_16385");
  EXPECT_EQ(calls[1].table_schema, "app_data");
  EXPECT_EQ(calls[1].table, "my table");
  EXPECT_EQ(calls[1].schema, "app_data");
  EXPECT_EQ(calls[1].function, "odd name");
  EXPECT_EQ(calls[2].trigger, "_pgrelay_ddl");
  EXPECT_TRUE(calls[2].table.empty());
  EXPECT_EQ(calls[2].schema, "_pgrelay");
  EXPECT_EQ(calls[2].function, "on_ddl");
  EXPECT_EQ(calls[3].trigger, "zt_ddl_start_0");
  EXPECT_EQ(calls[3].schema, "zt_0");
  EXPECT_EQ(calls[3].function, "emit_ddl_start");
  EXPECT_EQ(calls[4].schema, "public");

  auto quoted = parse_trigger_calls(
      "CREATE EVENT TRIGGER \"Odd \"\"one\"\"\" ON sql_drop\n"
      "   EXECUTE PROCEDURE \"My Schema\".\"f\"();\n"
      "CREATE EVENT TRIGGER bare ON sql_drop EXECUTE FUNCTION g();\n"
      "CREATE CONSTRAINT TRIGGER c AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION s.h();\n"
      "CREATE TABLE t (id int);\n"
      "CREATE TRIGGER no_table AFTER INSERT FOR EACH ROW EXECUTE FUNCTION s.h();\n"
      "CREATE EVENT TRIGGER broken ON sql_drop;\n"
      "CREATE EVENT TRIGGER \"unterminated");
  ASSERT_EQ(quoted.size(), 3u);
  EXPECT_EQ(quoted[0].trigger, "Odd \"one\"");
  EXPECT_EQ(quoted[0].schema, "My Schema");
  EXPECT_EQ(quoted[0].function, "f");
  EXPECT_EQ(quoted[1].schema, "public");
  EXPECT_EQ(quoted[1].function, "g");
  EXPECT_EQ(quoted[2].trigger, "c");
  EXPECT_EQ(quoted[2].table_schema, "public");
  EXPECT_EQ(quoted[2].table, "t");
  EXPECT_EQ(quoted[2].function, "h");
}

TEST(DumpArchive, TheRestoreListSkipsWhatIsNotTheApplications) {
  const auto plan = plan_restore(kListing, parse_trigger_calls(kTriggerSql), {"_pgrelay"});
  EXPECT_EQ(plan.skipped,
            (std::vector<std::string>{
                "PUBLICATION _zero_public_0", "PUBLICATION _zero_metadata_0",
                "PUBLICATION _pgrelay_capture",
                "EVENT TRIGGER _pgrelay_ddl (its function _pgrelay.on_ddl is not in the archive)",
                "EVENT TRIGGER zt_ddl_start_0 (its function zt_0.emit_ddl_start is not in the "
                "archive)"}));
  EXPECT_EQ(plan.skipped_table_triggers, 1u);
  // Skipped lines are commented out; every other line is kept as it was.
  for (std::string_view kept :
       {"\n3402; 6104 16702 PUBLICATION - app_pub postgres\n",
        "\n3405; 6106 16705 PUBLICATION TABLE public app_pub items postgres\n",
        "\n3502; 3466 16802 EVENT TRIGGER - audit postgres\n",
        "\n3317; 2620 16494 TRIGGER app_data my table keep_me postgres\n",
        "\n3318; 2620 16495 TRIGGER app_data my table unread postgres\n",
        "\n3362; 0 0 BLOBS - BLOBS \n", "\n3361; 2613 16600 BLOB - 16600 postgres\n",
        "\n; Selected TOC Entries:\n"}) {
    EXPECT_NE(plan.listing.find(kept), std::string::npos) << kept;
  }
  for (std::string_view skipped :
       {"\n;3404; 6237 16704 PUBLICATION TABLES IN SCHEMA public _zero_public_0 public postgres\n",
        "\n;3406; 6106 16706 PUBLICATION TABLE public _pgrelay_capture items postgres\n",
        "\n;3500; 3466 16800 EVENT TRIGGER - _pgrelay_ddl postgres\n",
        "\n;3400; 6104 16700 PUBLICATION - _zero_public_0 postgres\n"}) {
    EXPECT_NE(plan.listing.find(skipped), std::string::npos) << skipped;
  }
  EXPECT_EQ(plan.tables, (std::vector<std::pair<std::string, std::string>>{
                             {"public", "items"}, {"app_data", "my table"}}));
  // An event trigger whose statement could not be read is kept (pg_restore reports it).
  EXPECT_EQ(plan_restore(kListing, {}, {}).skipped.size(), 2u);
}

TEST(DumpArchive, TheTriggerListingHoldsOnlyTriggers) {
  EXPECT_EQ(trigger_listing(kListing),
            "3316; 2620 16493 TRIGGER public items _pgrelay_capture_delete postgres\n"
            "3317; 2620 16494 TRIGGER app_data my table keep_me postgres\n"
            "3318; 2620 16495 TRIGGER app_data my table unread postgres\n"
            "3500; 3466 16800 EVENT TRIGGER - _pgrelay_ddl postgres\n"
            "3501; 3466 16801 EVENT TRIGGER - zt_ddl_start_0 postgres\n"
            "3502; 3466 16802 EVENT TRIGGER - audit postgres\n");
  EXPECT_EQ(trigger_listing("; nothing\n"), "");
}

}  // namespace
}  // namespace pgrelay::cli::dump
