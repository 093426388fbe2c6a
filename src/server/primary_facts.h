// What a follower's replication sessions are told of the primary's upstream without asking
// one: the ParameterStatus values a session starts with, and the publications as they stand.
//
// A follower serves the replication protocol from the log it rebuilds from the stream; the
// facts come from the same stream (nats/server_facts.h). With them its sessions need no
// upstream connection, so any number of followers cost the upstream nothing; ordinary
// sessions, SQL on a replication session and binary mode still need its --upstream.
#pragma once

#include <optional>
#include <string>

#include "base/result.h"
#include "server/session_start.h"

namespace pgrelay::server {

class PrimaryFacts {
 public:
  virtual ~PrimaryFacts() = default;
  // The upstream's ParameterStatus values; nullopt until the follower has read them.
  virtual std::optional<StartupParameters> parameters() const = 0;
  // The publications catalog (pgoutput/publication_catalog.h) at the log's head; nullopt when
  // the primary's upstream has none to give (before PostgreSQL 15). Blocking: reads the log.
  virtual Result<std::optional<std::string>> catalog() = 0;
};

// What a follower started without --upstream says to what needs an upstream (`what`: "ordinary
// sessions", "SQL on a replication connection", ...): 08004, the server rejects the
// connection's request, with the fix.
inline Error upstream_absent(const std::string& what) {
  return Error::make("08004", "this pgrelay follower has no upstream for " + what,
                     "It serves replication sessions from the stream alone. Connect with "
                     "replication=database for the replication protocol, or start the follower "
                     "with --upstream URL (the primary's database or the primary pgrelay) to "
                     "pass the rest through.");
}

}  // namespace pgrelay::server
