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

}  // namespace pgrelay::server
