// Tests the replication command tokenizer and grammar against Postgres 15-17 walsenders.
#include "pgoutput/repl_command.h"

#include <gtest/gtest.h>

#include <string>

namespace pgrelay::pgoutput {
namespace {

ReplicationCommand parse_ok(std::string_view text) {
  auto r = parse_replication_command(text);
  EXPECT_TRUE(r.ok()) << text << "\n -> " << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? *r : ReplicationCommand{};
}

Error parse_error(std::string_view text) {
  auto r = parse_replication_command(text);
  EXPECT_FALSE(r.ok()) << text << " parsed unexpectedly";
  return r.ok() ? Error{} : r.error();
}

void expect_syntax_error(std::string_view text) {
  Error e = parse_error(text);
  EXPECT_EQ(e.sqlstate, "42601") << text;
  EXPECT_EQ(e.message, "syntax error") << text;
  EXPECT_FALSE(e.hint.empty()) << text;
}

GenericOption str_opt(std::string name, std::string value) {
  return {std::move(name), GenericOption::Value{GenericOption::Value::Kind::kString, value}};
}

// ---- IDENTIFY_SYSTEM, SHOW, TIMELINE_HISTORY, READ_REPLICATION_SLOT ----

TEST(ReplCommand, IdentifySystemWithSpacingAndSemicolon) {
  for (const char* text : {"IDENTIFY_SYSTEM", "IDENTIFY_SYSTEM;", "  IDENTIFY_SYSTEM  ;  \n",
                           "\tIDENTIFY_SYSTEM\r\n", "IDENTIFY_SYSTEM\f\v;"}) {
    auto cmd = parse_ok(text);
    EXPECT_TRUE(cmd.is<IdentifySystem>()) << text;
    EXPECT_TRUE(cmd.notices.empty());
  }
}

TEST(ReplCommand, IdentifySystemRejectsTrailingInput) {
  expect_syntax_error("IDENTIFY_SYSTEM x");
  expect_syntax_error("IDENTIFY_SYSTEM;;");
  expect_syntax_error("IDENTIFY_SYSTEM; IDENTIFY_SYSTEM");
  expect_syntax_error("IDENTIFY_SYSTEM ()");
}

TEST(ReplCommand, ReadsInputAsACString) {
  // The wire layer hands over a NUL-terminated query; nothing after a NUL exists for Postgres.
  auto cmd = parse_ok(std::string_view("IDENTIFY_SYSTEM\0junk", 20));
  EXPECT_TRUE(cmd.is<IdentifySystem>());
}

TEST(ReplCommand, ShowVariableNames) {
  EXPECT_EQ(parse_ok("SHOW wal_segment_size").as<Show>().name, "wal_segment_size");
  EXPECT_EQ(parse_ok("SHOW server_version;").as<Show>().name, "server_version");
  EXPECT_EQ(parse_ok("SHOW Search_Path").as<Show>().name, "search_path");
  EXPECT_EQ(parse_ok("SHOW \"Foo\".bar").as<Show>().name, "Foo.bar");
  EXPECT_EQ(parse_ok("SHOW a . b.C").as<Show>().name, "a.b.c");
  EXPECT_EQ(parse_ok("SHOW \"x y\"").as<Show>().name, "x y");
}

TEST(ReplCommand, ShowErrors) {
  expect_syntax_error("SHOW");
  expect_syntax_error("SHOW a.");
  expect_syntax_error("SHOW .a");
  expect_syntax_error("SHOW 'wal_level'");
  expect_syntax_error("SHOW a b");
  expect_syntax_error("SHOW 5");
  // A keyword is not a variable name unless quoted.
  expect_syntax_error("SHOW TIMELINE");
  EXPECT_EQ(parse_ok("SHOW \"TIMELINE\"").as<Show>().name, "TIMELINE");
  EXPECT_EQ(parse_ok("SHOW timeline").as<Show>().name, "timeline");
}

TEST(ReplCommand, TimelineHistory) {
  EXPECT_EQ(parse_ok("TIMELINE_HISTORY 1").as<TimelineHistory>().timeline, 1u);
  EXPECT_EQ(parse_ok("TIMELINE_HISTORY 42;").as<TimelineHistory>().timeline, 42u);
  EXPECT_EQ(parse_ok("TIMELINE_HISTORY 007").as<TimelineHistory>().timeline, 7u);
  EXPECT_EQ(parse_ok("TIMELINE_HISTORY 4294967295").as<TimelineHistory>().timeline, 4294967295u);
  // strtoul saturates and the scanner stores the result in a uint32, as Postgres does.
  EXPECT_EQ(parse_ok("TIMELINE_HISTORY 99999999999999999999999").as<TimelineHistory>().timeline,
            4294967295u);
}

TEST(ReplCommand, TimelineHistoryErrors) {
  Error zero = parse_error("TIMELINE_HISTORY 0");
  EXPECT_EQ(zero.sqlstate, "42601");
  EXPECT_EQ(zero.message, "invalid timeline 0");
  EXPECT_FALSE(zero.hint.empty());
  // 2^32 wraps to 0 in the uint32, as in Postgres.
  EXPECT_EQ(parse_error("TIMELINE_HISTORY 4294967296").message, "invalid timeline 0");
  // The timeline is checked as soon as it is read, before the junk after it.
  EXPECT_EQ(parse_error("TIMELINE_HISTORY 0 junk").message, "invalid timeline 0");
  expect_syntax_error("TIMELINE_HISTORY");
  expect_syntax_error("TIMELINE_HISTORY x");
  expect_syntax_error("TIMELINE_HISTORY -1");
  expect_syntax_error("TIMELINE_HISTORY '1'");
  expect_syntax_error("TIMELINE_HISTORY 1 2");
}

TEST(ReplCommand, ReadReplicationSlot) {
  EXPECT_EQ(parse_ok("READ_REPLICATION_SLOT s").as<ReadReplicationSlot>().slot_name, "s");
  EXPECT_EQ(parse_ok("READ_REPLICATION_SLOT \"My Slot\";").as<ReadReplicationSlot>().slot_name,
            "My Slot");
  // repl_gram.y uses var_name here, so a dotted name parses (the slot lookup then fails).
  EXPECT_EQ(parse_ok("READ_REPLICATION_SLOT a.b").as<ReadReplicationSlot>().slot_name, "a.b");
  expect_syntax_error("READ_REPLICATION_SLOT");
  expect_syntax_error("READ_REPLICATION_SLOT 's'");
}

// ---- CREATE_REPLICATION_SLOT ----

TEST(ReplCommand, CreateLogicalSlotAsZeroCacheSendsIt) {
  auto cmd = parse_ok("CREATE_REPLICATION_SLOT \"zero_slot\" LOGICAL pgoutput");
  const auto& c = cmd.as<CreateReplicationSlot>();
  EXPECT_EQ(c.slot_name, "zero_slot");
  EXPECT_FALSE(c.temporary);
  EXPECT_EQ(c.kind, SlotKind::kLogical);
  EXPECT_EQ(c.plugin, "pgoutput");
  EXPECT_EQ(c.snapshot, SnapshotAction::kExport);  // walsender's default
  EXPECT_FALSE(c.two_phase);
  EXPECT_FALSE(c.reserve_wal);
  EXPECT_FALSE(c.failover);
  EXPECT_TRUE(c.options.empty());
}

TEST(ReplCommand, CreateTemporarySlotWithSnapshotOption) {
  auto cmd = parse_ok("CREATE_REPLICATION_SLOT x TEMPORARY LOGICAL pgoutput (SNAPSHOT 'use')");
  const auto& c = cmd.as<CreateReplicationSlot>();
  EXPECT_EQ(c.slot_name, "x");
  EXPECT_TRUE(c.temporary);
  EXPECT_EQ(c.snapshot, SnapshotAction::kUse);
  ASSERT_EQ(c.options.size(), 1u);
  EXPECT_EQ(c.options[0], str_opt("snapshot", "use"));
}

TEST(ReplCommand, CreateSlotAsPostgresClientsSendIt) {
  // pg_recvlogical / pg_receivewal (PG15 streamutil.c).
  {
    auto c = parse_ok(
                 "CREATE_REPLICATION_SLOT \"test\" LOGICAL \"test_decoding\" (TWO_PHASE, SNAPSHOT "
                 "'nothing')")
                 .as<CreateReplicationSlot>();
    EXPECT_EQ(c.plugin, "test_decoding");
    EXPECT_TRUE(c.two_phase);
    EXPECT_EQ(c.snapshot, SnapshotAction::kNothing);
    ASSERT_EQ(c.options.size(), 2u);
    EXPECT_EQ(c.options[0].name, "two_phase");
    EXPECT_FALSE(c.options[0].value.has_value());
  }
  {
    auto c = parse_ok("CREATE_REPLICATION_SLOT \"phys\" PHYSICAL (RESERVE_WAL)")
                 .as<CreateReplicationSlot>();
    EXPECT_EQ(c.kind, SlotKind::kPhysical);
    EXPECT_TRUE(c.plugin.empty());
    EXPECT_TRUE(c.reserve_wal);
  }
  // Subscription (libpqwalreceiver) with two_phase, and a tablesync slot.
  {
    auto c = parse_ok(
                 "CREATE_REPLICATION_SLOT \"sub\" LOGICAL pgoutput (TWO_PHASE, SNAPSHOT "
                 "'nothing')")
                 .as<CreateReplicationSlot>();
    EXPECT_TRUE(c.two_phase);
    EXPECT_EQ(c.snapshot, SnapshotAction::kNothing);
  }
  {
    auto c = parse_ok(
                 "CREATE_REPLICATION_SLOT \"pg_16395_sync_16385_7180000000000000000\" "
                 "TEMPORARY LOGICAL pgoutput (SNAPSHOT 'use')")
                 .as<CreateReplicationSlot>();
    EXPECT_EQ(c.slot_name, "pg_16395_sync_16385_7180000000000000000");
    EXPECT_TRUE(c.temporary);
  }
  // psycopg2's create_replication_slot.
  EXPECT_EQ(parse_ok("CREATE_REPLICATION_SLOT \"slot\" PHYSICAL").as<CreateReplicationSlot>().kind,
            SlotKind::kPhysical);
  // PG17 failover.
  EXPECT_TRUE(parse_ok("CREATE_REPLICATION_SLOT s LOGICAL pgoutput (FAILOVER)")
                  .as<CreateReplicationSlot>()
                  .failover);
}

TEST(ReplCommand, CreateSlotLegacyKeywords) {
  struct Case {
    const char* text;
    SnapshotAction snapshot;
    bool two_phase;
  };
  for (const Case& c : {
           Case{"CREATE_REPLICATION_SLOT s LOGICAL pgoutput EXPORT_SNAPSHOT",
                SnapshotAction::kExport, false},
           Case{"CREATE_REPLICATION_SLOT s LOGICAL pgoutput NOEXPORT_SNAPSHOT",
                SnapshotAction::kNothing, false},
           Case{"CREATE_REPLICATION_SLOT s LOGICAL pgoutput USE_SNAPSHOT;", SnapshotAction::kUse,
                false},
           Case{"CREATE_REPLICATION_SLOT s LOGICAL pgoutput TWO_PHASE NOEXPORT_SNAPSHOT",
                SnapshotAction::kNothing, true},
       }) {
    auto cmd = parse_ok(c.text).as<CreateReplicationSlot>();
    EXPECT_EQ(cmd.snapshot, c.snapshot) << c.text;
    EXPECT_EQ(cmd.two_phase, c.two_phase) << c.text;
  }
  auto phys = parse_ok("CREATE_REPLICATION_SLOT s TEMPORARY PHYSICAL RESERVE_WAL")
                  .as<CreateReplicationSlot>();
  EXPECT_TRUE(phys.reserve_wal);
  EXPECT_TRUE(phys.temporary);
  ASSERT_EQ(phys.options.size(), 1u);
  EXPECT_EQ(phys.options[0], str_opt("reserve_wal", "true"));
}

TEST(ReplCommand, CreateSlotGenericOptionValues) {
  auto snap = [](const char* opts) {
    return parse_ok(std::string("CREATE_REPLICATION_SLOT s LOGICAL p ") + opts)
        .as<CreateReplicationSlot>();
  };
  EXPECT_EQ(snap("(SNAPSHOT export)").snapshot, SnapshotAction::kExport);  // IDENT value
  EXPECT_EQ(snap("(snapshot \"nothing\")").snapshot, SnapshotAction::kNothing);
  EXPECT_TRUE(snap("(TWO_PHASE true)").two_phase);
  EXPECT_TRUE(snap("(TWO_PHASE 'ON')").two_phase);
  EXPECT_FALSE(snap("(TWO_PHASE off)").two_phase);
  EXPECT_FALSE(snap("(TWO_PHASE 0)").two_phase);
  EXPECT_TRUE(snap("(two_phase 1)").two_phase);
  EXPECT_FALSE(snap("(FAILOVER false, TWO_PHASE, SNAPSHOT 'use')").failover);

  auto integer = snap("(TWO_PHASE 1)").options.at(0);
  ASSERT_TRUE(integer.value.has_value());
  EXPECT_EQ(integer.value->kind, GenericOption::Value::Kind::kInteger);
  EXPECT_EQ(integer.value->text, "1");
  EXPECT_EQ(parse_ok("CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL false)")
                .as<CreateReplicationSlot>()
                .reserve_wal,
            false);
}

TEST(ReplCommand, CreateSlotOptionErrors) {
  const std::string logical = "CREATE_REPLICATION_SLOT s LOGICAL pgoutput ";
  Error bad_snapshot = parse_error(logical + "(SNAPSHOT 'EXPORT')");
  EXPECT_EQ(bad_snapshot.sqlstate, "22023");
  EXPECT_EQ(bad_snapshot.message,
            "unrecognized value for CREATE_REPLICATION_SLOT option \"snapshot\": \"EXPORT\"");
  EXPECT_FALSE(bad_snapshot.hint.empty());
  EXPECT_EQ(parse_error(logical + "(SNAPSHOT 5)").message,
            "unrecognized value for CREATE_REPLICATION_SLOT option \"snapshot\": \"5\"");

  Error no_value = parse_error(logical + "(SNAPSHOT)");
  EXPECT_EQ(no_value.sqlstate, "42601");
  EXPECT_EQ(no_value.message, "snapshot requires a parameter");

  for (const std::string& text :
       {logical + "(SNAPSHOT 'use', SNAPSHOT 'use')", logical + "(TWO_PHASE, TWO_PHASE false)",
        logical + "(FAILOVER, FAILOVER)", logical + "USE_SNAPSHOT EXPORT_SNAPSHOT",
        logical + "RESERVE_WAL", logical + "(RESERVE_WAL)",
        std::string("CREATE_REPLICATION_SLOT s PHYSICAL (SNAPSHOT 'use')"),
        std::string("CREATE_REPLICATION_SLOT s PHYSICAL TWO_PHASE"),
        std::string("CREATE_REPLICATION_SLOT s PHYSICAL (FAILOVER)"),
        std::string("CREATE_REPLICATION_SLOT s PHYSICAL RESERVE_WAL RESERVE_WAL")}) {
    Error e = parse_error(text);
    EXPECT_EQ(e.sqlstate, "42601") << text;
    EXPECT_EQ(e.message, "conflicting or redundant options") << text;
    EXPECT_FALSE(e.hint.empty()) << text;
  }

  for (const char* value : {"2", "'yes'", "'t'", "'1'", "maybe", "4294967295"}) {
    Error e = parse_error(logical + "(TWO_PHASE " + value + ")");
    EXPECT_EQ(e.sqlstate, "42601") << value;
    EXPECT_EQ(e.message, "two_phase requires a Boolean value") << value;
  }

  Error unknown = parse_error(logical + "(bogus)");
  EXPECT_EQ(unknown.sqlstate, "XX000");
  EXPECT_EQ(unknown.message, "unrecognized option: bogus");
  EXPECT_FALSE(unknown.hint.empty());
  // A keyword as an option name is spelled in lower case, as repl_gram.y's ident_or_keyword does.
  EXPECT_EQ(parse_error(logical + "(WAIT)").message, "unrecognized option: wait");
}

TEST(ReplCommand, CreateSlotSyntaxErrors) {
  for (const char* text : {
           "CREATE_REPLICATION_SLOT",
           "CREATE_REPLICATION_SLOT s",
           "CREATE_REPLICATION_SLOT s LOGICAL",
           "CREATE_REPLICATION_SLOT s LOGICAL 'pgoutput'",
           "CREATE_REPLICATION_SLOT s TEMPORARY TEMPORARY LOGICAL p",
           "CREATE_REPLICATION_SLOT s LOGICAL p TEMPORARY",
           "CREATE_REPLICATION_SLOT s PHYSICAL p",
           "CREATE_REPLICATION_SLOT 's' LOGICAL p",
           "CREATE_REPLICATION_SLOT s LOGICAL p (SNAPSHOT 'use'",
           "CREATE_REPLICATION_SLOT s LOGICAL p ()",
           "CREATE_REPLICATION_SLOT s LOGICAL p (SNAPSHOT 'use',)",
           "CREATE_REPLICATION_SLOT s LOGICAL p (, SNAPSHOT 'use')",
           "CREATE_REPLICATION_SLOT s LOGICAL p (a b c)",
           "CREATE_REPLICATION_SLOT s LOGICAL p (SNAPSHOT EXPORT_SNAPSHOT)",
           "CREATE_REPLICATION_SLOT s LOGICAL p ('snapshot' 'use')",
           "CREATE_REPLICATION_SLOT s LOGICAL p (SNAPSHOT 0/0)",
           "CREATE_REPLICATION_SLOT s LOGICAL p USE_SNAPSHOT (TWO_PHASE)",
           "CREATE_REPLICATION_SLOT s LOGICAL p (TWO_PHASE) USE_SNAPSHOT",
           "CREATE_REPLICATION_SLOT s LOGICAL p (SNAPSHOT = 'use')",
       }) {
    expect_syntax_error(text);
  }
}

TEST(ReplCommand, KeywordsAreCaseSensitiveLikePostgres) {
  // Lower-case "slot" is an identifier, so it is a valid slot name...
  EXPECT_EQ(parse_ok("CREATE_REPLICATION_SLOT slot LOGICAL pgoutput")
                .as<CreateReplicationSlot>()
                .slot_name,
            "slot");
  // ...while upper-case SLOT is a keyword and needs quotes.
  Error keyword_name = parse_error("CREATE_REPLICATION_SLOT SLOT LOGICAL pgoutput");
  EXPECT_EQ(keyword_name.message, "syntax error");
  EXPECT_NE(keyword_name.hint.find("SLOT is a replication keyword"), std::string::npos)
      << keyword_name.hint;
  EXPECT_EQ(parse_ok("CREATE_REPLICATION_SLOT \"SLOT\" LOGICAL pgoutput")
                .as<CreateReplicationSlot>()
                .slot_name,
            "SLOT");
  // A lower-case keyword is an identifier where a keyword was needed; the hint says so.
  Error lower = parse_error("CREATE_REPLICATION_SLOT s logical pgoutput");
  EXPECT_EQ(lower.message, "syntax error");
  EXPECT_NE(lower.hint.find("write LOGICAL in upper case"), std::string::npos) << lower.hint;
  EXPECT_NE(lower.detail.find("\"logical\" at position 27"), std::string::npos) << lower.detail;
  Error first = parse_error("identify_system");
  EXPECT_NE(first.hint.find("write IDENTIFY_SYSTEM in upper case"), std::string::npos);
  expect_syntax_error("Identify_System");
}

// ---- DROP / ALTER ----

TEST(ReplCommand, DropReplicationSlot) {
  auto wait = parse_ok("DROP_REPLICATION_SLOT x WAIT").as<DropReplicationSlot>();
  EXPECT_EQ(wait.slot_name, "x");
  EXPECT_TRUE(wait.wait);
  auto nowait = parse_ok("DROP_REPLICATION_SLOT \"X\";").as<DropReplicationSlot>();
  EXPECT_EQ(nowait.slot_name, "X");
  EXPECT_FALSE(nowait.wait);
  expect_syntax_error("DROP_REPLICATION_SLOT");
  expect_syntax_error("DROP_REPLICATION_SLOT x wait");
  expect_syntax_error("DROP_REPLICATION_SLOT x WAIT WAIT");
  expect_syntax_error("DROP_REPLICATION_SLOT x y");
  expect_syntax_error("DROP_REPLICATION_SLOT WAIT");
}

TEST(ReplCommand, AlterReplicationSlot) {
  auto a = parse_ok("ALTER_REPLICATION_SLOT s (FAILOVER)").as<AlterReplicationSlot>();
  EXPECT_EQ(a.slot_name, "s");
  EXPECT_EQ(a.failover, std::optional<bool>(true));
  EXPECT_FALSE(a.two_phase.has_value());
  auto b = parse_ok("ALTER_REPLICATION_SLOT \"s\" (FAILOVER false, TWO_PHASE 'on');")
               .as<AlterReplicationSlot>();
  EXPECT_EQ(b.failover, std::optional<bool>(false));
  EXPECT_EQ(b.two_phase, std::optional<bool>(true));
  ASSERT_EQ(b.options.size(), 2u);
  EXPECT_EQ(b.options[1], str_opt("two_phase", "on"));

  expect_syntax_error("ALTER_REPLICATION_SLOT s");
  expect_syntax_error("ALTER_REPLICATION_SLOT s ()");
  expect_syntax_error("ALTER_REPLICATION_SLOT (FAILOVER)");
  expect_syntax_error("ALTER_REPLICATION_SLOT s FAILOVER");
  EXPECT_EQ(parse_error("ALTER_REPLICATION_SLOT s (FAILOVER, FAILOVER)").message,
            "conflicting or redundant options");
  Error unknown = parse_error("ALTER_REPLICATION_SLOT s (bogus 1)");
  EXPECT_EQ(unknown.sqlstate, "XX000");
  EXPECT_EQ(unknown.message, "unrecognized option: bogus");
  EXPECT_EQ(parse_error("ALTER_REPLICATION_SLOT s (FAILOVER 'sometimes')").message,
            "failover requires a Boolean value");
}

// ---- START_REPLICATION ----

TEST(ReplCommand, StartLogicalWithQuotedPublicationList) {
  auto cmd = parse_ok(
      "START_REPLICATION SLOT \"x\" LOGICAL 0/0 (proto_version '1', publication_names "
      "'\"a\",\"B\"', messages 'true')");
  const auto& s = cmd.as<StartReplication>();
  EXPECT_EQ(s.kind, SlotKind::kLogical);
  EXPECT_EQ(s.slot_name, std::optional<std::string>("x"));
  EXPECT_EQ(s.start, wire::Lsn(0));
  ASSERT_EQ(s.options.size(), 3u);
  EXPECT_EQ(s.options[0], (PluginOption{"proto_version", "1"}));
  EXPECT_EQ(s.options[1], (PluginOption{"publication_names", "\"a\",\"B\""}));
  EXPECT_EQ(s.options[2], (PluginOption{"messages", "true"}));
}

TEST(ReplCommand, StartLogicalWithQuotedOptionNames) {
  auto s = parse_ok(
               "START_REPLICATION SLOT x LOGICAL 0/16B3748 (\"proto_version\" '2', "
               "\"publication_names\" 'p', \"streaming\" 'on')")
               .as<StartReplication>();
  EXPECT_EQ(s.start.value(), 0x16B3748u);
  ASSERT_EQ(s.options.size(), 3u);
  EXPECT_EQ(s.options[2], (PluginOption{"streaming", "on"}));
}

TEST(ReplCommand, StartLogicalAsClientsSendIt) {
  // pg_recvlogical: quoted names with dashes.
  auto recv = parse_ok(
                  "START_REPLICATION SLOT \"test\" LOGICAL 0/0 (\"include-xids\" '0', "
                  "\"skip-empty-xacts\" '1')")
                  .as<StartReplication>();
  ASSERT_EQ(recv.options.size(), 2u);
  EXPECT_EQ(recv.options[0], (PluginOption{"include-xids", "0"}));
  // A PG16 subscriber.
  auto sub = parse_ok(
                 "START_REPLICATION SLOT \"sub\" LOGICAL 1/1A2B3C4 (proto_version '4', "
                 "streaming 'parallel', origin 'any', two_phase 'on', publication_names "
                 "'\"pub\"', binary 'true')")
                 .as<StartReplication>();
  EXPECT_EQ(sub.start.value(), 0x101A2B3C4u);
  EXPECT_EQ(sub.options.size(), 6u);
  EXPECT_EQ(sub.options[5], (PluginOption{"binary", "true"}));
  // postgres.js / zero-cache style, unquoted slot and upper-case LSN.
  auto js = parse_ok(
                "START_REPLICATION SLOT zero_1 LOGICAL 2A/FF00AB12 (proto_version '1', "
                "publication_names 'zero_public,zero_meta');")
                .as<StartReplication>();
  EXPECT_EQ(js.start.value(), 0x2AFF00AB12u);
  EXPECT_EQ(js.options[1], (PluginOption{"publication_names", "zero_public,zero_meta"}));
}

TEST(ReplCommand, StartLogicalOptionShapes) {
  EXPECT_TRUE(
      parse_ok("START_REPLICATION SLOT x LOGICAL 0/0").as<StartReplication>().options.empty());
  auto s = parse_ok("START_REPLICATION SLOT x LOGICAL 0/0 (Flag, empty '', quote 'it''s')")
               .as<StartReplication>();
  ASSERT_EQ(s.options.size(), 3u);
  EXPECT_EQ(s.options[0], (PluginOption{"flag", std::nullopt}));
  EXPECT_EQ(s.options[1], (PluginOption{"empty", ""}));
  EXPECT_EQ(s.options[2], (PluginOption{"quote", "it's"}));
  // Duplicates are the plugin's business; the grammar keeps them in order.
  EXPECT_EQ(parse_ok("START_REPLICATION SLOT x LOGICAL 0/0 (a '1', a '2')")
                .as<StartReplication>()
                .options.size(),
            2u);
  // String literals span lines and keep other quotes and backslashes verbatim.
  EXPECT_EQ(parse_ok("START_REPLICATION SLOT x LOGICAL 0/0 (a 'x\n\"y\\n')")
                .as<StartReplication>()
                .options[0]
                .value,
            std::optional<std::string>("x\n\"y\\n"));
}

TEST(ReplCommand, StartPhysical) {
  auto a = parse_ok("START_REPLICATION 0/3000000").as<StartReplication>();
  EXPECT_EQ(a.kind, SlotKind::kPhysical);
  EXPECT_FALSE(a.slot_name.has_value());
  EXPECT_EQ(a.start.value(), 0x3000000u);
  EXPECT_EQ(a.timeline, 0u);
  auto b = parse_ok("START_REPLICATION PHYSICAL 0/3000000 TIMELINE 1").as<StartReplication>();
  EXPECT_EQ(b.timeline, 1u);
  auto c = parse_ok("START_REPLICATION SLOT s PHYSICAL 1/0 TIMELINE 2;").as<StartReplication>();
  EXPECT_EQ(c.slot_name, std::optional<std::string>("s"));
  EXPECT_EQ(c.start.value(), 0x100000000u);
  EXPECT_EQ(c.timeline, 2u);
  EXPECT_EQ(parse_ok("START_REPLICATION SLOT s 0/0").as<StartReplication>().kind,
            SlotKind::kPhysical);
}

TEST(ReplCommand, LsnLiterals) {
  auto lsn = [](const std::string& text) {
    return parse_ok("START_REPLICATION SLOT x LOGICAL " + text).as<StartReplication>().start;
  };
  EXPECT_EQ(lsn("A/B").value(), 0xA0000000Bu);
  EXPECT_EQ(lsn("ffffffff/ffffffff").value(), 0xFFFFFFFFFFFFFFFFu);
  EXPECT_EQ(lsn("00000000016/0").value(), 0x1600000000u);  // extra leading zeros are fine
  EXPECT_EQ(lsn("DEAD/BEEF").value(), 0xDEAD0000BEEFu);    // hex letters first: still an LSN

  Error wide = parse_error("START_REPLICATION SLOT x LOGICAL 100000000/0");
  EXPECT_EQ(wide.sqlstate, "42601");
  EXPECT_EQ(wide.message, "invalid streaming start location");
  EXPECT_EQ(parse_error("START_REPLICATION 0/100000000").message,
            "invalid streaming start location");
  expect_syntax_error("START_REPLICATION SLOT x LOGICAL 0-0");
  expect_syntax_error("START_REPLICATION SLOT x LOGICAL 0/");
  expect_syntax_error("START_REPLICATION SLOT x LOGICAL /0");
  expect_syntax_error("START_REPLICATION SLOT x LOGICAL 0 / 0");
  expect_syntax_error("START_REPLICATION SLOT x LOGICAL '0/0'");
  expect_syntax_error("START_REPLICATION SLOT x LOGICAL 0/0x");  // 0/0 then identifier x
  expect_syntax_error("START_REPLICATION SLOT x LOGICAL G/0");
}

TEST(ReplCommand, StartReplicationErrors) {
  for (const char* text : {
           "START_REPLICATION",
           "START_REPLICATION SLOT",
           "START_REPLICATION SLOT x",
           "START_REPLICATION SLOT x LOGICAL",
           "START_REPLICATION LOGICAL 0/0",
           "START_REPLICATION SLOT x LOGICAL 0/0 TIMELINE 1",
           "START_REPLICATION SLOT x LOGICAL 0/0 ()",
           "START_REPLICATION SLOT x LOGICAL 0/0 (proto_version 1)",
           "START_REPLICATION SLOT x LOGICAL 0/0 (proto_version \"1\")",
           "START_REPLICATION SLOT x LOGICAL 0/0 (proto_version '1' publication_names 'a')",
           "START_REPLICATION SLOT x LOGICAL 0/0 (proto_version '1',)",
           "START_REPLICATION SLOT x LOGICAL 0/0 (proto_version '1'",
           "START_REPLICATION SLOT x LOGICAL 0/0 proto_version '1'",
           "START_REPLICATION SLOT x PHYSICAL 0/0 (a '1')",
           "START_REPLICATION 0/0 TIMELINE",
           "START_REPLICATION 0/0 TIMELINE x",
           "START_REPLICATION PHYSICAL SLOT s 0/0",
           "START_REPLICATION slot x LOGICAL 0/0",
       }) {
    expect_syntax_error(text);
  }
  // Upper-case keywords are not plugin option names (repl_gram.y takes only IDENT there).
  Error keyword = parse_error("START_REPLICATION SLOT x LOGICAL 0/0 (TWO_PHASE 'on')");
  EXPECT_EQ(keyword.message, "syntax error");
  EXPECT_NE(keyword.hint.find("TWO_PHASE is a replication keyword"), std::string::npos);
  EXPECT_EQ(parse_error("START_REPLICATION 0/0 TIMELINE 0").message, "invalid timeline 0");
}

// ---- BASE_BACKUP and friends ----

TEST(ReplCommand, BaseBackupIsRecognizedAndRefused) {
  for (const char* text :
       {"BASE_BACKUP", "BASE_BACKUP;",
        "BASE_BACKUP (LABEL 'pg_basebackup base backup', PROGRESS, CHECKPOINT 'fast', WAIT 0, "
        "MANIFEST 'yes', TARGET 'client')",
        "UPLOAD_MANIFEST"}) {
    Error e = parse_error(text);
    EXPECT_EQ(e.sqlstate, "0A000") << text;
    EXPECT_EQ(e.message, "pgrelay does not serve base backups") << text;
    EXPECT_NE(e.hint.find("pg_basebackup against the upstream"), std::string::npos) << e.hint;
  }
  // Syntax is checked first; the pre-PG15 keyword form is gone from the grammar.
  expect_syntax_error("BASE_BACKUP LABEL 'x' FAST");
  expect_syntax_error("BASE_BACKUP (");
  expect_syntax_error("BASE_BACKUP ()");
  expect_syntax_error("UPLOAD_MANIFEST now");
}

// ---- tokens ----

TEST(ReplCommand, IdentifierQuotingAndCase) {
  auto drop = [](const std::string& name) {
    return parse_ok("DROP_REPLICATION_SLOT " + name).as<DropReplicationSlot>().slot_name;
  };
  EXPECT_EQ(drop("MySlot"), "myslot");
  EXPECT_EQ(drop("\"MySlot\""), "MySlot");
  EXPECT_EQ(drop("a$1_b"), "a$1_b");
  EXPECT_EQ(drop("_x"), "_x");
  EXPECT_EQ(drop("\xC3\x84"
                 "Bc"),
            "\xC3\x84"
            "bc");  // only ASCII letters are downcased
  EXPECT_EQ(drop("\"with space, comma\""), "with space, comma");
  EXPECT_EQ(drop("\"it's\""), "it's");
  // Postgres's replication scanner has no "" escape: this is two identifiers there.
  expect_syntax_error("DROP_REPLICATION_SLOT \"a\"\"b\"");
  // ...and accepts an empty delimited identifier; slot name checks come later.
  EXPECT_EQ(drop("\"\""), "");
  expect_syntax_error("DROP_REPLICATION_SLOT 1abc");
}

TEST(ReplCommand, UnterminatedQuotes) {
  for (const char* text : {"DROP_REPLICATION_SLOT \"abc", "SHOW \"x",
                           "START_REPLICATION SLOT x LOGICAL 0/0 (a 'unterminated",
                           "START_REPLICATION SLOT x LOGICAL 0/0 (a 'it''s)", "IDENTIFY_SYSTEM '",
                           "CREATE_REPLICATION_SLOT \""}) {
    Error e = parse_error(text);
    EXPECT_EQ(e.sqlstate, "42601") << text;
    EXPECT_EQ(e.message, "unterminated quoted string") << text;
    EXPECT_FALSE(e.hint.empty());
  }
  // The parser stops at the first bad token, so a later lexical error is never reached.
  expect_syntax_error("IDENTIFY_SYSTEM foo 'unterminated");
}

TEST(ReplCommand, LongIdentifiersAreTruncatedWithANotice) {
  const std::string long_name(70, 'A');
  auto cmd = parse_ok("DROP_REPLICATION_SLOT " + long_name);
  EXPECT_EQ(cmd.as<DropReplicationSlot>().slot_name, std::string(63, 'a'));
  ASSERT_EQ(cmd.notices.size(), 1u);
  EXPECT_EQ(cmd.notices[0].sqlstate, "42622");
  EXPECT_EQ(cmd.notices[0].message, "identifier \"" + std::string(70, 'a') +
                                        "\" will be truncated to \"" + std::string(63, 'a') + "\"");

  auto quoted = parse_ok("DROP_REPLICATION_SLOT \"" + std::string(64, 'Q') + "\"");
  EXPECT_EQ(quoted.as<DropReplicationSlot>().slot_name, std::string(63, 'Q'));
  EXPECT_EQ(quoted.notices.size(), 1u);

  // 63 bytes is the limit, so no notice.
  auto exact = parse_ok("DROP_REPLICATION_SLOT " + std::string(63, 'b'));
  EXPECT_EQ(exact.as<DropReplicationSlot>().slot_name.size(), 63u);
  EXPECT_TRUE(exact.notices.empty());

  // A multibyte character that would straddle the limit is dropped whole.
  const std::string accented = std::string(62, 'c') + "\xC3\xA9";  // 64 bytes
  auto mb = parse_ok("DROP_REPLICATION_SLOT " + accented);
  EXPECT_EQ(mb.as<DropReplicationSlot>().slot_name, std::string(62, 'c'));

  // Option names and plugin names are identifiers too; string values are never truncated.
  auto start = parse_ok("START_REPLICATION SLOT s LOGICAL 0/0 (" + std::string(65, 'o') + " '" +
                        std::string(100, 'v') + "')");
  const auto& opt = start.as<StartReplication>().options.at(0);
  EXPECT_EQ(opt.name.size(), 63u);
  EXPECT_EQ(opt.value->size(), 100u);
  EXPECT_EQ(start.notices.size(), 1u);
}

TEST(ReplCommand, ParsingNonCommandsFails) {
  for (const char* text : {"", "   ", ";", "SELECT 1", "SLOT x", "(IDENTIFY_SYSTEM)",
                           "\"IDENTIFY_SYSTEM\"", "0/0", "42"}) {
    expect_syntax_error(text);
  }
}

TEST(ReplCommand, ParsingGarbageNeverCrashes) {
  // Every prefix of some valid commands, plus odd bytes: always an ok/error, never a crash.
  const std::string inputs[] = {
      "START_REPLICATION SLOT \"x\" LOGICAL 0/0 (proto_version '1', publication_names 'a')",
      "CREATE_REPLICATION_SLOT x TEMPORARY LOGICAL pgoutput (SNAPSHOT 'use', TWO_PHASE 1)",
      "SHOW a.\"b\".c;", std::string("\xff\xfe\x80 '\"\x01(),;.", 13)};
  int errors = 0;
  for (const std::string& input : inputs) {
    for (std::size_t n = 0; n <= input.size(); ++n) {
      auto r = parse_replication_command(std::string_view(input).substr(0, n));
      if (!r.ok()) {
        ++errors;
        EXPECT_FALSE(r.error().message.empty());
      }
      (void)is_replication_command(std::string_view(input).substr(0, n));
    }
  }
  EXPECT_GT(errors, 0);
}

// ---- is_replication_command ----

TEST(IsReplicationCommand, RecognizesEveryCommandKeyword) {
  for (const char* text :
       {"IDENTIFY_SYSTEM", "  IDENTIFY_SYSTEM;", "SHOW wal_segment_size", "SHOW;",
        "TIMELINE_HISTORY 1", "CREATE_REPLICATION_SLOT x LOGICAL pgoutput",
        "READ_REPLICATION_SLOT s", "DROP_REPLICATION_SLOT x WAIT",
        "ALTER_REPLICATION_SLOT s (FAILOVER)", "START_REPLICATION SLOT x LOGICAL 0/0",
        "BASE_BACKUP", "UPLOAD_MANIFEST", "\n\tSTART_REPLICATION garbage ((("}) {
    EXPECT_TRUE(is_replication_command(text)) << text;
  }
}

TEST(IsReplicationCommand, PassesOrdinarySqlThrough) {
  for (const char* text : {"",
                           "   ",
                           ";",
                           "SELECT 1",
                           "select pg_current_wal_lsn()",
                           "BEGIN READ ONLY",
                           "identify_system",
                           "show wal_level",
                           "Show wal_level",
                           "SLOT",
                           "LOGICAL x",
                           "TIMELINE 1",
                           "WAIT",
                           "(IDENTIFY_SYSTEM)",
                           "\"IDENTIFY_SYSTEM\"",
                           "'abc",
                           "\"abc",
                           "IDENTIFY_SYSTEMS",
                           "SHOW_ALL",
                           "/* c */ IDENTIFY_SYSTEM",
                           "-- c\nIDENTIFY_SYSTEM",
                           "0/0 IDENTIFY_SYSTEM",
                           "SELECT 'IDENTIFY_SYSTEM'",
                           "CREATE PUBLICATION p FOR ALL TABLES"}) {
    EXPECT_FALSE(is_replication_command(text)) << text;
  }
}

// ---- option value helpers ----

TEST(OptionValues, DefGetBooleanAndString) {
  using Kind = GenericOption::Value::Kind;
  EXPECT_TRUE(*option_boolean(GenericOption{"b", std::nullopt}));
  EXPECT_FALSE(*option_boolean(GenericOption{"b", GenericOption::Value{Kind::kInteger, "0"}}));
  EXPECT_TRUE(*option_boolean(GenericOption{"b", GenericOption::Value{Kind::kInteger, "1"}}));
  EXPECT_FALSE(option_boolean(GenericOption{"b", GenericOption::Value{Kind::kString, "0"}}).ok());
  EXPECT_TRUE(*option_boolean(PluginOption{"b", "TrUe"}));
  EXPECT_FALSE(*option_boolean(PluginOption{"b", "OFF"}));
  EXPECT_TRUE(*option_boolean(PluginOption{"b", std::nullopt}));
  EXPECT_EQ(option_boolean(PluginOption{"b", "1"}).error().message, "b requires a Boolean value");
  EXPECT_EQ(*option_string(GenericOption{"s", GenericOption::Value{Kind::kInteger, "-1"}}), "-1");
  EXPECT_EQ(option_string(PluginOption{"s", std::nullopt}).error().message,
            "s requires a parameter");
}

}  // namespace
}  // namespace pgrelay::pgoutput
