// Replication connections (replication=database): replication commands answered by pgrelay,
// SQL relayed to an upstream backend.
#pragma once

#include "server/server_context.h"
#include "upstream/message_stream.h"
#include "wire/startup.h"

namespace pgrelay::server {

upstream::awaitable<void> run_replication_session(upstream::MessageStream& client,
                                                  const wire::StartupMessage& startup,
                                                  const User& user, ServerContext& context);

}  // namespace pgrelay::server
