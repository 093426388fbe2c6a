// Relays plain-socket pass-through sessions on one epoll thread; reads only after data came.
#pragma once

#include <asio/any_io_executor.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "server/metrics.h"
#include "server/relay_protocol.h"
#include "upstream/transport.h"

namespace pgrelay::server {

// Everything of one pass-through session in flight: both sockets and every byte not yet
// delivered. It moves from the session's coroutine to the loop and back.
struct RelayedSession {
  upstream::NativeSocket client;
  upstream::NativeSocket upstream;
  RelayState state;
  Bytes from_client;    // read from the client, not yet forwarded (whole frames and a partial one)
  Bytes from_upstream;  // read from the upstream, held back by state.from_upstream
  Bytes to_client;      // accepted for the client, not yet written
  Bytes to_upstream;    // accepted for the upstream, not yet written
  wire::FrameLimits client_limits;
  StatementSource source;
  const SqlRewrite* rewrite = nullptr;  // the server's; must outlive the loop
  // Stop before a statement that needs a database to itself (databases_used_alone_in): its
  // coroutine lets go of those databases first, then sends it.
  bool watch_database_ddl = false;
  // On a Terminate when state.reusable_after_terminate(), give the session back with
  // state.client_left set, the Terminate not forwarded (the backend goes to a BackendPool).
  bool keep_backend = false;
  Counter* to_client_bytes = nullptr;  // optional
  Counter* to_upstream_bytes = nullptr;

  // How the loop gave it back: ended (its sockets are closed), or to go on where it is.
  bool ended = false;
  std::optional<Error> client_error;  // the session ended on the client's protocol violation
};

// An asio session reads a socket as soon as it has handled the last read, and asio tries that
// read at once: on a request-response connection that costs a recv that fails (EAGAIN) on each
// side of each round trip, a third of a pass-through session's system calls. This loop keeps
// both sockets in an edge-triggered epoll set and reads one only after the kernel reported data
// since the last short read, as pgbouncer does.
//
// It relays what needs no coroutine: frames, the catalog rewrite and the reply count. A DROP
// DATABASE (pgrelay must let go of that database first), shutdown (recall_all) and stop() give
// the session back to its coroutine, which goes on from the same bytes.
class RelayLoop {
 public:
  RelayLoop();
  ~RelayLoop();
  RelayLoop(const RelayLoop&) = delete;
  RelayLoop& operator=(const RelayLoop&) = delete;

  Status start();
  // Gives every session back (their coroutines go on, if their io_context still runs) and
  // joins the thread. The io_contexts sessions came from must outlive this call.
  void stop();

  // From a session's coroutine: relays `session` until it ends or the loop gives it back. At
  // once, unchanged, when the loop is not running or recalls everything.
  upstream::awaitable<RelayedSession> relay(RelayedSession session);
  // From now on, gives back every session it holds or is given (the server shuts down:
  // sessions end on the asio path, where a reply in flight is finished first).
  void recall_all();

  // Sessions on the loop now (for tests and the admin page).
  std::size_t session_count() const;

 private:
  struct Ticket;
  struct Session;
  struct Endpoint;

  void run();
  void signal();  // wakes the thread to read its commands
  void take_commands();
  void adopt(std::shared_ptr<Ticket> ticket);
  // Moves bytes until neither direction can go on without the kernel.
  void pump(Session& session);
  bool flush(Session& session, Endpoint& to);
  // Sends what the socket takes now and queues the rest; false if `to` is gone.
  bool send_or_keep(Session& session, Endpoint& to, ByteView bytes);
  // A send came back short: EPOLLOUT is watched until the outbox is empty.
  void await_writable(Session& session, Endpoint& to);
  // One recv into `into`: the bytes read, or 0 when there were none (the socket drained, or
  // the peer gone: then `session` is closing).
  std::size_t receive(Session& session, Endpoint& from, std::uint8_t* into, std::size_t space);
  bool read_client(Session& session);
  bool forward_client_frames(Session& session);
  // Counts and sends the client frames batched so far; false if the upstream is gone.
  bool send_batch(Session& session);
  bool read_upstream(Session& session);
  void hang_up(Session& session, Endpoint& side);
  void give_back(Session& session, bool ended);
  // Wakes the session's coroutine on its own executor with the ticket's session.
  static void post_back(std::shared_ptr<Ticket> ticket);

  UniqueFd epoll_;
  UniqueFd wake_;  // eventfd: commands are waiting
  std::thread thread_;

  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Ticket>> incoming_;  // guarded by mu_
  bool recalling_ = false;                         // guarded by mu_
  bool stopping_ = false;                          // guarded by mu_
  bool running_ = false;                           // guarded by mu_: started
  std::size_t session_count_ = 0;                  // guarded by mu_

  // The loop thread's own.
  std::unordered_map<Session*, std::unique_ptr<Session>> sessions_;
  std::vector<std::unique_ptr<Session>> retired_;  // given back during one epoll batch
  Bytes read_buffer_;
};

}  // namespace pgrelay::server
