// What every session of one server shares: settings, authentication, upstream, replication.
#include "server/server_context.h"

#include "wire/scram.h"

namespace pgrelay::server {

wire::BackendKeyData CancelRegistry::issue(int pid, std::optional<wire::BackendKeyData> upstream) {
  std::int32_t secret = 0;
  if (auto bytes = wire::random_bytes(4); bytes.ok()) {
    for (auto b : *bytes)
      secret = static_cast<std::int32_t>((static_cast<std::uint32_t>(secret) << 8) | b);
  }
  std::lock_guard lock(mu_);
  keys_[{pid, secret}] = upstream;
  return wire::BackendKeyData{pid, secret};
}

void CancelRegistry::forget(const wire::BackendKeyData& key) {
  std::lock_guard lock(mu_);
  keys_.erase({key.pid, key.secret_key});
}

std::optional<wire::BackendKeyData> CancelRegistry::lookup(int pid, int secret) const {
  std::lock_guard lock(mu_);
  auto it = keys_.find({pid, secret});
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

void note_error_sent(ServerContext& context, const Error& error, bool ends_session,
                     std::string_view host) {
  std::string_view code = error.sqlstate;
  count(context.metrics, server_metrics::kErrorsSent, {{"sqlstate", error.sqlstate}});
  if (ends_session && code == sqlstate::kProtocolViolation) {
    count(context.metrics, server_metrics::kProtocolErrors);
  }
  Logger* logger = context.logger;
  if (logger == nullptr || code.starts_with("28")) return;
  if (code.starts_with("XX")) {
    logger->error("internal error sent to a client", {{"error", error.message},
                                                      {"sqlstate", code},
                                                      {"host", host},
                                                      {"session_closed", ends_session}});
  } else if (!ends_session) {
    log_to(logger, LogLevel::kDebug, "error sent to a client",
           {{"error", error.message}, {"sqlstate", code}, {"host", host}});
  } else if (code == sqlstate::kProtocolViolation) {
    logger->warning("session closed for a protocol violation",
                    {{"error", error.message}, {"host", host}});
  } else {
    log_to(logger, LogLevel::kInfo, "session closed with an error",
           {{"error", error.message}, {"sqlstate", code}, {"host", host}});
  }
}

}  // namespace pgrelay::server
