// The upstream URL: what pgrelay takes from it, hands on to libpq, or refuses by name.
#include <gtest/gtest.h>

#include <string>

#include <libpq-fe.h>

#include "upstream/upstream_config.h"

namespace pgrelay::upstream {
namespace {

TEST(UpstreamConfig, HandsBehaviourParametersOnToLibpqQuotedAndAfterItsOwn) {
  auto config = UpstreamConfig::parse(
      "postgres://app:secret@db.example.com:6543/appdb?sslmode=require&application_name=my%20app"
      "&connect_timeout=7&options=-c%20statement_timeout%3D0&keepalives_idle=30"
      "&target_session_attrs=read-write");
  ASSERT_TRUE(config.ok()) << config.error().to_string();
  EXPECT_EQ(config->host, "db.example.com");
  EXPECT_EQ(config->port, 6543);
  EXPECT_EQ(config->sslmode, SslMode::kRequire);
  const std::string conninfo = config->conninfo();
  for (const char* expected :
       {"application_name='my app'", "connect_timeout='7'", "options='-c statement_timeout=0'",
        "keepalives_idle='30'", "target_session_attrs='read-write'"}) {
    EXPECT_NE(conninfo.find(expected), std::string::npos) << expected << " in " << conninfo;
  }
  // The user's application_name comes after pgrelay's fallback, so libpq takes the user's.
  EXPECT_LT(conninfo.find("fallback_application_name=pgrelay"),
            conninfo.find("application_name='my app'"));
  // What libpq makes of it is what was given.
  char* err = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &err);
  ASSERT_NE(parsed, nullptr) << (err ? err : "");
  std::string options, application_name;
  for (PQconninfoOption* o = parsed; o->keyword; ++o) {
    if (o->val && std::string(o->keyword) == "options") options = o->val;
    if (o->val && std::string(o->keyword) == "application_name") application_name = o->val;
  }
  PQconninfoFree(parsed);
  EXPECT_EQ(options, "-c statement_timeout=0");
  EXPECT_EQ(application_name, "my app");
}

TEST(UpstreamConfig, AParameterPgrelayCannotHonourIsRefusedByName) {
  struct Case {
    const char* url;
    const char* named;
  } cases[] = {
      {"postgres://u:p@h/db?sslmode=verify-full&sslcert=/c.crt&sslkey=/c.key", "\"sslcert\""},
      {"postgres://u:p@h/db?sslcrl=/crl.pem", "\"sslcrl\""},
      {"postgres://u:p@h/db?channel_binding=require", "\"channel_binding=require\""},
      {"postgres://u:p@h/db?gssencmode=require", "\"gssencmode=require\""},
      {"postgres://u:p@h/db?ssl_min_protocol_version=TLSv1.3", "\"ssl_min_protocol_version\""},
      {"host=h dbname=db passfile=/p", "\"passfile\""},
      {"postgres://u:p@h/db?client_encoding=LATIN1", "\"client_encoding\""},
      {"postgres://u:p@h/db?replication=database", "\"replication\""},
  };
  for (const Case& c : cases) {
    auto config = UpstreamConfig::parse(c.url);
    ASSERT_FALSE(config.ok()) << c.url;
    EXPECT_EQ(config.error().sqlstate, "0A000") << c.url;
    EXPECT_NE(config.error().message.find(c.named), std::string::npos) << config.error().message;
    EXPECT_FALSE(config.error().hint.empty()) << c.url;
  }
  // The values that describe what pgrelay does anyway are taken.
  for (const char* url : {"postgres://u:p@h/db?channel_binding=prefer",
                          "postgres://u:p@h/db?gssencmode=disable&sslsni=1"}) {
    auto config = UpstreamConfig::parse(url);
    EXPECT_TRUE(config.ok()) << url << ": " << (config.ok() ? "" : config.error().to_string());
  }
}

}  // namespace
}  // namespace pgrelay::upstream
