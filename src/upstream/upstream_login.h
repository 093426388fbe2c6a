// Opens a raw protocol connection to the upstream and logs in with the configured credentials.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "upstream/message_stream.h"
#include "upstream/upstream_config.h"
#include "wire/backend_messages.h"

namespace pgrelay::upstream {

// An upstream backend, logged in and ready for its first query.
struct UpstreamLink {
  MessageStream stream;
  // ParameterStatus values the upstream reported during startup, in order; a kept backend's
  // are brought up to date with what it reported since (BackendPool).
  wire::ReportedParameters parameters;
  wire::BackendKeyData key;  // the upstream backend's cancel key
};

// Connects (TCP or Unix socket), negotiates TLS as `config.sslmode` asks, sends a startup packet
// with `parameters` (user and database are taken from `config` and `database`, whatever the
// list says) and answers the upstream's authentication request (trust, cleartext, MD5,
// SCRAM-SHA-256 with or without channel binding). An error the upstream sent keeps its
// SQLSTATE and texts, so a client can be shown it as is.
awaitable<Result<UpstreamLink>> connect_upstream(
    const UpstreamConfig& config, std::string database,
    std::vector<std::pair<std::string, std::string>> parameters, asio::ssl::context* tls);

// Sends a CancelRequest for `key` on a fresh connection, as libpq's PQcancel does.
awaitable<Status> cancel_upstream(const UpstreamConfig& config, wire::BackendKeyData key);

}  // namespace pgrelay::upstream
