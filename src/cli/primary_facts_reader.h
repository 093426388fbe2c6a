// Reads what a publishing primary tells its followers of the upstream: the ParameterStatus
// values a session starts with and the publications catalog (nats/server_facts.h).
#pragma once

#include <string>

#include "base/result.h"
#include "nats/server_facts.h"

namespace pgrelay::cli {

// Connects to `conninfo` and reads the facts (as_of is left to the publisher); blocking. The
// catalog is left out before PostgreSQL 15, whose publications pgrelay reads by name.
Result<nats::ServerFacts> read_primary_facts(const std::string& conninfo);

}  // namespace pgrelay::cli
