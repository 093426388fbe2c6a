// Ordinary sessions: relays a client to its own upstream backend, rewriting catalog queries.
#pragma once

#include "server/server_context.h"
#include "upstream/message_stream.h"
#include "wire/startup.h"

namespace pgrelay::server {

// After authentication: logs in to the upstream for the client's database, reports the
// upstream's ParameterStatus values and pgrelay's BackendKeyData, then relays until either
// side closes. Upstream errors at login reach the client as they are. `user`'s REPLICATION right
// decides which slot functions its statements reach (SlotAccess).
upstream::awaitable<void> run_pass_through(upstream::MessageStream& client,
                                           const wire::StartupMessage& startup, const User& user,
                                           ServerContext& context);

}  // namespace pgrelay::server
