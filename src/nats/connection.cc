// A connection to NATS with its JetStream context: nats.c's handles, owned, and its errors as
// pgrelay Errors that name the fix.
#include "nats/connection.h"

namespace pgrelay::nats {

namespace {

// Sets one option, keeping the first failure.
struct OptionSetter {
  natsStatus status = NATS_OK;
  const char* failed = nullptr;
  void operator()(natsStatus s, const char* what) {
    if (status == NATS_OK && s != NATS_OK) {
      status = s;
      failed = what;
    }
  }
};

bool tls_wanted(const ConnectOptions& options) {
  if (!options.tls_ca_file.empty() || !options.tls_cert_file.empty()) return true;
  for (const auto& url : options.urls) {
    if (url.starts_with("tls://")) return true;
  }
  return false;
}

}  // namespace

std::optional<std::string_view> header_value(natsMsg* msg, const char* key) {
  const char* value = nullptr;
  if (natsMsgHeader_Get(msg, key, &value) != NATS_OK || value == nullptr) return std::nullopt;
  return std::string_view(value);
}

std::string redact_url(const std::string& url) {
  const auto scheme = url.find("://");
  const auto start = scheme == std::string::npos ? 0 : scheme + 3;
  const auto at = url.find('@', start);
  if (at == std::string::npos) return url;
  const auto colon = url.find(':', start);
  if (colon == std::string::npos || colon > at) return url;  // a user (or token) alone
  return url.substr(0, colon + 1) + "xxxxx" + url.substr(at);
}

std::string redact_urls(const std::vector<std::string>& urls) {
  std::string out;
  for (const auto& url : urls) {
    if (!out.empty()) out += ',';
    out += redact_url(url);
  }
  return out;
}

Error nats_error(natsStatus status, const std::string& what, const ConnectOptions& options) {
  natsStatus last = NATS_OK;
  const char* text = nats_GetLastError(&last);
  std::string detail = text != nullptr && *text != '\0' && last == status ? text : "";
  // nats.c leads with where in its source it failed: "(conn.c:2088): No server available…".
  if (detail.starts_with("(")) {
    const auto end = detail.find("): ");
    if (end != std::string::npos) detail.erase(0, end + 3);
  }
  const std::string servers = redact_urls(options.urls);
  switch (status) {
    case NATS_NO_SERVER:
      return Error::make(sqlstate::kConnectionFailure,
                         what + ": no NATS server answers at " + servers,
                         "Start nats-server there (with JetStream: nats-server -js), or give "
                         "--nats the URL of one that runs.",
                         detail);
    case NATS_CONNECTION_AUTH_FAILED:
    case NATS_NOT_PERMITTED:
      return Error::make(sqlstate::kInvalidAuthorization,
                         what + ": NATS at " + servers + " refused pgrelay's credentials",
                         "Give the user and password in the URL (nats://USER:PASSWORD@HOST:PORT) "
                         "or with --nats-user and PGRELAY_NATS_PASSWORD, or --nats-token, "
                         "--nats-creds or --nats-nkey, as the server's authorization asks.",
                         detail);
    case NATS_SSL_ERROR:
      return Error::make(sqlstate::kConnectionFailure,
                         what + ": the TLS handshake with NATS at " + servers + " failed",
                         "Give the server's CA with --nats-tls-ca (and --nats-tls-cert and "
                         "--nats-tls-key when it asks for a client certificate), or a nats:// "
                         "URL when the server does not use TLS.",
                         detail);
    default:
      return Error::make(sqlstate::kConnectionFailure,
                         what + ": " + natsStatus_GetText(status) + " (NATS at " + servers + ")",
                         "", detail);
  }
}

Result<std::unique_ptr<Connection>> Connection::open(const ConnectOptions& options,
                                                     const jsOptions* jetstream,
                                                     ConnectionEvents events) {
  std::unique_ptr<Connection> c(new Connection());
  c->callbacks_ = std::make_shared<Callbacks>();
  c->callbacks_->events = std::move(events);
  c->closure_ = new std::shared_ptr<Callbacks>(c->callbacks_);
  natsStatus s = natsOptions_Create(&c->options_);
  if (s != NATS_OK) return nats_error(s, "could not set up the NATS client", options);
  std::vector<const char*> urls;
  for (const auto& url : options.urls) urls.push_back(url.c_str());
  OptionSetter set;
  set(natsOptions_SetServers(c->options_, urls.data(), static_cast<int>(urls.size())), "servers");
  set(natsOptions_SetName(c->options_, options.name.c_str()), "name");
  set(natsOptions_SetMaxReconnect(c->options_, -1), "reconnect");
  set(natsOptions_SetReconnectWait(c->options_, 2000), "reconnect wait");
  set(natsOptions_SetTimeout(c->options_, 5000), "timeout");
  if (!options.user.empty() || !options.password.empty()) {
    set(natsOptions_SetUserInfo(c->options_, options.user.c_str(), options.password.c_str()),
        "user and password");
  }
  if (!options.token.empty())
    set(natsOptions_SetToken(c->options_, options.token.c_str()), "token");
  if (!options.creds_file.empty()) {
    set(natsOptions_SetUserCredentialsFromFiles(c->options_, options.creds_file.c_str(), nullptr),
        "--nats-creds");
  }
  if (!options.nkey_seed_file.empty()) {
    set(natsOptions_SetNKeyFromSeed(c->options_, options.nkey_public.c_str(),
                                    options.nkey_seed_file.c_str()),
        "--nats-nkey");
  }
  if (tls_wanted(options)) {
    set(natsOptions_SetSecure(c->options_, true), "TLS");
    if (!options.tls_ca_file.empty()) {
      set(natsOptions_LoadCATrustedCertificates(c->options_, options.tls_ca_file.c_str()),
          "--nats-tls-ca");
    }
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      set(natsOptions_LoadCertificatesChain(c->options_, options.tls_cert_file.c_str(),
                                            options.tls_key_file.c_str()),
          "--nats-tls-cert and --nats-tls-key");
    }
  }
  set(natsOptions_SetDisconnectedCB(c->options_, &Connection::on_disconnected, c->closure_),
      "callbacks");
  set(natsOptions_SetReconnectedCB(c->options_, &Connection::on_reconnected, c->closure_),
      "callbacks");
  set(natsOptions_SetClosedCB(c->options_, &Connection::on_closed, c->closure_), "callbacks");
  if (set.status != NATS_OK) {
    return nats_error(set.status, std::string("could not use the NATS option ") + set.failed,
                      options);
  }
  s = natsConnection_Connect(&c->nc_, c->options_);
  if (s != NATS_OK) return nats_error(s, "could not connect to NATS", options);
  jsOptions js_options;
  if (jetstream != nullptr) {
    js_options = *jetstream;
  } else {
    jsOptions_Init(&js_options);
  }
  js_options.Wait = options.jetstream_wait_ms;
  s = natsConnection_JetStream(&c->js_, c->nc_, &js_options);
  if (s != NATS_OK) return nats_error(s, "could not open JetStream on NATS", options);
  return c;
}

Connection::~Connection() {
  {
    std::lock_guard lock(callbacks_->mu);
    callbacks_->live = false;
  }
  if (js_ != nullptr) jsCtx_Destroy(js_);
  if (nc_ != nullptr) {
    natsConnection_Close(nc_);  // on_closed follows, on nats.c's thread, and frees closure_
    natsConnection_Destroy(nc_);
  } else {
    delete closure_;  // no connection: no callback ever comes
  }
  if (options_ != nullptr) natsOptions_Destroy(options_);
}

int Connection::known_servers() const {
  char** servers = nullptr;
  int count = 0;
  if (natsConnection_GetServers(nc_, &servers, &count) != NATS_OK) return 1;
  for (int i = 0; i < count; ++i) free(servers[i]);
  free(servers);
  return count;
}

void Connection::on_disconnected(natsConnection*, void* closure) {
  Callbacks& c = **static_cast<std::shared_ptr<Callbacks>*>(closure);
  std::lock_guard lock(c.mu);
  if (c.live && c.events.disconnected) c.events.disconnected();
}

void Connection::on_reconnected(natsConnection*, void* closure) {
  Callbacks& c = **static_cast<std::shared_ptr<Callbacks>*>(closure);
  std::lock_guard lock(c.mu);
  if (c.live && c.events.reconnected) c.events.reconnected();
}

void Connection::on_closed(natsConnection*, void* closure) {
  delete static_cast<std::shared_ptr<Callbacks>*>(closure);
}

}  // namespace pgrelay::nats
