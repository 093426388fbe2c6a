// What every session does after authentication: the upstream login parameters and the
// messages that end the client's startup.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/bytes.h"
#include "wire/backend_messages.h"
#include "wire/startup.h"

namespace pgrelay::server {

using StartupParameters = std::vector<std::pair<std::string, std::string>>;

// The client's startup parameters to pass on to the upstream: all but user, database and
// replication, which pgrelay decides itself.
StartupParameters upstream_parameters(const wire::StartupMessage& startup);

// ParameterStatus for each parameter (the upstream's real values), BackendKeyData, and
// ReadyForQuery (idle).
Bytes session_hello(const StartupParameters& parameters, const wire::BackendKeyData& key);

}  // namespace pgrelay::server
