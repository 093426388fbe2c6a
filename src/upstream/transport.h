// A byte stream to a peer, over TCP, a Unix socket or TLS, with errors as values.
#pragma once

#include <asio.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ssl.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "base/bytes.h"
#include "base/result.h"
#include "base/unique_fd.h"

namespace pgrelay::upstream {

using tcp = asio::ip::tcp;
using unix_socket = asio::local::stream_protocol;
template <typename T>
using awaitable = asio::awaitable<T>;

// A plain socket taken out of its Transport (Transport::release_socket), for a loop of its own.
struct NativeSocket {
  enum class Kind { kTcpV4, kTcpV6, kUnix };
  UniqueFd fd;
  Kind kind = Kind::kTcpV4;
};
// Completion token for coroutines that want error codes as values, not exceptions.
inline constexpr auto kAsTuple = asio::experimental::as_tuple(asio::use_awaitable);

class Transport {
 public:
  explicit Transport(tcp::socket socket) : stream_(std::move(socket)) {}
  explicit Transport(unix_socket::socket socket) : stream_(std::move(socket)) {}
  Transport(Transport&&) = default;
  Transport& operator=(Transport&&) = default;

  // Reads what is available (at least one byte); an Error at EOF or on failure.
  awaitable<Result<std::size_t>> read_some(asio::mutable_buffer buffer);
  awaitable<Status> write_all(ByteView data);

  // Replaces the TCP stream by TLS over it and runs the handshake. `verify_host` (client side,
  // verify-full) checks the certificate names that host. 08006 when the handshake fails, or
  // 0A000 for a Unix socket.
  awaitable<Status> start_tls(asio::ssl::context& context,
                              asio::ssl::stream_base::handshake_type role,
                              const std::string& verify_host = {});
  bool is_tls() const { return std::holds_alternative<std::unique_ptr<TlsStream>>(stream_); }
  // tls-server-end-point channel binding data (RFC 5929): the hash of our certificate on the
  // server side, of the peer's on the client side; nullopt without TLS.
  std::optional<Bytes> channel_binding(bool server_side) const;

  void close();
  // True while the peer has neither sent a byte nor closed the connection since the last read:
  // a connection left unused is still as it was left. Over TLS, bytes the TLS layer has
  // already taken from the socket count too (OpenSSL's buffers and the BIO Asio fills; Asio
  // keeps bytes back from the BIO only when it is full).
  bool untouched();
  // Sends `bytes` if the socket takes them at once, then closes: a goodbye (a Terminate) not
  // worth waiting for. Over TLS it only closes.
  void send_and_close(ByteView bytes);
  // Gives up the socket itself, with its descriptor still open, for a loop that reads and writes
  // it directly (server/relay_loop.h); the Transport is closed after. Nullopt over TLS, whose
  // state lives in this process's OpenSSL objects, or on a closed connection.
  std::optional<NativeSocket> release_socket();
  // A Transport over a socket given back by such a loop, run by `executor`.
  static Result<Transport> adopt(const asio::any_io_executor& executor, NativeSocket socket);
  asio::any_io_executor executor();
  // The peer's address (IP, or "local" for a Unix socket), for authentication rules and logs.
  std::optional<asio::ip::address> peer_address() const;
  // The peer's address and port; nullopt for a Unix socket or a closed connection.
  std::optional<asio::ip::tcp::endpoint> peer_endpoint() const;

 private:
  using TlsStream = asio::ssl::stream<tcp::socket>;
  std::variant<tcp::socket, unix_socket::socket, std::unique_ptr<TlsStream>> stream_;
};

// An Error for a failed network operation, with SQLSTATE 08006 (connection_failure).
Error network_error(std::string_view what, const std::error_code& ec);

}  // namespace pgrelay::upstream
