// TLS contexts: pgrelay's server certificate (generated once if none is given) and the
// client context for upstream connections per sslmode.
#pragma once

#include <asio/ssl.hpp>

#include <memory>
#include <string>

#include "base/result.h"
#include "upstream/upstream_config.h"

namespace pgrelay::server {

// Writes a self-signed certificate and its private key (mode 0600) for `common_name`, valid
// for ten years, unless both files exist already.
Status ensure_self_signed_certificate(const std::string& cert_path, const std::string& key_path,
                                      const std::string& common_name);

// A server context with the certificate chain and key; TLS 1.2 or newer.
Result<std::unique_ptr<asio::ssl::context>> make_server_tls(const std::string& cert_path,
                                                            const std::string& key_path);

// A client context that verifies the upstream as `config.sslmode` asks: require encrypts
// without checking, verify-ca checks the chain (sslrootcert or the system store), verify-full
// also the host name (done per connection).
Result<std::unique_ptr<asio::ssl::context>> make_upstream_tls(
    const upstream::UpstreamConfig& config);

}  // namespace pgrelay::server
