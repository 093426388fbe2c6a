// `pgrelay capture install | uninstall`: set up or remove capture (trigger or native) in an
// upstream database.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "base/strings.h"
#include "base/thread_name.h"
#include "capture/native/native_setup.h"
#include "capture/trigger/installer.h"
#include "cli/admin_commands.h"
#include "upstream/upstream_config.h"
#include "upstream/virtual_catalog.h"

namespace pgrelay::cli {
namespace {

struct CaptureOptions {
  std::string upstream;
  std::string schema = "_pgrelay";
  std::vector<std::string> publications;
  bool all_publications = false;
  std::vector<std::string> tables;
  std::string ddl = "auto";
  std::string data_dir = "./pgrelay-data";
  bool force = false;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The first value of a one-row result as a number; 0 when there is none.
long count_of(const Result<capture::QueryResult>& r) {
  if (!r.ok() || r->rows() == 0 || r->is_null(0, 0)) return 0;
  return std::atol(std::string(r->value(0, 0)).c_str());
}

// Install and uninstall run in one upstream transaction whose work is invisible until it
// commits, so progress is read from the outside: the tables on which the installing backend
// holds the lock that CREATE/DROP TRIGGER takes (ShareRowExclusiveLock or stronger). A
// second connection polls pg_locks and prints a line now and then while the work lasts.
class ProgressReporter {
 public:
  ProgressReporter(std::string conninfo, int backend_pid, std::string schema, long total,
                   std::string what)
      : conninfo_(std::move(conninfo)),
        backend_pid_(backend_pid),
        schema_(std::move(schema)),
        total_(total),
        what_(std::move(what)),
        start_(Clock::now()) {
    thread_ = start_named_thread("install-report", [this] { loop(); });
  }
  ~ProgressReporter() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Whether a progress line was printed (the work took long enough).
  bool printed() const { return printed_; }

 private:
  // Quiet for short work; then a line every few seconds.
  static constexpr auto kFirstLine = std::chrono::seconds(1);
  static constexpr auto kInterval = std::chrono::seconds(3);

  bool sleep_for(Clock::duration d) {
    std::unique_lock lock(mu_);
    return !cv_.wait_for(lock, d, [this] { return stopping_; });
  }

  void loop() {
    if (!sleep_for(kFirstLine)) return;
    auto session = capture::PgSession::connect(conninfo_);
    if (!session.ok()) return;  // progress is a courtesy: the work itself goes on
    do {
      auto locked = (*session)->exec(
          "SELECT pg_catalog.count(DISTINCT l.relation) FROM pg_catalog.pg_locks l "
          "JOIN pg_catalog.pg_class c ON c.oid = l.relation "
          "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
          "WHERE l.pid = $1::int4 AND l.locktype = 'relation' AND l.granted AND c.relkind = 'r' "
          "AND l.mode IN ('ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock') "
          "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname <> $2",
          {std::to_string(backend_pid_), schema_});
      if (!locked.ok()) return;
      const long done = count_of(locked);
      if (done >= total_) {
        // The rest of the transaction: layouts, cleanup, commit.
        std::fprintf(stderr, "pgrelay: %s all %ld tables; finishing (%.0f s)\n", what_.c_str(),
                     total_, seconds_since(start_));
      } else {
        std::fprintf(stderr, "pgrelay: %s %ld of %ld tables so far (%.0f s)\n", what_.c_str(), done,
                     total_, seconds_since(start_));
      }
      printed_ = true;
    } while (sleep_for(kInterval));
  }

  std::string conninfo_;
  int backend_pid_;
  std::string schema_;
  long total_;
  std::string what_;
  Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<bool> printed_{false};
  std::thread thread_;
};

// The upstream's text form of an array of names, for $n::text[] parameters.
std::string text_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char c : items[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

Result<capture::TableName> parse_table(const std::string& text) {
  auto dot = text.find('.');
  capture::TableName t;
  if (dot == std::string::npos) {
    t.schema = "public";
    t.name = text;
  } else {
    t.schema = text.substr(0, dot);
    t.name = text.substr(dot + 1);
  }
  if (t.schema.empty() || t.name.empty() || t.name.find('.') != std::string::npos) {
    return Error::make(sqlstate::kInvalidParameterValue, "invalid --table \"" + text + "\"",
                       "Write SCHEMA.TABLE, or TABLE for a table of schema public.");
  }
  return t;
}

struct Upstream {
  upstream::UpstreamConfig config;
  std::string conninfo;
  std::unique_ptr<capture::PgSession> session;
};

Result<Upstream> connect_upstream(const std::string& url) {
  Upstream u;
  auto config = upstream::UpstreamConfig::parse(url);
  if (!config.ok()) return config.error();
  u.config = *config;
  u.conninfo = config->conninfo() + " application_name='pgrelay capture'";
  auto session = capture::PgSession::connect(u.conninfo);
  if (!session.ok()) {
    Error e = session.error();
    e.message = "could not connect to the upstream " + config->describe() + ": " +
                admin::connect_failure(e);
    if (e.hint.empty()) e.hint = "Check --upstream: a libpq URL or conninfo of the database.";
    return e;
  }
  u.session = std::move(*session);
  return u;
}

int run_install(const CaptureOptions& options) {
  capture::InstallOptions install;
  install.schema = options.schema;
  install.publications = options.publications;
  install.all_publications = options.all_publications;
  for (const auto& text : options.tables) {
    auto t = parse_table(text);
    if (!t.ok()) return admin::fail(t.error(), 2);
    install.tables.push_back(*t);
  }
  // What a server needs, and what pgrelay serve installs itself.
  const bool defaulted =
      install.publications.empty() && install.tables.empty() && !install.all_publications;
  if (defaulted) install.all_publications = true;
  if (options.ddl == "auto") {
    install.ddl = capture::DdlTracking::kAuto;
  } else if (options.ddl == "event-trigger") {
    install.ddl = capture::DdlTracking::kEventTrigger;
  } else {
    install.ddl = capture::DdlTracking::kPolling;
  }

  auto up = connect_upstream(options.upstream);
  if (!up.ok()) return admin::fail(up.error());
  capture::PgSession& s = *up->session;

  // The tables the sources name now, for the progress lines (an estimate: overlaps between
  // --table and publications count twice).
  long total = static_cast<long>(install.tables.size());
  if (install.all_publications || !install.publications.empty()) {
    total +=
        count_of(s.exec("SELECT pg_catalog.count(*) FROM (SELECT DISTINCT schemaname, tablename "
                        "FROM pg_catalog.pg_publication_tables WHERE schemaname <> $1 "
                        "AND ($2::bool OR pubname = ANY ($3::text[]))) t",
                        {options.schema, install.all_publications ? "true" : "false",
                         text_array(install.publications)}));
  }

  std::fprintf(stderr, "pgrelay: installing trigger capture in schema \"%s\" of %s/%s (%ld %s)\n",
               options.schema.c_str(), up->config.describe().c_str(), up->config.dbname.c_str(),
               total, total == 1 ? "table" : "tables");
  const auto start = Clock::now();
  Result<capture::InstallReport> report = Error{};
  {
    ProgressReporter progress(up->conninfo, PQbackendPID(s.raw()), options.schema, total,
                              "capture install: triggers created on");
    report = capture::install(s, install);
  }
  if (!report.ok()) return admin::fail(report.error());
  const double took = seconds_since(start);

  auto schema = s.ident(options.schema);
  if (!schema.ok()) return admin::fail(schema.error());
  auto captured =
      s.exec("SELECT n.nspname, c.relname, k.ins, k.upd, k.del, k.trunc FROM " + *schema +
             ".captured k JOIN pg_catalog.pg_class c ON c.oid = k.relid "
             "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace ORDER BY 1, 2");
  if (!captured.ok()) return admin::fail(captured.error());

  std::printf("trigger capture installed in schema \"%s\" of database \"%s\" on %s (%.1f s)\n",
              options.schema.c_str(), up->config.dbname.c_str(), up->config.describe().c_str(),
              took);
  std::printf("schema:        %s\n",
              report->created_schema
                  ? "created by pgrelay (capture uninstall drops it with everything in it)"
                  : "existing (capture uninstall removes pgrelay's objects from it, and the "
                    "schema itself only if nothing else is left)");
  std::string sources;
  if (install.all_publications) {
    sources = "every publication, present and future";
    if (defaulted) sources += " (the default, as pgrelay serve captures)";
  }
  for (const auto& p : install.publications) {
    sources += (sources.empty() ? "publication " : ", publication ") + p;
  }
  for (const auto& t : install.tables) {
    sources += (sources.empty() ? "table " : ", table ") + t.schema + "." + t.name;
  }
  std::printf("sources:       %s\n", sources.c_str());
  if (report->event_trigger) {
    std::printf(
        "DDL tracking:  event trigger \"%s_ddl\": table layouts are recorded inside each DDL's "
        "own transaction (exact; new tables of captured publications are captured from their "
        "first row)\n",
        options.schema.c_str());
  } else {
    std::printf(
        "DDL tracking:  polling: pgrelay serve re-reads table layouts on an interval (not "
        "superuser, or --ddl polling); rows written between an ALTER TABLE and the next "
        "sync may go out with the previous layout, see the documentation\n");
  }
  std::printf("time zone:     %s (timestamptz values are printed in the server's default)\n",
              report->timezone.c_str());
  std::printf("\nCaptured tables (%d)\n", report->captured_tables);
  std::vector<std::vector<std::string>> rows;
  auto flag = [](std::string_view v) { return std::string(v == "t" ? "t" : "f"); };
  for (int i = 0; i < captured->rows(); ++i) {
    rows.push_back({std::string(captured->value(i, 0)), std::string(captured->value(i, 1)),
                    flag(captured->value(i, 2)), flag(captured->value(i, 3)),
                    flag(captured->value(i, 4)), flag(captured->value(i, 5))});
  }
  admin::print_table(std::cout, {"schema", "table", "insert", "update", "delete", "truncate"},
                     rows);
  if (report->captured_tables == 0) {
    admin::print_warning("no table is captured yet",
                         "Create a publication (CREATE PUBLICATION p FOR TABLE ...): with every "
                         "publication as source, its tables are captured from then on.");
  }
  return 0;
}

// Objects pgrelay creates in its schema: trigger capture's (installer.cc) and the virtual
// catalog's (virtual_catalog.cc), plus capture_<oid>, one trigger function per table.
constexpr const char* kOwnRelations =
    "{changes,captured,layouts,sources,wakeup,meta,publication_state,catalog_meta,catalog_slots,"
    "catalog_walsenders,catalog_server,catalog_settings,catalog_requests,pg_replication_slots,"
    "pg_stat_replication,pg_settings,pg_publication_tables}";
constexpr const char* kOwnFunctions =
    "{current_layout,remove_table,refresh_table,wanted_tables,sync,truncate_begin,truncate_end,"
    "capture_truncate,emit_message,on_ddl,current_setting,pg_current_wal_lsn,"
    "pg_current_wal_insert_lsn,pg_current_wal_flush_lsn,catalog_create_slot,"
    "pg_create_logical_replication_slot,pg_drop_replication_slot,catalog_terminate_walsender,"
    "pg_terminate_backend,note_publications,publications_fingerprint,publications_catalog,"
    "native_mirror,"
    "native_on_ddl,catalog_setting,catalog_log_head,pg_get_publication_tables,catalog_caller,"
    "catalog_check_slot_permissions,catalog_drop_slot,catalog_walsender_role,"
    "catalog_create_slot_checked,catalog_drop_slot_checked,catalog_terminate_walsender_checked,"
    "relay_create_logical_replication_slot,relay_drop_replication_slot,relay_terminate_backend,"
    "denied_create_logical_replication_slot,denied_drop_replication_slot,"
    "denied_terminate_backend,catalog_is_walsender_pid,dump_pg_namespace,dump_pg_trigger,dump_pg_"
    "event_trigger,"
    "dump_pg_publication,dump_pg_publication_rel,dump_pg_publication_namespace}";

// Objects of the schema that pgrelay did not create (sequences and indexes belonging to a
// table, and row and array types, go with their owners and are not listed).
Result<std::vector<std::string>> foreign_objects(capture::PgSession& s, const std::string& schema) {
  auto r = s.exec(
      "SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) "
      "FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_namespace n ON n.oid = d.refobjid "
      "WHERE d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass "
      "AND n.nspname = $1 AND d.deptype = 'n' "
      "AND NOT (d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND ("
      "  (SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid = d.objid) = ANY ($2::text[])"
      "  OR EXISTS (SELECT 1 FROM pg_catalog.pg_depend o WHERE o.classid = d.classid "
      "    AND o.objid = d.objid AND o.refclassid = d.classid AND o.deptype IN ('a', 'i'))))"
      "AND NOT (d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND ("
      "  (SELECT p.proname FROM pg_catalog.pg_proc p WHERE p.oid = d.objid) = ANY ($3::text[])"
      "  OR (SELECT p.proname FROM pg_catalog.pg_proc p WHERE p.oid = d.objid) "
      "     ~ '^capture_[0-9]+$'))"
      "AND NOT (d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND EXISTS ("
      "  SELECT 1 FROM pg_catalog.pg_type t WHERE t.oid = d.objid "
      "  AND (t.typrelid <> 0 OR t.typelem <> 0))) "
      "ORDER BY 1",
      {schema, kOwnRelations, kOwnFunctions});
  if (!r.ok()) return r.error();
  std::vector<std::string> out;
  for (int i = 0; i < r->rows(); ++i) out.emplace_back(r->value(i, 0));
  return out;
}

int run_uninstall(const CaptureOptions& options) {
  // A server capturing through this schema would fail at its next poll, and whatever the
  // upstream writes until capture is back never reaches its consumers.
  auto server = admin::probe_server(options.data_dir);
  if (!server.ok()) return admin::fail(server.error());
  if (server->running && !options.force) {
    return admin::fail(Error::make(
        sqlstate::kObjectInUse,
        "pgrelay serve (pid " + std::to_string(server->pid) + ") is running on data directory \"" +
            options.data_dir + "\"",
        "Stop it first: while capture is uninstalled its consumers miss every change the "
        "upstream makes. Pass --force to uninstall anyway."));
  }

  auto up = connect_upstream(options.upstream);
  if (!up.ok()) return admin::fail(up.error());
  capture::PgSession& s = *up->session;
  auto schema = s.ident(options.schema);
  if (!schema.ok()) return admin::fail(schema.error());

  // Other sessions whose last statement used the schema: a pgrelay serve elsewhere, or its
  // clients (pgrelay rewrites catalog queries to it). Only a warning: it is a guess.
  auto others = s.exec(
      "SELECT pg_catalog.count(*), pg_catalog.string_agg(a.pid::text, ', ' ORDER BY a.pid) "
      "FROM pg_catalog.pg_stat_activity a WHERE a.pid <> pg_catalog.pg_backend_pid() "
      "AND a.datname = pg_catalog.current_database() AND pg_catalog.strpos(a.query, $1) > 0",
      {options.schema});
  if (count_of(others) > 0) {
    admin::print_warning("upstream sessions (pids " + std::string(others->value(0, 1)) +
                             ") last ran statements " + "naming schema \"" + options.schema +
                             "\": a pgrelay serve may still be using it",
                         "Stop every pgrelay serve of this database before uninstalling capture.");
  }

  auto state = s.exec(
      "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1), "
      "pg_catalog.to_regclass($2) IS NOT NULL, pg_catalog.to_regclass($3) IS NOT NULL, "
      "EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = $4)",
      {options.schema, *schema + ".meta", *schema + ".catalog_meta", options.schema + "_ddl"});
  if (!state.ok()) return admin::fail(state.error());
  const bool schema_existed = state->value(0, 0) == "t";
  const bool had_capture = state->value(0, 1) == "t";
  const bool had_catalog = state->value(0, 2) == "t";
  const bool had_event_trigger = state->value(0, 3) == "t";
  auto native = capture::native_capture_installed(s, options.schema);
  if (!native.ok()) return admin::fail(native.error());
  const bool had_native = *native;
  if (!schema_existed || (!had_capture && !had_catalog && !had_native)) {
    std::printf(
        "nothing to uninstall: schema \"%s\" of database \"%s\" on %s holds no pgrelay "
        "objects%s\n",
        options.schema.c_str(), up->config.dbname.c_str(), up->config.describe().c_str(),
        schema_existed ? "" : " (it does not exist)");
    return 0;
  }
  long captured = 0;
  bool created_schema = false;
  if (had_capture) {
    captured = count_of(s.exec("SELECT pg_catalog.count(*) FROM " + *schema + ".captured"));
    auto created = s.exec("SELECT value FROM " + *schema + ".meta WHERE key = 'created_schema'");
    created_schema = created.ok() && created->rows() > 0 && created->value(0, 0) == "true";
  }
  auto foreign = foreign_objects(s, options.schema);
  if (!foreign.ok()) return admin::fail(foreign.error());
  // Capture drops a schema it created with everything in it.
  if (created_schema && !foreign->empty() && !options.force) {
    return admin::fail(Error::make(
        "2BP01", "schema \"" + options.schema + "\" holds objects pgrelay did not create",
        "Move them elsewhere (ALTER ... SET SCHEMA) or drop them, then uninstall again; "
        "--force drops them with the schema.",
        join(*foreign)));
  }

  const auto start = Clock::now();
  if (had_capture) {
    std::fprintf(stderr, "pgrelay: removing trigger capture from %ld %s in schema \"%s\"\n",
                 captured, captured == 1 ? "table" : "tables", options.schema.c_str());
    ProgressReporter progress(up->conninfo, PQbackendPID(s.raw()), options.schema, captured,
                              "capture uninstall: triggers removed from");
    if (auto st = capture::uninstall(s, options.schema); !st.ok()) return admin::fail(st.error());
  }
  std::vector<std::string> native_slots;
  if (had_native) {
    auto removed = capture::uninstall_native_capture(s, options.schema);
    if (!removed.ok()) return admin::fail(removed.error());
    native_slots = std::move(*removed);
  }
  // The virtual catalog (pgrelay serve's pg_replication_slots and friends) lives in the same
  // schema; it drops the schema when nothing else is left in it.
  auto catalog = upstream::VirtualCatalog::open(up->conninfo, options.schema);
  if (!catalog.ok()) return admin::fail(catalog.error());
  if (auto st = (*catalog)->uninstall(); !st.ok()) return admin::fail(st.error());
  const double took = seconds_since(start);

  auto left = s.exec("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1", {options.schema});
  if (!left.ok()) return admin::fail(left.error());
  std::printf("pgrelay uninstalled from schema \"%s\" of database \"%s\" on %s (%.1f s)\n",
              options.schema.c_str(), up->config.dbname.c_str(), up->config.describe().c_str(),
              took);
  if (had_capture) {
    std::printf(
        "trigger capture: removed (triggers and functions of %ld %s, change table, "
        "layouts%s)\n",
        captured, captured == 1 ? "table" : "tables",
        had_event_trigger ? (", event trigger \"" + options.schema + "_ddl\"").c_str() : "");
  }
  if (had_native) {
    const std::string slots = join(native_slots);
    std::printf("native capture: removed (publications \"%s\" and \"%s\", upstream slots: %s)\n",
                capture::capture_publication(options.schema).c_str(),
                capture::keyless_capture_publication(options.schema).c_str(),
                slots.empty() ? "none inactive" : slots.c_str());
  }
  if (had_catalog) {
    std::printf(
        "virtual catalog: removed (pg_replication_slots, pg_stat_replication, "
        "pg_settings and the slot functions pgrelay serve answers with)\n");
  }
  if (left->rows() == 0) {
    std::printf("schema \"%s\": dropped\n", options.schema.c_str());
  } else {
    auto kept = foreign_objects(s, options.schema);
    std::printf("schema \"%s\": kept%s%s\n", options.schema.c_str(),
                kept.ok() && !kept->empty() ? ", it holds objects pgrelay did not create: " : "",
                kept.ok() ? join(*kept).c_str() : "");
  }
  std::printf(
      "The change log and slots in the data directory are kept. Changes the upstream "
      "makes from now on are not captured until pgrelay serve (or capture install) "
      "installs capture again.\n");
  return 0;
}

}  // namespace

Subcommand add_capture_command(CLI::App& parent) {
  auto options = std::make_shared<CaptureOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "capture",
      "Install or remove trigger capture in the upstream database. pgrelay serve installs it\n"
      "by itself at start; these commands let an operator do it ahead of time (for instance\n"
      "as the owner of the tables, during a maintenance window) or remove every trace of\n"
      "pgrelay from a database.");
  cmd->require_subcommand(1);

  CLI::App* install = cmd->add_subcommand(
      "install",
      "Create, in one transaction, the schema's change table and layouts, and on every\n"
      "captured table statement-level triggers that record its row changes. Running it\n"
      "again brings the installation in line with the options given. Needs no superuser:\n"
      "owning the tables (and CREATE on the database or the schema) suffices; as superuser\n"
      "an event trigger also tracks DDL exactly. Prints the captured tables.");
  install
      ->add_option("--upstream,-u", options->upstream,
                   "The upstream database, as a libpq URL or conninfo string")
      ->required();
  install->add_option("--schema", options->schema, "Upstream schema for pgrelay's objects")
      ->capture_default_str();
  auto* pubs = install->add_option(
      "--publication,-p", options->publications,
      "Capture the tables of this publication, for the operations it publishes; repeatable");
  install
      ->add_flag("--all-publications", options->all_publications,
                 "Capture the tables of every publication, including publications created\n"
                 "later (the default when neither --publication nor --table is given)")
      ->excludes(pubs);
  install->add_option("--table,-t", options->tables,
                      "Also capture this table (SCHEMA.TABLE; unqualified means public) for "
                      "every operation; repeatable");
  install
      ->add_option("--ddl", options->ddl,
                   "How table changes (ALTER TABLE) are followed: auto (an event trigger when\n"
                   "the role is superuser, polling otherwise), event-trigger, or polling")
      ->check(CLI::IsMember({"auto", "event-trigger", "polling"}))
      ->capture_default_str();

  CLI::App* uninstall = cmd->add_subcommand(
      "uninstall",
      "Remove everything pgrelay created in the upstream schema: the capture triggers and\n"
      "functions of every captured table, the change table, the event trigger, and the\n"
      "virtual catalog pgrelay serve keeps there; then the schema itself unless it holds\n"
      "objects pgrelay did not create. Changes made upstream afterwards are not captured.\n"
      "Refused while pgrelay serve runs on --data-dir.");
  uninstall
      ->add_option("--upstream,-u", options->upstream,
                   "The upstream database, as a libpq URL or conninfo string")
      ->required();
  uninstall->add_option("--schema", options->schema, "Upstream schema of pgrelay's objects")
      ->capture_default_str();
  uninstall
      ->add_option("-D,--data-dir", options->data_dir,
                   "Data directory of the pgrelay serve that captures from this upstream: "
                   "uninstall is refused while it runs")
      ->capture_default_str();
  uninstall->add_flag("--force", options->force,
                      "Uninstall even while that server runs, and drop objects pgrelay did not\n"
                      "create with a schema pgrelay created");

  return Subcommand{cmd, [options, install] {
                      return install->parsed() ? run_install(*options) : run_uninstall(*options);
                    }};
}

}  // namespace pgrelay::cli
