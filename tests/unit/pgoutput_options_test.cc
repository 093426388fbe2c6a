// Tests pgoutput START_REPLICATION option parsing and startup checks against pgoutput.c's rules.
#include "pgoutput/options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pgrelay::pgoutput {
namespace {

using Options = std::vector<PluginOption>;

Options base() {
  return {{"proto_version", "1"}, {"publication_names", "pub"}};
}

Options with(Options options, PluginOption extra) {
  options.push_back(std::move(extra));
  return options;
}

PgoutputOptions parse_ok(const Options& options) {
  auto r = parse_pgoutput_options(options);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? *r : PgoutputOptions{};
}

Error parse_error(const Options& options) {
  auto r = parse_pgoutput_options(options);
  EXPECT_FALSE(r.ok());
  return r.ok() ? Error{} : r.error();
}

Error startup_error(const Options& options, std::uint32_t server_max = kProtoMaxVersion) {
  auto r = pgoutput_options_for_start(options, server_max);
  EXPECT_FALSE(r.ok());
  return r.ok() ? Error{} : r.error();
}

TEST(PgoutputOptions, MinimalOptionsAndDefaults) {
  PgoutputOptions o = parse_ok(base());
  EXPECT_EQ(o.proto_version, 1u);
  EXPECT_EQ(o.publication_names, std::vector<std::string>{"pub"});
  EXPECT_FALSE(o.binary);
  EXPECT_FALSE(o.messages);
  EXPECT_EQ(o.streaming, StreamingMode::kOff);
  EXPECT_FALSE(o.two_phase);
  EXPECT_EQ(o.origin, OriginFilter::kAny);
  EXPECT_TRUE(check_pgoutput_startup(o).ok());
}

TEST(PgoutputOptions, EverythingSet) {
  auto r = pgoutput_options_for_start(Options{{"proto_version", "4"},
                                              {"publication_names", "\"a\",\"B\""},
                                              {"binary", "true"},
                                              {"messages", "on"},
                                              {"streaming", "parallel"},
                                              {"two_phase", "TRUE"},
                                              {"origin", "none"}});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->proto_version, 4u);
  EXPECT_EQ(r->publication_names, (std::vector<std::string>{"a", "B"}));
  EXPECT_TRUE(r->binary);
  EXPECT_TRUE(r->messages);
  EXPECT_EQ(r->streaming, StreamingMode::kParallel);
  EXPECT_TRUE(r->two_phase);
  EXPECT_EQ(r->origin, OriginFilter::kNone);
}

TEST(PgoutputOptions, FromARealStartReplicationCommand) {
  auto cmd = parse_replication_command(
      "START_REPLICATION SLOT \"sub\" LOGICAL 0/1A2B3C4 (proto_version '3', streaming 'on', "
      "two_phase 'on', publication_names '\"pub\", Other', binary 'true')");
  ASSERT_TRUE(cmd.ok());
  auto o = pgoutput_options_for_start(cmd->as<StartReplication>().options);
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_EQ(o->proto_version, 3u);
  EXPECT_EQ(o->streaming, StreamingMode::kOn);
  EXPECT_TRUE(o->two_phase);
  EXPECT_EQ(o->publication_names, (std::vector<std::string>{"pub", "other"}));
}

TEST(PgoutputOptions, BooleansFollowDefGetBoolean) {
  for (const char* name : {"binary", "messages", "two_phase"}) {
    for (const char* yes : {"true", "TRUE", "on", "On"}) {
      auto r = parse_pgoutput_options(with(base(), {name, yes}));
      ASSERT_TRUE(r.ok()) << name << "=" << yes;
    }
    for (const char* no : {"false", "off", "OFF", "False"}) {
      auto r = parse_pgoutput_options(with(base(), {name, no}));
      ASSERT_TRUE(r.ok()) << name << "=" << no;
    }
    // No value means true.
    EXPECT_TRUE(parse_pgoutput_options(with(base(), {name, std::nullopt})).ok());
    // defGetBoolean takes only true/false/on/off for strings: not parse_bool's yes/1/t/prefixes.
    for (const char* bad : {"1", "0", "yes", "no", "t", "f", "of", "tru", "", " true", "true "}) {
      Error e = parse_error(with(base(), {name, bad}));
      EXPECT_EQ(e.sqlstate, "42601") << name << "=" << bad;
      EXPECT_EQ(e.message, std::string(name) + " requires a Boolean value");
      EXPECT_FALSE(e.hint.empty());
    }
  }
  EXPECT_TRUE(parse_ok(with(base(), {"binary", std::nullopt})).binary);
  EXPECT_FALSE(parse_ok(with(base(), {"messages", "off"})).messages);
  EXPECT_TRUE(parse_ok(with(base(), {"two_phase", "on"})).two_phase);
}

TEST(PgoutputOptions, Streaming) {
  EXPECT_EQ(parse_ok(with(base(), {"streaming", "on"})).streaming, StreamingMode::kOn);
  EXPECT_EQ(parse_ok(with(base(), {"streaming", "True"})).streaming, StreamingMode::kOn);
  EXPECT_EQ(parse_ok(with(base(), {"streaming", std::nullopt})).streaming, StreamingMode::kOn);
  EXPECT_EQ(parse_ok(with(base(), {"streaming", "off"})).streaming, StreamingMode::kOff);
  EXPECT_EQ(parse_ok(with(base(), {"streaming", "false"})).streaming, StreamingMode::kOff);
  EXPECT_EQ(parse_ok(with(base(), {"streaming", "PARALLEL"})).streaming, StreamingMode::kParallel);
  for (const char* bad : {"para", "1", "yes", ""}) {
    Error e = parse_error(with(base(), {"streaming", bad}));
    EXPECT_EQ(e.sqlstate, "42601");
    EXPECT_EQ(e.message, "streaming requires a Boolean value or \"parallel\"");
  }
}

TEST(PgoutputOptions, Origin) {
  EXPECT_EQ(parse_ok(with(base(), {"origin", "any"})).origin, OriginFilter::kAny);
  EXPECT_EQ(parse_ok(with(base(), {"origin", "NONE"})).origin, OriginFilter::kNone);
  Error bad = parse_error(with(base(), {"origin", "local"}));
  EXPECT_EQ(bad.sqlstate, "22023");
  EXPECT_EQ(bad.message, "unrecognized origin value: \"local\"");
  EXPECT_FALSE(bad.hint.empty());
  Error missing = parse_error(with(base(), {"origin", std::nullopt}));
  EXPECT_EQ(missing.sqlstate, "42601");
  EXPECT_EQ(missing.message, "origin requires a parameter");
}

TEST(PgoutputOptions, DuplicatesConflict) {
  for (PluginOption dup : {PluginOption{"proto_version", "1"},
                           PluginOption{"publication_names", "x"}, PluginOption{"binary", "on"},
                           PluginOption{"messages", std::nullopt}, PluginOption{"streaming", "off"},
                           PluginOption{"two_phase", "off"}, PluginOption{"origin", "any"}}) {
    Options opts = base();
    if (dup.name != "proto_version" && dup.name != "publication_names") opts.push_back(dup);
    opts.push_back(dup);
    Error e = parse_error(opts);
    EXPECT_EQ(e.sqlstate, "42601") << dup.name;
    EXPECT_EQ(e.message, "conflicting or redundant options") << dup.name;
    EXPECT_NE(e.hint.find(dup.name), std::string::npos);
  }
}

TEST(PgoutputOptions, ProtoVersionParsingMirrorsStrtoul) {
  auto version = [](const char* text) {
    return parse_ok(Options{{"proto_version", text}, {"publication_names", "p"}}).proto_version;
  };
  EXPECT_EQ(version("4"), 4u);
  EXPECT_EQ(version(" 2"), 2u);
  EXPECT_EQ(version("+3"), 3u);
  EXPECT_EQ(version("0002"), 2u);
  EXPECT_EQ(version("-0"), 0u);
  EXPECT_EQ(version(""), 0u);  // strtoul converts nothing and Postgres does not notice
  EXPECT_EQ(version("4294967295"), 4294967295u);
  EXPECT_EQ(version("-18446744073709551615"), 1u);  // negation wraps, as in C

  for (const char* bad :
       {"abc", "1 ", "1.0", "0x1", " ", "+", "-", "2a", "99999999999999999999999"}) {
    Error e = parse_error(Options{{"proto_version", bad}, {"publication_names", "p"}});
    EXPECT_EQ(e.sqlstate, "22023") << bad;
    EXPECT_EQ(e.message, "invalid proto_version") << bad;
    EXPECT_FALSE(e.hint.empty());
  }
  for (const char* big : {"4294967296", "18446744073709551615", "-1"}) {
    Error e = parse_error(Options{{"proto_version", big}, {"publication_names", "p"}});
    EXPECT_EQ(e.sqlstate, "22023") << big;
    EXPECT_EQ(e.message, std::string("proto_version \"") + big + "\" out of range");
  }
  Error no_value =
      parse_error(Options{{"proto_version", std::nullopt}, {"publication_names", "p"}});
  EXPECT_EQ(no_value.message, "proto_version requires a parameter");
}

TEST(PgoutputOptions, RequiredOptions) {
  Error no_proto = parse_error(Options{{"publication_names", "p"}});
  EXPECT_EQ(no_proto.sqlstate, "22023");
  EXPECT_EQ(no_proto.message, "proto_version option missing");
  EXPECT_NE(no_proto.hint.find("proto_version '4'"), std::string::npos) << no_proto.hint;

  Error no_pub = parse_error(Options{{"proto_version", "1"}});
  EXPECT_EQ(no_pub.sqlstate, "22023");
  EXPECT_EQ(no_pub.message, "publication_names parameter missing");
  EXPECT_FALSE(no_pub.hint.empty());

  EXPECT_EQ(parse_error(Options{}).message, "proto_version option missing");
  Error no_value =
      parse_error(Options{{"proto_version", "1"}, {"publication_names", std::nullopt}});
  EXPECT_EQ(no_value.message, "publication_names requires a parameter");

  // An empty list parses (SplitIdentifierString allows it) but startup refuses it.
  for (const char* empty : {"", "   "}) {
    Options opts{{"proto_version", "1"}, {"publication_names", empty}};
    EXPECT_TRUE(parse_ok(opts).publication_names.empty());
    Error e = startup_error(opts);
    EXPECT_EQ(e.sqlstate, "22023");
    EXPECT_EQ(e.message, "publication_names parameter missing");
  }
}

TEST(PgoutputOptions, UnknownOption) {
  Error e = parse_error(with(base(), {"include-xids", "0"}));
  EXPECT_EQ(e.sqlstate, "XX000");
  EXPECT_EQ(e.message, "unrecognized pgoutput option: include-xids");
  EXPECT_NE(e.hint.find("publication_names"), std::string::npos);
  // Options are checked in order, before the required-option checks.
  EXPECT_EQ(parse_error(Options{{"bogus", std::nullopt}}).message,
            "unrecognized pgoutput option: bogus");
  // Names are matched exactly: the grammar already downcased unquoted ones.
  EXPECT_EQ(parse_error(with(base(), {"Binary", "on"})).message,
            "unrecognized pgoutput option: Binary");
}

TEST(PgoutputOptions, PublicationNamesFollowSplitIdentifierString) {
  auto names = [](const char* text) {
    return parse_ok(Options{{"proto_version", "1"}, {"publication_names", text}}).publication_names;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names("a, b ,c"), (V{"a", "b", "c"}));
  EXPECT_EQ(names("\t a\n,\rb \f"), (V{"a", "b"}));
  EXPECT_EQ(names("MyPub"), (V{"mypub"}));
  EXPECT_EQ(names("\"MyPub\""), (V{"MyPub"}));
  EXPECT_EQ(names("\"My Pub\", other"), (V{"My Pub", "other"}));
  EXPECT_EQ(names("\"a,b\""), (V{"a,b"}));
  EXPECT_EQ(names("\"a\"\"b\""), (V{"a\"b"}));
  EXPECT_EQ(names("\"\""), (V{""}));      // an empty quoted name is accepted
  EXPECT_EQ(names("a\"b"), (V{"a\"b"}));  // a quote inside an unquoted name is just a byte
  EXPECT_EQ(names("\"a\",\"a\""), (V{"a", "a"}));
  EXPECT_EQ(names(std::string(70, 'P').c_str()), (V{std::string(63, 'p')}));
  EXPECT_EQ(names(("\"" + std::string(62, 'x') + "\xC3\xA9\"").c_str()), (V{std::string(62, 'x')}));

  for (const char* bad :
       {"a,,b", "a,", ",a", "\"a", "\"a\"b", "a b", "a, b c", "\"a\" \"b\"", "a\",", " , "}) {
    Error e = parse_error(Options{{"proto_version", "1"}, {"publication_names", bad}});
    EXPECT_EQ(e.sqlstate, "42602") << bad;
    EXPECT_EQ(e.message, "invalid publication_names syntax") << bad;
    EXPECT_FALSE(e.hint.empty());
  }
}

TEST(PgoutputOptions, SplitIdentifierStringSeparator) {
  EXPECT_EQ(split_identifier_string("a;B", ';'), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(split_identifier_string("a,b", ';'), (std::vector<std::string>{"a,b"}));
  EXPECT_FALSE(split_identifier_string("a;;b", ';').has_value());
  EXPECT_EQ(split_identifier_string("").value().size(), 0u);
}

TEST(PgoutputOptions, StartupVersionChecks) {
  auto opts = [](const char* version) {
    return Options{{"proto_version", version}, {"publication_names", "p"}};
  };
  Error high = startup_error(opts("5"));
  EXPECT_EQ(high.sqlstate, "0A000");
  EXPECT_EQ(high.message,
            "client sent proto_version=5 but server only supports protocol 4 or lower");
  EXPECT_NE(high.hint.find("proto_version '4'"), std::string::npos);

  Error capped = startup_error(opts("4"), /*server_max=*/3);
  EXPECT_EQ(capped.message,
            "client sent proto_version=4 but server only supports protocol 3 or lower");

  // %d of a uint32, as Postgres prints it.
  EXPECT_EQ(startup_error(opts("4294967295")).message,
            "client sent proto_version=-1 but server only supports protocol 4 or lower");

  Error low = startup_error(opts("0"));
  EXPECT_EQ(low.sqlstate, "0A000");
  EXPECT_EQ(low.message,
            "client sent proto_version=0 but server only supports protocol 1 or higher");
  EXPECT_EQ(startup_error(opts("")).message, low.message);

  for (const char* v : {"1", "2", "3", "4"}) {
    EXPECT_TRUE(pgoutput_options_for_start(opts(v)).ok()) << v;
  }
}

TEST(PgoutputOptions, StartupFeatureChecks) {
  auto opts = [](const char* version, PluginOption extra) {
    return Options{{"proto_version", version}, {"publication_names", "p"}, std::move(extra)};
  };
  Error stream = startup_error(opts("1", {"streaming", "on"}));
  EXPECT_EQ(stream.sqlstate, "22023");
  EXPECT_EQ(stream.message,
            "requested proto_version=1 does not support streaming, need 2 or higher");
  EXPECT_NE(stream.hint.find("proto_version '2'"), std::string::npos);

  Error parallel = startup_error(opts("3", {"streaming", "parallel"}));
  EXPECT_EQ(parallel.sqlstate, "22023");
  EXPECT_EQ(parallel.message,
            "requested proto_version=3 does not support parallel streaming, need 4 or higher");
  EXPECT_NE(parallel.hint.find("proto_version '4'"), std::string::npos);
  EXPECT_EQ(startup_error(opts("1", {"streaming", "parallel"})).message,
            "requested proto_version=1 does not support parallel streaming, need 4 or higher");

  Error two_phase = startup_error(opts("2", {"two_phase", "on"}));
  EXPECT_EQ(two_phase.sqlstate, "22023");
  EXPECT_EQ(two_phase.message,
            "requested proto_version=2 does not support two-phase commit, need 3 or higher");
  EXPECT_NE(two_phase.hint.find("proto_version '3'"), std::string::npos);

  EXPECT_TRUE(pgoutput_options_for_start(opts("2", {"streaming", "on"})).ok());
  EXPECT_TRUE(pgoutput_options_for_start(opts("1", {"streaming", "off"})).ok());
  EXPECT_TRUE(pgoutput_options_for_start(opts("1", {"two_phase", "off"})).ok());
  EXPECT_TRUE(pgoutput_options_for_start(opts("3", {"two_phase", std::nullopt})).ok());
  EXPECT_TRUE(pgoutput_options_for_start(opts("4", {"streaming", "parallel"})).ok());
  EXPECT_TRUE(pgoutput_options_for_start(opts("1", {"binary", "on"})).ok());
  EXPECT_TRUE(pgoutput_options_for_start(opts("1", {"origin", "none"})).ok());
}

TEST(PgoutputOptions, ParseErrorsComeBeforeStartupChecks) {
  // A bad later option wins over a too-high version, as parse_output_parameters runs first.
  Error e = startup_error(
      Options{{"proto_version", "9"}, {"publication_names", "p"}, {"binary", "maybe"}});
  EXPECT_EQ(e.message, "binary requires a Boolean value");
}

}  // namespace
}  // namespace pgrelay::pgoutput
