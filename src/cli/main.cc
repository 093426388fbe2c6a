// The pgrelay command line: parses arguments and dispatches to subcommands.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/version.h"

int main(int argc, char** argv) {
  CLI::App app{
      "pgrelay - a PostgreSQL logical-replication server.\n\n"
      "pgrelay stands in front of an upstream PostgreSQL, captures its row changes into a\n"
      "durable, LSN-ordered change log, and serves them to unmodified consumers over the\n"
      "genuine replication protocol (pgoutput v1-v4), while ordinary sessions pass through.\n\n"
      "This build contains the protocol codecs only; the server commands arrive in later\n"
      "releases.",
      "pgrelay"};
  app.set_version_flag("-V,--version", std::string("pgrelay ") + PGRELAY_VERSION);
  app.footer("Report bugs and read the documentation in the project's README.md.");
  CLI11_PARSE(app, argc, argv);
  std::printf("%s", app.help().c_str());
  return 0;
}
