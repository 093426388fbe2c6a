// A byte stream to a peer, over TCP, a Unix socket or TLS, with errors as values.
#include "upstream/transport.h"

#include <openssl/evp.h>
#include <openssl/x509.h>

namespace pgrelay::upstream {
namespace {

// Hash of a certificate as tls-server-end-point wants it: the certificate's own signature
// hash, with MD5 and SHA-1 upgraded to SHA-256.
std::optional<Bytes> certificate_hash(X509* cert) {
  if (!cert) return std::nullopt;
  int algo_nid = 0;
  if (!X509_get_signature_info(cert, &algo_nid, nullptr, nullptr, nullptr)) return std::nullopt;
  const EVP_MD* md = EVP_get_digestbynid(algo_nid);
  if (!md || algo_nid == NID_md5 || algo_nid == NID_sha1) md = EVP_sha256();
  unsigned char hash[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!X509_digest(cert, md, hash, &len)) return std::nullopt;
  return Bytes(hash, hash + len);
}

}  // namespace

Error network_error(std::string_view what, const std::error_code& ec) {
  return Error::make("08006", std::string(what) + ": " + ec.message());
}

awaitable<Result<std::size_t>> Transport::read_some(asio::mutable_buffer buffer) {
  auto read = [&](auto& stream) -> awaitable<std::tuple<std::error_code, std::size_t>> {
    if constexpr (std::is_same_v<std::decay_t<decltype(stream)>, std::unique_ptr<TlsStream>>) {
      co_return co_await stream->async_read_some(buffer, kAsTuple);
    } else {
      co_return co_await stream.async_read_some(buffer, kAsTuple);
    }
  };
  auto [ec, n] = co_await std::visit(read, stream_);
  if (ec) co_return network_error("could not receive data", ec);
  co_return n;
}

awaitable<Status> Transport::write_all(ByteView data) {
  auto write = [&](auto& stream) -> awaitable<std::tuple<std::error_code, std::size_t>> {
    if constexpr (std::is_same_v<std::decay_t<decltype(stream)>, std::unique_ptr<TlsStream>>) {
      co_return co_await asio::async_write(*stream, asio::buffer(data.data(), data.size()),
                                           kAsTuple);
    } else {
      co_return co_await asio::async_write(stream, asio::buffer(data.data(), data.size()),
                                           kAsTuple);
    }
  };
  auto [ec, n] = co_await std::visit(write, stream_);
  (void)n;
  if (ec) co_return network_error("could not send data", ec);
  co_return Status{};
}

awaitable<Status> Transport::start_tls(asio::ssl::context& context,
                                       asio::ssl::stream_base::handshake_type role,
                                       const std::string& verify_host) {
  auto* socket = std::get_if<tcp::socket>(&stream_);
  if (!socket) {
    co_return Error::make(sqlstate::kFeatureNotSupported,
                          "TLS is only available over TCP connections");
  }
  auto tls = std::make_unique<TlsStream>(std::move(*socket), context);
  if (role == asio::ssl::stream_base::client && !verify_host.empty()) {
    SSL_set_tlsext_host_name(tls->native_handle(), verify_host.c_str());
    tls->set_verify_callback(asio::ssl::host_name_verification(verify_host));
  }
  auto [ec] = co_await tls->async_handshake(role, kAsTuple);
  stream_ = std::move(tls);
  if (ec) co_return network_error("TLS handshake failed", ec);
  co_return Status{};
}

std::optional<Bytes> Transport::channel_binding(bool server_side) const {
  const auto* tls = std::get_if<std::unique_ptr<TlsStream>>(&stream_);
  if (!tls) return std::nullopt;
  SSL* ssl = (*tls)->native_handle();
  if (server_side) return certificate_hash(SSL_get_certificate(ssl));
  X509* peer = SSL_get1_peer_certificate(ssl);
  auto hash = certificate_hash(peer);
  X509_free(peer);
  return hash;
}

void Transport::close() {
  std::error_code ignored;
  std::visit(
      [&](auto& stream) {
        if constexpr (std::is_same_v<std::decay_t<decltype(stream)>, std::unique_ptr<TlsStream>>) {
          stream->lowest_layer().shutdown(tcp::socket::shutdown_both, ignored);
          stream->lowest_layer().close(ignored);
        } else {
          stream.shutdown(std::decay_t<decltype(stream)>::shutdown_both, ignored);
          stream.close(ignored);
        }
      },
      stream_);
}

asio::any_io_executor Transport::executor() {
  return std::visit(
      [](auto& stream) -> asio::any_io_executor {
        if constexpr (std::is_same_v<std::decay_t<decltype(stream)>, std::unique_ptr<TlsStream>>) {
          return stream->get_executor();
        } else {
          return stream.get_executor();
        }
      },
      stream_);
}

std::optional<tcp::endpoint> Transport::peer_endpoint() const {
  std::error_code ec;
  if (const auto* s = std::get_if<tcp::socket>(&stream_)) {
    auto ep = s->remote_endpoint(ec);
    if (!ec) return ep;
  } else if (const auto* t = std::get_if<std::unique_ptr<TlsStream>>(&stream_)) {
    auto ep = (*t)->lowest_layer().remote_endpoint(ec);
    if (!ec) return ep;
  }
  return std::nullopt;
}

std::optional<asio::ip::address> Transport::peer_address() const {
  if (auto ep = peer_endpoint()) return ep->address();
  return std::nullopt;
}

}  // namespace pgrelay::upstream
