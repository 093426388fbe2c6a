// The pgrelay command line: parses arguments and dispatches to subcommands.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/log_commands.h"
#include "cli/version.h"

int main(int argc, char** argv) {
  CLI::App app{
      "pgrelay - a PostgreSQL logical-replication server.\n\n"
      "pgrelay stands in front of an upstream PostgreSQL, captures its row changes into a\n"
      "durable, LSN-ordered change log, and serves them to unmodified consumers over the\n"
      "genuine replication protocol (pgoutput v1-v4), while ordinary sessions pass through.\n\n"
      "This build has the protocol codecs and the change log; the capture and the server\n"
      "commands arrive in later releases.",
      "pgrelay"};
  app.set_version_flag("-V,--version", std::string("pgrelay ") + PGRELAY_VERSION);
  app.footer("Report bugs and read the documentation in the project's README.md.");
  app.require_subcommand(0, 1);

  CLI::App* log_cmd = app.add_subcommand("log", "Inspect pgrelay's durable change log.");
  log_cmd->require_subcommand(1);

  pgrelay::cli::LogDumpOptions dump_options;
  dump_options.data_dir = "./pgrelay-data";
  CLI::App* dump_cmd = log_cmd->add_subcommand(
      "dump",
      "Print the change log as JSON lines: for each transaction a \"begin\" line, one line per\n"
      "change (relation, insert, update, delete, truncate, logical_message) and a \"commit\"\n"
      "line; a non-transactional message is one \"message\" line. Values are Postgres's text\n"
      "output; NULL is null; an unchanged TOASTed value is {\"unchanged_toast\": true}.\n"
      "Safe to run while pgrelay serve uses the same directory.");
  dump_cmd->add_option("--data-dir,-D", dump_options.data_dir,
                       "Data directory of pgrelay (its change log is DIR/log)")
      ->capture_default_str();
  auto* from = dump_cmd->add_option(
      "--from", dump_options.from_lsn,
      "Start at this LSN (e.g. 0/16B3748): transactions committed before it are skipped, as "
      "START_REPLICATION does");
  dump_cmd
      ->add_option("--since", dump_options.since,
                   "Start at the first transaction committed at or after this time "
                   "(e.g. 2026-11-29T17:30:00Z; UTC unless a zone is given)")
      ->excludes(from);
  dump_cmd->add_option("--table,-t", dump_options.tables,
                       "Only changes of this table (schema.table, unqualified means public); "
                       "repeatable");

  pgrelay::cli::LogStatOptions stat_options;
  stat_options.data_dir = "./pgrelay-data";
  CLI::App* stat_cmd = log_cmd->add_subcommand(
      "stat", "Print the change log's statistics: segments, size, oldest and newest LSN, and "
              "each replication slot's position and lag in bytes and seconds.");
  stat_cmd->add_option("--data-dir,-D", stat_options.data_dir,
                       "Data directory of pgrelay (its change log is DIR/log)")
      ->capture_default_str();
  stat_cmd->add_flag("--json", stat_options.json, "Print one JSON object instead of text");

  CLI11_PARSE(app, argc, argv);
  if (dump_cmd->parsed()) return pgrelay::cli::run_log_dump(dump_options);
  if (stat_cmd->parsed()) return pgrelay::cli::run_log_stat(stat_options);
  std::printf("%s", app.help().c_str());
  return 0;
}
