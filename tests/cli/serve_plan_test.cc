// Tests that `pgrelay serve` checks its options before anything starts, and what each error says.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "../unit/log_test_util.h"
#include "cli/serve_plan.h"
#include "wire/scram.h"

namespace pgrelay::cli {
namespace {

Error plan_error(const ServeOptions& options) {
  auto plan = plan_serve(options);
  EXPECT_FALSE(plan.ok());
  return plan.ok() ? Error{} : plan.error();
}

TEST(ServePlan, TheDefaultsPlanTheLoopbackListenerWithoutMetrics) {
  auto plan = plan_serve(ServeOptions{});
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  EXPECT_EQ(plan->listen, std::make_pair(std::string("127.0.0.1"), 5433));
  EXPECT_FALSE(plan->metrics.has_value());
  EXPECT_FALSE(plan->upstream.has_value());  // the private PostgreSQL
  EXPECT_FALSE(plan->users.has_value());     // the upstream's user
  EXPECT_TRUE(plan->auth_rules.empty());
}

TEST(ServePlan, ReadsTheUpstreamUsersRulesAndMetricsAddress) {
  ServeOptions options;
  options.listen = "[::1]:6000";
  options.upstream = "postgres://app@db.example:5432/shop";
  auto secret = wire::ScramVerifier::from_password("a password");
  ASSERT_TRUE(secret.ok());
  options.users = {"alice " + secret->to_string() + " replication", "# a comment"};
  options.auth_rules = {"10.0.0.0/8=scram-sha-256", "192.168.0.0/16=trust", "127.0.0.1/32=trust",
                        "::1/128=trust"};
  options.metrics = "127.0.0.1:9187";
  auto plan = plan_serve(options);
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  EXPECT_EQ(plan->listen, std::make_pair(std::string("::1"), 6000));
  ASSERT_TRUE(plan->upstream.has_value());
  EXPECT_EQ(plan->upstream->dbname, "shop");
  ASSERT_TRUE(plan->users.has_value());
  ASSERT_EQ(plan->users->size(), 1u);
  EXPECT_EQ((*plan->users)[0].name, "alice");
  EXPECT_TRUE((*plan->users)[0].replication);
  // The last rule given applies first; trust beyond loopback is noted for a warning.
  ASSERT_EQ(plan->auth_rules.size(), 4u);
  EXPECT_EQ(plan->auth_rules[3].method, server::AuthMethod::kScram);
  EXPECT_EQ(plan->trusting_rules, std::vector<std::string>{"192.168.0.0/16=trust"});
  EXPECT_EQ(plan->metrics, std::make_optional(std::make_pair(std::string("127.0.0.1"), 9187)));
}

TEST(ServePlan, NatsOptionsPlanThePublisher) {
  ServeOptions options;
  options.nats = {"127.0.0.1:4222", "tls://n2.example:4222"};
  options.nats_stream = "CDC";
  options.nats_subject_prefix = "acme.cdc";
  options.nats_user = "pub";
  options.nats_password = "secret";
  options.nats_nkey = "UABC:/dev/null";
  auto plan = plan_serve(options);
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  ASSERT_TRUE(plan->nats.has_value());
  EXPECT_EQ(plan->nats->connect.urls,
            (std::vector<std::string>{"nats://127.0.0.1:4222", "tls://n2.example:4222"}));
  EXPECT_EQ(plan->nats->stream, "CDC");
  EXPECT_EQ(plan->nats->subject_prefix, "acme.cdc");
  EXPECT_EQ(plan->nats->connect.password, "secret");
  EXPECT_EQ(plan->nats->connect.nkey_public, "UABC");
  EXPECT_EQ(plan->nats->connect.nkey_seed_file, "/dev/null");
  EXPECT_FALSE(plan_serve(ServeOptions{})->nats.has_value());
}

TEST(ServePlan, EachBadNatsOptionIsNamedWithItsFix) {
  auto with = [](auto change) {
    ServeOptions options;
    options.nats = {"nats://127.0.0.1:4222"};
    change(options);
    return plan_error(options);
  };
  Error scheme = with([](ServeOptions& o) { o.nats = {"http://u:hidden@h:1"}; });
  EXPECT_EQ(scheme.message, "--nats: http://u:xxxxx@h:1 is not a NATS URL");  // no password
  EXPECT_NE(scheme.hint.find("nats://HOST:PORT"), std::string::npos);
  EXPECT_NE(with([](ServeOptions& o) { o.nats_stream = "a.b"; }).message.find("--nats-stream"),
            std::string::npos);
  EXPECT_NE(with([](ServeOptions& o) { o.nats_subject_prefix = "a..b"; }).hint.find("tokens"),
            std::string::npos);
  EXPECT_NE(
      with([](ServeOptions& o) { o.nats_nkey = "UABC"; }).message.find("PUBLIC_KEY:SEED_FILE"),
      std::string::npos);
  EXPECT_NE(
      with([](ServeOptions& o) { o.nats_tls_cert = "/dev/null"; }).message.find("go together"),
      std::string::npos);
  Error missing = with([](ServeOptions& o) { o.nats_creds = "/nonexistent/x.creds"; });
  EXPECT_NE(missing.message.find("--nats-creds: cannot read /nonexistent/x.creds"),
            std::string::npos);
  EXPECT_EQ(missing.sqlstate, sqlstate::kInvalidParameterValue);
}

TEST(ServePlan, FollowPlansAFollowerOfTheUpstreamDatabase) {
  ServeOptions options;
  options.follow = {"127.0.0.1:4222"};
  options.upstream = "postgres://u:p@127.0.0.1:5432/app";
  auto plan = plan_serve(options);
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  ASSERT_TRUE(plan->follow.has_value());
  EXPECT_EQ(plan->follow->database, "app");
  EXPECT_EQ(plan->follow->connect.urls, std::vector<std::string>{"nats://127.0.0.1:4222"});
  EXPECT_EQ(plan->follow->stream, "PGRELAY");
  EXPECT_EQ(plan->follow->subject_prefix, "pgrelay");
  EXPECT_EQ(plan->follow->connect.name, "pgrelay follower");
  EXPECT_FALSE(plan->nats.has_value());  // a follower publishes nothing
  ASSERT_TRUE(plan->upstream.has_value());
  EXPECT_EQ(plan->upstream->dbname, "app");
  EXPECT_FALSE(plan_serve(ServeOptions{})->follow.has_value());
}

TEST(ServePlan, AFollowerWithoutUpstreamFollowsItsDatabaseWithItsOwnUsers) {
  ServeOptions options;
  options.follow = {"127.0.0.1:4222"};
  options.databases = {"shop"};
  options.users = {"rep md5d41d8cd98f00b204e9800998ecf8427e replication"};
  options.data_dir = "/var/lib/pgrelay";
  auto plan = plan_serve(options);
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  EXPECT_FALSE(plan->upstream.has_value());
  ASSERT_TRUE(plan->follow.has_value());
  EXPECT_EQ(plan->follow->database, "shop");
  EXPECT_EQ(plan->follow->facts_dir, "/var/lib/pgrelay");
  ASSERT_TRUE(plan->users.has_value());
  EXPECT_EQ(plan->users->front().name, "rep");
}

TEST(ServePlan, FollowTakesTheNatsOptions) {
  ServeOptions options;
  options.follow = {"nats://n1.example:4222", "tls://n2.example:4222"};
  options.upstream = "postgres://u@db.example/shop";
  options.nats_stream = "CDC";
  options.nats_subject_prefix = "acme.cdc";
  options.nats_user = "reader";
  options.nats_password = "secret";
  auto plan = plan_serve(options);
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  ASSERT_TRUE(plan->follow.has_value());
  EXPECT_EQ(plan->follow->connect.urls,
            (std::vector<std::string>{"nats://n1.example:4222", "tls://n2.example:4222"}));
  EXPECT_EQ(plan->follow->stream, "CDC");
  EXPECT_EQ(plan->follow->subject_prefix, "acme.cdc");
  EXPECT_EQ(plan->follow->connect.user, "reader");
  EXPECT_EQ(plan->follow->connect.password, "secret");
  EXPECT_EQ(plan->follow->database, "shop");
  EXPECT_FALSE(plan->nats.has_value());
}

TEST(ServePlan, EachBadFollowOptionIsNamedWithItsFix) {
  auto with = [](auto change) {
    ServeOptions options;
    options.follow = {"127.0.0.1:4222"};
    options.upstream = "postgres://u:p@127.0.0.1:5432/app";
    change(options);
    return plan_error(options);
  };
  Error upstream = with([](ServeOptions& o) { o.upstream.clear(); });
  EXPECT_EQ(upstream.sqlstate, sqlstate::kInvalidParameterValue);
  EXPECT_EQ(upstream.message, "--follow without --upstream needs --database NAME");
  EXPECT_NE(upstream.hint.find("--upstream URL"), std::string::npos) << upstream.hint;

  Error users = with([](ServeOptions& o) {
    o.upstream.clear();
    o.databases = {"app"};
  });
  EXPECT_EQ(users.message, "--follow without --upstream needs --users or --user");
  EXPECT_NE(users.hint.find("pgrelay hash-password"), std::string::npos) << users.hint;

  Error two = with([](ServeOptions& o) {
    o.upstream.clear();
    o.databases = {"app", "other"};
  });
  EXPECT_EQ(two.message, "--follow without --upstream needs --database NAME");

  Error database = with([](ServeOptions& o) { o.databases = {"other"}; });
  EXPECT_EQ(database.message, "--database does not apply to a follower with --upstream");

  Error nats = with([](ServeOptions& o) { o.nats = {"127.0.0.1:4222"}; });
  EXPECT_EQ(nats.sqlstate, sqlstate::kInvalidParameterValue);
  EXPECT_NE(nats.message.find("--nats"), std::string::npos) << nats.message;

  Error capture = with([](ServeOptions& o) { o.capture = "native"; });
  EXPECT_EQ(capture.sqlstate, sqlstate::kInvalidParameterValue);
  EXPECT_NE(capture.message.find("--capture"), std::string::npos) << capture.message;

  Error scheme = with([](ServeOptions& o) { o.follow = {"http://x"}; });
  EXPECT_EQ(scheme.sqlstate, sqlstate::kInvalidParameterValue);
  EXPECT_NE(scheme.message.find("--follow"), std::string::npos) << scheme.message;
  EXPECT_EQ(scheme.message.find("--nats"), std::string::npos) << scheme.message;
  EXPECT_NE(scheme.hint.find("nats://HOST:PORT"), std::string::npos);

  Error none = with([](ServeOptions& o) { o.follow = {""}; });
  EXPECT_NE(none.message.find("--follow names no server"), std::string::npos) << none.message;

  EXPECT_NE(with([](ServeOptions& o) { o.nats_stream = "a.b"; }).message.find("--nats-stream"),
            std::string::npos);
  EXPECT_NE(with([](ServeOptions& o) {
              o.nats_subject_prefix = "a..b";
            }).message.find("--nats-subject-prefix"),
            std::string::npos);
}

// An app directory as npm leaves it: node_modules/@rocicorp/zero with its package.json and
// the zero-cache script it names.
void install_fake_zero(const std::string& app) {
  const std::string dir = app + "/node_modules/@rocicorp/zero";
  std::filesystem::create_directories(dir + "/out/zero/src");
  std::ofstream(dir + "/package.json") << R"({"name": "@rocicorp/zero", "version": "1.9.0",
            "bin": {"zero-cache": "./out/zero/src/cli.js", "zero-build-schema": "./x.js"},
            "engines": {"node": ">=22"}})";
  std::ofstream(dir + "/out/zero/src/cli.js") << "// zero-cache\n";
}

TEST(ServePlan, ZeroFindsTheAppsZeroCacheFromBelowAndReadsItsDotenv) {
  log::testing::TempDir app;
  install_fake_zero(app.path());
  std::filesystem::create_directories(app.path() + "/src/components");
  std::ofstream(app.path() + "/src/components/.env") << "ZERO_PORT=4900\nexport OTHER='x'\n";
  ServeOptions options;
  options.zero = true;
  auto plan = plan_serve(options, app.path() + "/src/components", "/nonexistent:/bin:/usr/bin");
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  ASSERT_TRUE(plan->zero.has_value());
  EXPECT_EQ(plan->zero->package.dir, app.path() + "/node_modules/@rocicorp/zero");
  EXPECT_EQ(plan->zero->package.entry,
            app.path() + "/node_modules/@rocicorp/zero/out/zero/src/cli.js");
  EXPECT_EQ(plan->zero->package.version, "1.9.0");
  EXPECT_EQ(plan->zero->package.node_engine, ">=22");
  EXPECT_EQ(plan->zero->dotenv,
            (std::map<std::string, std::string>{{"ZERO_PORT", "4900"}, {"OTHER", "x"}}));
  EXPECT_EQ(plan->zero->port, 4900);
  // The environment's ZERO_PORT wins over .env's, as zero-cache will see it.
  plan = plan_serve(options, app.path() + "/src/components", "/nonexistent:/bin:/usr/bin",
                    {"PATH=/bin", "ZERO_PORT=5001"});
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  EXPECT_EQ(plan->zero->port, 5001);
  EXPECT_FALSE(plan_serve(ServeOptions{})->zero.has_value());

  // --zero-cache: the package's directory, or an app's; --node: that binary.
  log::testing::TempDir elsewhere;
  options.zero_cache = app.path() + "/node_modules/@rocicorp/zero";
  options.node = "/bin/sh";
  plan = plan_serve(options, elsewhere.path(), "");
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  EXPECT_EQ(plan->zero->node, "/bin/sh");
  EXPECT_TRUE(plan->zero->dotenv.empty());
  options.zero_cache = app.path();
  plan = plan_serve(options, elsewhere.path(), "");
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  EXPECT_EQ(plan->zero->package.dir, app.path() + "/node_modules/@rocicorp/zero");
}

TEST(ServePlan, ABadZeroPortStopsBeforeAnythingStarts) {
  log::testing::TempDir app;
  install_fake_zero(app.path());
  ServeOptions options;
  options.zero = true;
  options.node = "/bin/sh";
  for (const char* bad : {"0", "65536", "48x", "-1", "port"}) {
    std::ofstream(app.path() + "/.env") << "ZERO_PORT=" << bad << "\n";
    auto from_dotenv = plan_serve(options, app.path(), "");
    ASSERT_FALSE(from_dotenv.ok()) << bad;
    EXPECT_EQ(from_dotenv.error().sqlstate, sqlstate::kInvalidParameterValue);
    EXPECT_NE(from_dotenv.error().message.find(std::string("ZERO_PORT=") + bad), std::string::npos);
    EXPECT_NE(from_dotenv.error().hint.find("free TCP port"), std::string::npos);
  }
  std::ofstream(app.path() + "/.env") << "ZERO_PORT=4900\n";
  auto from_environment = plan_serve(options, app.path(), "", {"ZERO_PORT=99999"});
  ASSERT_FALSE(from_environment.ok());
  EXPECT_NE(from_environment.error().message.find("ZERO_PORT=99999"), std::string::npos);
  auto unset = plan_serve(options, app.path(), "", {"ZERO_PORT="});
  ASSERT_TRUE(unset.ok()) << unset.error().to_string();
}

TEST(ServePlan, EachBadZeroSettingIsNamedWithItsFix) {
  log::testing::TempDir app;
  ServeOptions options;
  options.zero = true;
  options.node = "/bin/sh";
  auto missing = plan_serve(options, app.path(), "");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().sqlstate, sqlstate::kUndefinedFile);
  EXPECT_NE(missing.error().message.find("zero-cache is not installed"), std::string::npos);
  EXPECT_NE(missing.error().message.find(app.path()), std::string::npos);
  EXPECT_NE(missing.error().hint.find("npm install @rocicorp/zero"), std::string::npos);
  EXPECT_NE(missing.error().hint.find("--zero-cache"), std::string::npos);

  options.zero_cache = app.path() + "/nowhere";
  auto given = plan_serve(options, app.path(), "");
  ASSERT_FALSE(given.ok());
  EXPECT_NE(given.error().message.find("--zero-cache " + app.path() + "/nowhere"),
            std::string::npos);
  EXPECT_NE(given.error().hint.find("npm install @rocicorp/zero"), std::string::npos);
  options.zero_cache.clear();

  install_fake_zero(app.path());
  options.node.clear();
  auto no_node = plan_serve(options, app.path(), "/nonexistent");
  ASSERT_FALSE(no_node.ok());
  EXPECT_NE(no_node.error().message.find("no node on PATH"), std::string::npos);
  EXPECT_NE(no_node.error().hint.find("--node"), std::string::npos);
  options.node = app.path() + "/not-a-node";
  auto bad_node = plan_serve(options, app.path(), "");
  ASSERT_FALSE(bad_node.ok());
  EXPECT_NE(bad_node.error().message.find("--node " + app.path() + "/not-a-node"),
            std::string::npos);
  options.node = "/bin/sh";

  std::ofstream(app.path() + "/.env") << "ZERO_PORT=1\nthis is not a variable\n";
  auto dotenv = plan_serve(options, app.path(), "");
  ASSERT_FALSE(dotenv.ok());
  EXPECT_NE(dotenv.error().message.find(app.path() + "/.env, line 2"), std::string::npos)
      << dotenv.error().message;
  std::filesystem::remove(app.path() + "/.env");

  std::ofstream(app.path() + "/node_modules/@rocicorp/zero/package.json")
      << "{\"name\": \"other\"}";
  auto foreign = plan_serve(options, app.path(), "");
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.error().message.find("is not @rocicorp/zero's"), std::string::npos);
  install_fake_zero(app.path());

  options.upstream = "postgres://u@db/app";
  auto upstream = plan_serve(options, app.path(), "");
  ASSERT_FALSE(upstream.ok());
  EXPECT_NE(upstream.error().message.find("--upstream does not apply"), std::string::npos);
}

TEST(ServePlan, TheAdminPageIsLoopbackUnlessItHasAToken) {
  ServeOptions options;
  EXPECT_FALSE(plan_serve(options)->admin.has_value());  // off by default
  options.admin = "127.0.0.1:6477";
  EXPECT_EQ(plan_serve(options)->admin, std::make_pair(std::string("127.0.0.1"), 6477));
  options.admin = "7000";
  EXPECT_EQ(plan_serve(options)->admin, std::make_pair(std::string("127.0.0.1"), 7000));
  options.admin = "off";
  EXPECT_FALSE(plan_serve(options)->admin.has_value());

  options.admin = "0.0.0.0:6477";
  Error open = plan_error(options);
  EXPECT_EQ(open.sqlstate, sqlstate::kInvalidParameterValue);
  EXPECT_NE(open.message.find("--admin 0.0.0.0:6477"), std::string::npos) << open.message;
  EXPECT_NE(open.hint.find("--admin-token"), std::string::npos) << open.hint;
  options.admin_token = "s3cret";
  EXPECT_EQ(plan_serve(options)->admin, std::make_pair(std::string("0.0.0.0"), 6477));

  options.admin = "localhost:99999";
  Error bad = plan_error(options);
  EXPECT_NE(bad.message.find("invalid --admin value"), std::string::npos) << bad.message;
  EXPECT_NE(bad.hint.find("HOST:PORT"), std::string::npos);
}

TEST(ServePlan, EachBadOptionIsNamedWithItsFix) {
  ServeOptions listen;
  listen.listen = "localhost:99999";
  Error e = plan_error(listen);
  EXPECT_EQ(e.sqlstate, sqlstate::kInvalidParameterValue);
  EXPECT_NE(e.message.find("--listen"), std::string::npos) << e.message;
  EXPECT_NE(e.hint.find("HOST:PORT"), std::string::npos);

  ServeOptions both;
  both.upstream = "postgres://app@db.example/shop";
  both.databases = {"extra"};
  e = plan_error(both);
  EXPECT_NE(e.message.find("--database"), std::string::npos) << e.message;
  EXPECT_NE(e.hint.find("CREATE DATABASE"), std::string::npos);

  ServeOptions user;
  user.users = {"bob plaintext-password"};
  e = plan_error(user);
  EXPECT_NE(e.message.find("--user"), std::string::npos) << e.message;
  EXPECT_NE(e.hint.find("hash-password"), std::string::npos);
  EXPECT_EQ(e.message.find("plaintext-password"), std::string::npos);  // never repeated back

  ServeOptions rule;
  rule.auth_rules = {"10.0.0.0/8"};
  e = plan_error(rule);
  EXPECT_NE(e.message.find("--auth rule"), std::string::npos) << e.message;
  EXPECT_NE(e.hint.find("ADDRESS/PREFIX=METHOD"), std::string::npos);

  ServeOptions method;
  method.auth_rules = {"10.0.0.0/8=kerberos"};
  EXPECT_FALSE(plan_serve(method).ok());

  ServeOptions metrics;
  metrics.metrics = "nowhere";
  EXPECT_FALSE(plan_serve(metrics).ok());

  ServeOptions file;
  file.users_file = "/nonexistent/users";
  e = plan_error(file);
  EXPECT_NE(e.message.find("/nonexistent/users"), std::string::npos) << e.message;
}

TEST(ServeCommand, ABadOptionEndsItWithStatusTwoBeforeAnythingStarts) {
  log::testing::TempDir dir;
  const std::string data_dir = dir.path() + "/data";
  const std::string cmd = std::string(PGRELAY_BINARY) + " serve --data-dir " + data_dir +
                          " --metrics nowhere >/dev/null 2>" + dir.path() + "/stderr.txt";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  // No private PostgreSQL was made, no pid file taken: the options were checked first.
  EXPECT_FALSE(std::filesystem::exists(data_dir));
  std::ifstream err(dir.path() + "/stderr.txt");
  const std::string text((std::istreambuf_iterator<char>(err)), {});
  EXPECT_NE(text.find("metrics"), std::string::npos) << text;
}

}  // namespace
}  // namespace pgrelay::cli
