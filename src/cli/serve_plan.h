// What `pgrelay serve`'s options ask for, checked before any part starts.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/result.h"
#include "capture/follower/stream_follower.h"
#include "cli/serve_command.h"
#include "nats/publisher.h"
#include "server/auth.h"
#include "upstream/upstream_config.h"
#include "zero/zero_cache_package.h"

namespace pgrelay::cli {

struct ServePlan {
  // --upstream, parsed; nullopt: pgrelay's private PostgreSQL, whose address comes once it runs.
  std::optional<upstream::UpstreamConfig> upstream;
  std::pair<std::string, int> listen;                  // host, port
  std::optional<std::pair<std::string, int>> metrics;  // --metrics; nullopt: off
  std::optional<std::pair<std::string, int>> admin;    // --admin; nullopt: off
  // pgrelay's own users (--users, --user); nullopt: the upstream's user and password.
  std::optional<std::vector<server::User>> users;
  // --auth rules, in the order they apply (the last given first).
  std::vector<server::AuthRule> auth_rules;
  // --auth rules that trust a network beyond loopback, to warn about.
  std::vector<std::string> trusting_rules;
  // --nats and the options beside it; nullopt: no publishing. The database is the URL's,
  // filled in once it is known.
  std::optional<nats::PublisherOptions> nats;
  // --follow and the NATS options beside it: this pgrelay is a follower of the --upstream
  // URL's database (without one, of --database's); nullopt: it captures.
  std::optional<capture::FollowerOptions> follow;
  // `pgrelay zero`: what zero-cache runs as; nullopt: no zero-cache.
  struct Zero {
    zero::ZeroCachePackage package;
    std::string node;
    std::map<std::string, std::string> dotenv;  // ./.env
    int port = 0;  // ZERO_PORT (environment, else .env); 0: zero-cache's default
  };
  std::optional<Zero> zero;
};

// Every error here is the options' (exit status 2): nothing has started yet. `cwd` and `path`
// (PATH) are where `pgrelay zero` looks for zero-cache, node and .env; `environment` (NAME=VALUE)
// is pgrelay's, whose ZERO_* settings win over .env's.
Result<ServePlan> plan_serve(const ServeOptions& options, const std::string& cwd = ".",
                             const std::string& path = "",
                             const std::vector<std::string>& environment = {});

}  // namespace pgrelay::cli
