// What every session does after authentication: the upstream login parameters and the
// messages that end the client's startup.
#include "server/session_start.h"

#include "server/command_result.h"

namespace pgrelay::server {

StartupParameters upstream_parameters(const wire::StartupMessage& startup) {
  StartupParameters out;
  for (const auto& [name, value] : startup.parameters) {
    if (name == "user" || name == "database" || name == "replication") continue;
    out.emplace_back(name, value);
  }
  return out;
}

Bytes session_hello(const StartupParameters& parameters, const wire::BackendKeyData& key) {
  Bytes hello;
  for (const auto& [name, value] : parameters) {
    Bytes status = wire::encode(wire::ParameterStatus{name, value});
    hello.insert(hello.end(), status.begin(), status.end());
  }
  Bytes key_message = wire::encode(key);
  hello.insert(hello.end(), key_message.begin(), key_message.end());
  append_ready(hello);
  return hello;
}

}  // namespace pgrelay::server
