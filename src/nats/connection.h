// A connection to NATS with its JetStream context: nats.c's handles, owned, and its errors as
// pgrelay Errors that name the fix.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nats/nats.h>

#include "base/result.h"

namespace pgrelay::nats {

// How to reach NATS: `pgrelay serve --nats …` and the options beside it.
struct ConnectOptions {
  std::vector<std::string> urls;  // nats://[user:password@]host:port, or tls://…
  std::string user;
  std::string password;
  std::string token;
  std::string creds_file;   // a .creds file (JWT and NKey seed)
  std::string nkey_public;  // an NKey user's public key, and the file with its seed
  std::string nkey_seed_file;
  std::string tls_ca_file;  // set (or a tls:// URL): TLS, the server checked against this CA
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string name = "pgrelay";  // the connection name the server shows
  std::int64_t jetstream_wait_ms = 5000;
};

struct MsgDeleter {
  void operator()(natsMsg* m) const { natsMsg_Destroy(m); }
};
// A nats.c message, owned.
using MsgPtr = std::unique_ptr<natsMsg, MsgDeleter>;

// The value of a message's header `key`; nullopt when it has none.
std::optional<std::string_view> header_value(natsMsg* msg, const char* key);

// A URL as it may be logged: any password in it replaced by "xxxxx".
std::string redact_url(const std::string& url);
// The URLs, redacted, joined by ','.
std::string redact_urls(const std::vector<std::string>& urls);

// Turns a failed nats.c call into an Error: `what` says what was tried; the hint names the fix
// for the causes an operator can fix (no server there, credentials refused, a TLS mismatch).
Error nats_error(natsStatus status, const std::string& what, const ConnectOptions& options);

// The callbacks nats.c calls on its own threads as the connection goes down and comes back.
struct ConnectionEvents {
  std::function<void()> disconnected;
  std::function<void()> reconnected;
};

class Connection {
 public:
  // Connects (once: reconnecting after that is nats.c's, endlessly, every 2 s).
  static Result<std::unique_ptr<Connection>> open(const ConnectOptions& options,
                                                  const jsOptions* jetstream,
                                                  ConnectionEvents events = {});
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  natsConnection* nc() const { return nc_; }
  jsCtx* js() const { return js_; }
  // The largest message the servers take (their max_payload).
  std::int64_t max_payload() const { return natsConnection_GetMaxPayload(nc_); }
  // How many servers the client knows of: those given and those the cluster told it about.
  int known_servers() const;
  bool connected() const { return natsConnection_Status(nc_) == NATS_CONN_STATUS_CONNECTED; }

 private:
  // What nats.c's callbacks reach, owned by the Connection and by nats.c's closure (a
  // shared_ptr of its own, freed by the closed callback, the last one): nats.c calls them on a
  // thread of its own, the closed one after natsConnection_Close() has returned. `live` goes
  // false, under the mutex, before the connection closes, so that no callback runs into what
  // the owner of the events has destroyed.
  struct Callbacks {
    std::mutex mu;
    bool live = true;
    ConnectionEvents events;
  };
  Connection() = default;
  static void on_disconnected(natsConnection* nc, void* closure);
  static void on_reconnected(natsConnection* nc, void* closure);
  static void on_closed(natsConnection* nc, void* closure);

  natsOptions* options_ = nullptr;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  std::shared_ptr<Callbacks> callbacks_;
  std::shared_ptr<Callbacks>* closure_ = nullptr;  // nats.c's; freed by on_closed
};

}  // namespace pgrelay::nats
