// `pgrelay doctor`: checks an upstream PostgreSQL and says what works and how to fix the rest.
#include "cli/doctor_command.h"

#include <libpq-fe.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "cli/doctor_checks.h"
#include "cli/doctor_facts.h"
#include "upstream/upstream_config.h"

namespace pgrelay::cli {
namespace {

using doctor::Check;
using doctor::Report;
using doctor::Verdict;

constexpr std::string_view kMask = "********";

// Hides passwords in text that may echo the connection string (libpq's parse errors quote it):
// every known password, and whatever stands between "user:" and "@" after "://" or after
// "password=".
class Redactor {
 public:
  // Short secrets would mask ordinary words; the structural rules below still hide them.
  void add_secret(std::string secret) {
    if (secret.size() >= 4) secrets_.push_back(std::move(secret));
  }

  // The password as written in a connection string that libpq could not parse (its error may
  // quote just that token): whatever follows "user:" up to "@" in a URL, or "password=".
  void add_written_secrets(const std::string& url) {
    const std::size_t scheme = url.find("://");
    if (scheme != std::string::npos) {
      const std::size_t at = url.find('@', scheme + 3);
      const std::size_t colon = url.find(':', scheme + 3);
      if (at != std::string::npos && colon < at && url.find('/', scheme + 3) > at) {
        std::string secret = url.substr(colon + 1, at - colon - 1);
        if (!secret.empty()) secrets_.push_back(std::move(secret));
      }
    }
    for (std::size_t key = url.find("password="); key != std::string::npos;
         key = url.find("password=", key + 1)) {
      std::size_t end = url.find_first_of(" &", key + 9);
      std::string secret = url.substr(key + 9, end == std::string::npos ? end : end - key - 9);
      if (!secret.empty() && secret.front() == '\'') secret.erase(0, 1);
      if (!secret.empty() && secret.back() == '\'') secret.pop_back();
      if (!secret.empty()) secrets_.push_back(std::move(secret));
    }
  }

  std::string operator()(std::string text) const {
    for (const std::string& s : secrets_) {
      for (std::size_t at = text.find(s); at != std::string::npos; at = text.find(s, at)) {
        text.replace(at, s.size(), kMask);
        at += kMask.size();
      }
    }
    // postgres://user:secret@host
    for (std::size_t scheme = text.find("://"); scheme != std::string::npos;
         scheme = text.find("://", scheme + 3)) {
      const std::size_t start = scheme + 3;
      const std::size_t at = text.find_first_of("@/ \"'\n", start);
      if (at == std::string::npos || text[at] != '@') continue;
      const std::size_t colon = text.find(':', start);
      if (colon != std::string::npos && colon < at) {
        text.replace(colon + 1, at - colon - 1, kMask);
      }
    }
    // password=secret or password='se cret'
    for (std::size_t key = text.find("password="); key != std::string::npos;
         key = text.find("password=", key + 1)) {
      const std::size_t start = key + 9;
      std::size_t end = start;
      if (end < text.size() && text[end] == '\'') {
        end = text.find('\'', end + 1);
        end = end == std::string::npos ? text.size() : end + 1;
      } else {
        while (end < text.size() && text[end] != ' ' && text[end] != '&' && text[end] != '"' &&
               text[end] != '\n') {
          ++end;
        }
      }
      text.replace(start, end - start, kMask);
    }
    return text;
  }

 private:
  std::vector<std::string> secrets_;
};

bool is_connection_string(const std::string& s) {
  return s.find('=') != std::string::npos || s.rfind("postgres://", 0) == 0 ||
         s.rfind("postgresql://", 0) == 0;
}

std::string text_of(const char* s) {
  return s != nullptr ? s : "";
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

using ConnPtr = std::unique_ptr<PGconn, decltype(&PQfinish)>;

ConnPtr connect(const std::string& url) {
  std::vector<const char*> keys;
  std::vector<const char*> values;
  // Before dbname, so that the URL (and PGCONNECT_TIMEOUT) take precedence.
  if (std::getenv("PGCONNECT_TIMEOUT") == nullptr) {
    keys.push_back("connect_timeout");
    values.push_back("10");
  }
  keys.push_back("fallback_application_name");
  values.push_back("pgrelay doctor");
  if (!url.empty()) {
    keys.push_back("dbname");
    values.push_back(url.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  return ConnPtr(PQconnectdbParams(keys.data(), values.data(), 1), &PQfinish);
}

std::string target_of(PGconn* conn) {
  return text_of(PQuser(conn)) + "@" + text_of(PQhost(conn)) + ":" + text_of(PQport(conn)) + "/" +
         text_of(PQdb(conn));
}

const char* json_status(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kWarn:
      return "warn";
    case Verdict::kFail:
      return "fail";
    case Verdict::kSkip:
      return "skip";
  }
  return "?";
}

void print_json(const Report& report, const Redactor& redact) {
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  nlohmann::ordered_json counts = {{"ok", 0}, {"warn", 0}, {"fail", 0}, {"skip", 0}};
  for (const Check& c : report.checks) {
    nlohmann::ordered_json fixes = nlohmann::ordered_json::array();
    for (const auto& f : c.fixes) {
      nlohmann::ordered_json lines = nlohmann::ordered_json::array();
      for (const auto& l : f.lines) lines.push_back(redact(l));
      fixes.push_back({{"how", redact(f.how)}, {"lines", lines}});
    }
    nlohmann::ordered_json details = nlohmann::ordered_json::array();
    for (const auto& d : c.details) details.push_back(redact(d));
    checks.push_back({{"name", c.name},
                      {"status", json_status(c.verdict)},
                      {"summary", redact(c.summary)},
                      {"details", details},
                      {"fixes", fixes}});
    counts[json_status(c.verdict)] = counts[json_status(c.verdict)].get<int>() + 1;
  }
  nlohmann::ordered_json out = {{"target", redact(report.target)},
                                {"connected", report.connected},
                                {"server_version", report.server_version},
                                {"can_serve", report.exit_status() == 0},
                                {"exit_status", report.exit_status()},
                                {"counts", counts},
                                {"checks", checks}};
  std::printf("%s\n",
              out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
}

void print_text(const Report& report, const Redactor& redact) {
  std::printf(
      "pgrelay doctor: %s%s\n\n", redact(report.target).c_str(),
      report.server_version.empty() ? "" : (", PostgreSQL " + report.server_version).c_str());
  int warnings = 0;
  int failures = 0;
  for (const Check& c : report.checks) {
    if (c.verdict == Verdict::kWarn) ++warnings;
    if (c.verdict == Verdict::kFail) ++failures;
    std::printf("%-5s %s: %s\n", doctor::to_string(c.verdict), c.name.c_str(),
                redact(c.summary).c_str());
    for (const auto& d : c.details) std::printf("      %s\n", redact(d).c_str());
    for (const auto& f : c.fixes) {
      std::printf("      To fix, %s%s\n", redact(f.how).c_str(), f.lines.empty() ? "." : ":");
      for (const auto& l : f.lines) std::printf("        %s\n", redact(l).c_str());
    }
  }
  std::printf("\n");
  if (!report.connected) {
    std::printf("Could not connect; nothing else was checked.\n");
  } else if (failures > 0) {
    std::printf("pgrelay cannot serve this upstream until %s fixed.\n",
                failures == 1 ? "the failure above is" : "the failures above are");
  } else if (warnings > 0) {
    std::printf("pgrelay can serve this upstream with trigger capture (%d %s above).\n", warnings,
                warnings == 1 ? "warning" : "warnings");
  } else {
    std::printf("pgrelay can serve this upstream with trigger capture.\n");
  }
}

void print_report(const Report& report, const DoctorOptions& options, const Redactor& redact) {
  if (options.json) {
    print_json(report, redact);
  } else {
    print_text(report, redact);
  }
  std::fflush(stdout);
}

}  // namespace

int run_doctor(const DoctorOptions& options) {
  Redactor redact;
  redact.add_secret(text_of(std::getenv("PGPASSWORD")));
  if (options.schema.empty() || options.schema.find_first_of("$'%") != std::string::npos) {
    std::fprintf(stderr,
                 "pgrelay doctor: invalid schema name \"%s\": it must be non-empty and must not "
                 "contain $, ' or %%\n",
                 options.schema.c_str());
    return 2;
  }
  if (is_connection_string(options.url)) {
    char* error = nullptr;
    PQconninfoOption* parsed = PQconninfoParse(options.url.c_str(), &error);
    if (parsed == nullptr) {
      redact.add_written_secrets(options.url);
      std::fprintf(stderr, "pgrelay doctor: invalid connection string: %s\n",
                   redact(trim(text_of(error))).c_str());
      PQfreemem(error);
      return 2;
    }
    for (PQconninfoOption* o = parsed; o->keyword != nullptr; ++o) {
      if (std::string_view(o->keyword) == "password" && o->val != nullptr) {
        redact.add_secret(o->val);
      }
    }
    PQconninfoFree(parsed);
    // A parameter `pgrelay serve` would refuse is this URL's first problem.
    auto config = upstream::UpstreamConfig::parse(options.url);
    if (!config.ok() && config.error().sqlstate == sqlstate::kFeatureNotSupported) {
      std::fprintf(stderr, "pgrelay doctor: %s\nHINT: %s\n", redact(config.error().message).c_str(),
                   redact(config.error().hint).c_str());
      return 2;
    }
  }

  ConnPtr conn = connect(options.url);
  if (!conn) {
    std::fprintf(stderr, "pgrelay doctor: out of memory\n");
    return 2;
  }
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    Report report =
        doctor::connection_failed(target_of(conn.get()), redact(trim(PQerrorMessage(conn.get()))));
    print_report(report, options, redact);
    return report.exit_status();
  }
  PQsetNoticeProcessor(
      conn.get(), [](void*, const char*) {}, nullptr);
  // Catalog reads take no locks that could wait long, but a stuck server should not hang us.
  PQclear(PQexec(conn.get(), "SET statement_timeout = '30s'"));

  auto facts = doctor::probe(conn.get(), options.schema);
  if (!facts.ok()) {
    std::fprintf(stderr, "pgrelay doctor: could not inspect the upstream: %s\n",
                 redact(facts.error().message).c_str());
    return 2;
  }
  facts->capture_databases = options.capture_databases;
  Report report = doctor::evaluate(*facts);
  print_report(report, options, redact);
  return report.exit_status();
}

Subcommand add_doctor_command(CLI::App& parent) {
  auto options = std::make_shared<DoctorOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "doctor",
      "Check an upstream PostgreSQL for pgrelay and say what works and what to change.\n\n"
      "pgrelay doctor connects as pgrelay serve would and, without changing anything, checks\n"
      "the server version, whether it is a writable primary, TLS, wal_level, the role's rights\n"
      "(superuser, REPLICATION, CREATE on the database, its schema), DDL tracking, the\n"
      "publications and their tables (trigger privileges, replica identity, row filters and\n"
      "column lists, FOR ALL TABLES seen by other consumers), pg_hba.conf, and the settings\n"
      "capture depends on. Each check prints OK, WARN, FAIL or SKIP with one line of\n"
      "explanation; one that is not OK also prints the exact fix: the SQL to run, the\n"
      "postgresql.conf or pg_hba.conf line to write, and whether a reload or a restart\n"
      "follows.");
  cmd->add_option("URL", options->url,
                  "The upstream: a libpq URL or conninfo string, e.g.\n"
                  "postgres://app@db.example.com/app?sslmode=verify-full\n"
                  "Missing parts come from PGHOST, PGPORT, PGUSER,\n"
                  "PGDATABASE, PGPASSWORD, PGSSLMODE and ~/.pgpass, as\n"
                  "in psql. Passwords are never printed.");
  cmd->add_option("--schema", options->schema,
                  "Upstream schema of pgrelay's capture tables and\n"
                  "catalog views (serve's --schema)")
      ->capture_default_str();
  cmd->add_option("--capture-database", options->capture_databases,
                  "The databases serve captures besides the URL's\n"
                  "(serve's --capture-database; '*' is every one)")
      ->delimiter(',')
      ->allow_extra_args(false)  // one value (or comma list) per use: the URL stays the URL
      ->capture_default_str();
  cmd->add_flag("--json", options->json,
                "Print one JSON object: target, exit_status, counts\n"
                "and the checks (name, status, summary, details,\n"
                "fixes)");
  cmd->footer(
      "Exit status: 0 if pgrelay can serve the upstream (warnings may remain), 1 if a check\n"
      "failed, 2 on a usage error or when the connection failed.");
  return Subcommand{cmd, [options] { return run_doctor(*options); }};
}

}  // namespace pgrelay::cli
