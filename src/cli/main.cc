// The pgrelay command line: parses arguments and dispatches to subcommands.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/admin_commands.h"
#include "cli/doctor_command.h"
#include "cli/dump_commands.h"
#include "cli/log_commands.h"
#include "cli/recv_command.h"
#include "cli/serve_command.h"
#include "cli/version.h"

namespace {

// `pgrelay [OPTIONS]` is `pgrelay serve [OPTIONS]`, and --config (or PGRELAY_CONFIG) may be
// given anywhere: CLI11 reads a config file only for options placed before the subcommand.
std::vector<std::string> normalize_arguments(int argc, char** argv, const CLI::App& app) {
  std::vector<std::string> rest;
  std::string config;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (arg.rfind("--config=", 0) == 0) {
      config = arg.substr(9);
    } else {
      rest.push_back(std::move(arg));
    }
  }
  if (config.empty()) {
    if (const char* env = std::getenv("PGRELAY_CONFIG")) config = env;
  }
  bool help_or_version = !rest.empty() && (rest[0] == "-h" || rest[0] == "--help" ||
                                           rest[0] == "-V" || rest[0] == "--version");
  bool names_subcommand = false;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (!rest.empty() && sub->check_name(rest[0])) names_subcommand = true;
  }
  if (!help_or_version && !names_subcommand) rest.insert(rest.begin(), "serve");
  std::vector<std::string> args{argv[0]};
  if (!config.empty()) {
    args.emplace_back("--config");
    args.push_back(config);
  }
  args.insert(args.end(), rest.begin(), rest.end());
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "pgrelay - a PostgreSQL logical-replication server.\n\n"
      "pgrelay stands in front of an upstream PostgreSQL, captures its row changes into a\n"
      "durable, LSN-ordered change log, and serves them to unmodified consumers over the\n"
      "genuine replication protocol (pgoutput v1-v4), while ordinary sessions pass through.\n"
      "`pgrelay` alone (or with serve's options) is `pgrelay serve` on a private PostgreSQL\n"
      "it starts in ./pgrelay-data/pg.",
      "pgrelay"};
  app.set_version_flag("-V,--version", std::string("pgrelay ") + PGRELAY_VERSION);
  app.footer("Report bugs and read the documentation in the project's README.md.");
  app.require_subcommand(0, 1);
  app.set_config("--config", "",
                 "TOML file of settings: a [serve] table of `option = value` lines (also "
                 "PGRELAY_CONFIG)");
  app.allow_config_extras(CLI::config_extras_mode::error);

  std::vector<pgrelay::cli::Subcommand> commands;
  commands.push_back(pgrelay::cli::add_serve_command(app));
  commands.push_back(pgrelay::cli::add_zero_command(app));

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
  dump_cmd
      ->add_option("--data-dir,-D", dump_options.data_dir,
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
  commands.push_back({dump_cmd, [&] { return pgrelay::cli::run_log_dump(dump_options); }});

  pgrelay::cli::LogStatOptions stat_options;
  stat_options.data_dir = "./pgrelay-data";
  CLI::App* stat_cmd = log_cmd->add_subcommand(
      "stat",
      "Print the change log's statistics: segments, size, oldest and newest LSN, and "
      "each replication slot's position and lag in bytes and seconds.");
  stat_cmd
      ->add_option("--data-dir,-D", stat_options.data_dir,
                   "Data directory of pgrelay (its change log is DIR/log)")
      ->capture_default_str();
  stat_cmd->add_flag("--json", stat_options.json, "Print one JSON object instead of text");
  commands.push_back({stat_cmd, [&] { return pgrelay::cli::run_log_stat(stat_options); }});

  commands.push_back(pgrelay::cli::add_recv_command(app));
  commands.push_back(pgrelay::cli::add_doctor_command(app));
  commands.push_back(pgrelay::cli::add_status_command(app));
  commands.push_back(pgrelay::cli::add_slots_command(app));
  commands.push_back(pgrelay::cli::add_dump_command(app));
  commands.push_back(pgrelay::cli::add_restore_command(app));
  commands.push_back(pgrelay::cli::add_capture_command(app));
  commands.push_back(pgrelay::cli::add_hash_password_command(app));

  std::vector<std::string> args = normalize_arguments(argc, argv, app);
  std::vector<char*> arg_pointers;
  for (auto& arg : args) arg_pointers.push_back(arg.data());
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::ConfigError& error) {
    std::fprintf(
        stderr,
        "pgrelay: error: in the config file: %s\n"
        "pgrelay: hint: settings go in a [serve] table, one `name = value` per line, "
        "named as the options of `pgrelay serve --help` (e.g. data-dir = \"/srv/pgrelay\")\n",
        error.what());
    return 2;
  } catch (const CLI::ParseError& error) {
    // --help and --version exit 0; a usage error exits 2, as for the commands' own usage
    // errors (CLI11's codes would say nothing to a shell).
    return app.exit(error) == 0 ? 0 : 2;
  }
  for (const auto& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  std::printf("%s", app.help().c_str());
  return 0;
}
