// A byte stream to a peer, over TCP, a Unix socket or TLS, with errors as values.
#include "upstream/transport.h"

#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <cerrno>
#include <tuple>

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

// Each operation awaits the stream's own asynchronous operation directly: no coroutine frame of
// its own per read or write, which a busy pass-through session would pay twice per round trip.
awaitable<Result<std::size_t>> Transport::read_some(asio::mutable_buffer buffer) {
  std::error_code ec;
  std::size_t n = 0;
  if (auto* tcp_stream = std::get_if<tcp::socket>(&stream_)) {
    std::tie(ec, n) = co_await tcp_stream->async_read_some(buffer, kAsTuple);
  } else if (auto* tls = std::get_if<std::unique_ptr<TlsStream>>(&stream_)) {
    std::tie(ec, n) = co_await (*tls)->async_read_some(buffer, kAsTuple);
  } else {
    std::tie(ec, n) =
        co_await std::get<unix_socket::socket>(stream_).async_read_some(buffer, kAsTuple);
  }
  if (ec) co_return network_error("could not receive data", ec);
  co_return n;
}

awaitable<Status> Transport::write_all(ByteView data) {
  const auto bytes = asio::buffer(data.data(), data.size());
  std::error_code ec;
  if (auto* tcp_stream = std::get_if<tcp::socket>(&stream_)) {
    std::tie(ec, std::ignore) = co_await asio::async_write(*tcp_stream, bytes, kAsTuple);
  } else if (auto* tls = std::get_if<std::unique_ptr<TlsStream>>(&stream_)) {
    std::tie(ec, std::ignore) = co_await asio::async_write(**tls, bytes, kAsTuple);
  } else {
    std::tie(ec, std::ignore) =
        co_await asio::async_write(std::get<unix_socket::socket>(stream_), bytes, kAsTuple);
  }
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

bool Transport::untouched() {
  int fd = -1;
  if (auto* tls = std::get_if<std::unique_ptr<TlsStream>>(&stream_)) {
    // Bytes TLS has taken in and not handed on: records read, whole or not (SSL_has_pending),
    // and those Asio put in the BIO for it and not yet read there.
    SSL* ssl = (*tls)->native_handle();
    if (SSL_has_pending(ssl) == 1 || BIO_ctrl_pending(SSL_get_rbio(ssl)) > 0) return false;
    if ((*tls)->lowest_layer().is_open()) fd = (*tls)->lowest_layer().native_handle();
  } else if (auto* tcp_stream = std::get_if<tcp::socket>(&stream_)) {
    if (tcp_stream->is_open()) fd = tcp_stream->native_handle();
  } else if (auto* local = std::get_if<unix_socket::socket>(&stream_)) {
    if (local->is_open()) fd = local->native_handle();
  }
  if (fd < 0) return false;
  std::uint8_t byte = 0;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

void Transport::send_and_close(ByteView bytes) {
  if (auto socket = release_socket()) {
    (void)::send(socket->fd.get(), bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    return;  // the descriptor closes with `socket`
  }
  close();
}

std::optional<NativeSocket> Transport::release_socket() {
  std::error_code ec;
  if (auto* tcp_stream = std::get_if<tcp::socket>(&stream_)) {
    if (!tcp_stream->is_open()) return std::nullopt;
    const auto kind = tcp_stream->local_endpoint(ec).address().is_v6() ? NativeSocket::Kind::kTcpV6
                                                                       : NativeSocket::Kind::kTcpV4;
    if (ec) return std::nullopt;
    const int fd = tcp_stream->release(ec);
    if (ec) return std::nullopt;
    return NativeSocket{UniqueFd(fd), kind};
  }
  if (auto* local = std::get_if<unix_socket::socket>(&stream_)) {
    if (!local->is_open()) return std::nullopt;
    const int fd = local->release(ec);
    if (ec) return std::nullopt;
    return NativeSocket{UniqueFd(fd), NativeSocket::Kind::kUnix};
  }
  return std::nullopt;
}

Result<Transport> Transport::adopt(const asio::any_io_executor& executor, NativeSocket socket) {
  std::error_code ec;
  if (socket.kind == NativeSocket::Kind::kUnix) {
    unix_socket::socket local(executor);
    local.assign(unix_socket(), socket.fd.get(), ec);
    if (ec) return network_error("could not take the socket back", ec);
    socket.fd.release();
    return Transport(std::move(local));
  }
  tcp::socket tcp_stream(executor);
  tcp_stream.assign(socket.kind == NativeSocket::Kind::kTcpV6 ? tcp::v6() : tcp::v4(),
                    socket.fd.get(), ec);
  if (ec) return network_error("could not take the socket back", ec);
  socket.fd.release();
  return Transport(std::move(tcp_stream));
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
