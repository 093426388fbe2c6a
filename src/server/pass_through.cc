// Ordinary sessions: relays a client to its own upstream backend, rewriting catalog queries.
//
// Upstream to client is a byte copy, followed message by message only through the headers:
// that tells when a reply is complete (for a clean end at shutdown), and lets one upstream
// notice be dropped (below). Client to upstream goes frame by frame, because a Query or Parse
// naming a virtualized catalog object is rewritten; every other frame is forwarded as it
// came, in batches.
//
// Once logged in, a session over plain sockets moves to the RelayLoop (relay_loop.h), which
// relays the same way at less cost, and comes back here for what needs a coroutine: a DROP
// DATABASE, and shutdown. TLS sessions stay here throughout.
#include "server/pass_through.h"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <cstring>

#include "server/backend_pool.h"
#include "server/blocking.h"
#include "server/command_result.h"
#include "server/relay_loop.h"
#include "server/relay_protocol.h"
#include "server/session_start.h"
#include "server/sql_rewrite.h"
#include "upstream/upstream_login.h"
#include "wire/backend_stream_filter.h"
#include "wire/frontend_messages.h"
#include "wire/messages.h"

namespace pgrelay::server {
namespace {

using namespace asio::experimental::awaitable_operators;

// The asio path's state of one session: the protocol's, and the shutdown handshake's.
struct SessionState {
  RelayState protocol;
  bool draining = false;          // the server is shutting down
  bool woken = false;             // `wake` was cancelled on purpose (not by the session ending)
  std::size_t upstream_held = 0;  // upstream bytes the filter holds back, not yet forwarded

  bool idle() const { return protocol.idle(); }
};

void wake_up(SessionState& state, asio::steady_timer& wake) {
  state.woken = true;
  wake.cancel();
}

// Forwards `buffer[0, filled)` through the filter and keeps what it holds back at the front.
upstream::awaitable<Result<std::size_t>> forward_chunk(SessionState& state, Bytes& buffer,
                                                       std::size_t filled,
                                                       upstream::Transport& to) {
  auto pass = state.protocol.from_upstream.process(std::span(buffer.data(), filled));
  if (pass.send > 0) PGRELAY_CO_TRY(co_await to.write_all(ByteView(buffer.data(), pass.send)));
  std::memmove(buffer.data(), buffer.data() + pass.send, pass.keep);
  co_return pass.keep;
}

// `relayed` (optional) counts the bytes: one atomic add per read, nothing more on this path.
upstream::awaitable<void> copy_upstream_to_client(upstream::Transport& from,
                                                  upstream::Transport& to, Bytes buffer,
                                                  std::size_t kept, SessionState& state,
                                                  asio::steady_timer& wake, Counter* relayed) {
  for (;;) {
    auto n = co_await from.read_some(asio::buffer(buffer.data() + kept, buffer.size() - kept));
    if (!n.ok()) co_return;
    if (relayed) relayed->inc(*n);
    auto held = co_await forward_chunk(state, buffer, kept + *n, to);
    if (!held.ok()) co_return;
    kept = *held;
    state.upstream_held = kept;
    if (state.draining && state.idle()) wake_up(state, wake);
  }
}

// Ends the session once the server is shutting down and no reply is in flight, with the
// FATAL a Postgres backend sends when its server shuts down.
upstream::awaitable<void> end_when_idle(upstream::MessageStream& client, SessionState& state,
                                        asio::steady_timer& wake) {
  for (;;) {
    if (!state.woken) {
      co_await wake.async_wait(upstream::kAsTuple);
      if (!state.woken) co_return;  // the session ended first
    }
    state.woken = false;
    if (state.draining && state.idle()) break;
    wake.expires_at(asio::steady_timer::time_point::max());
  }
  Error shutdown =
      Error::make(sqlstate::kAdminShutdown, "terminating connection due to administrator command");
  (void)co_await client.write(
      wire::encode(wire::make_error_response(shutdown, wire::Severity::kFatal)));
}

// A session ended by what its client sent: a protocol violation is counted and logged.
void note_client_failure(const ServerContext& context, const Error& error,
                         const std::string& host) {
  if (error.sqlstate != sqlstate::kProtocolViolation) return;
  count(context.metrics, server_metrics::kProtocolErrors);
  if (context.logger) {
    context.logger->warning("session closed for a protocol violation",
                            {{"error", error.message}, {"host", host}});
  }
}

// Whether pgrelay must let go of databases before some statements go upstream.
bool watches_database_ddl(const ServerContext& context) {
  return context.hubs != nullptr || context.backend_pool != nullptr;
}

// Before a statement that needs databases to themselves (DROP DATABASE and the others of
// databases_used_alone) goes upstream, pgrelay closes the backends it keeps there and stops
// capturing the databases dropped: its own connections there would make the upstream refuse
// the statement as the database being in use.
upstream::awaitable<void> release_databases(const std::vector<DatabaseUsedAlone>& databases,
                                            const ServerContext& context) {
  for (const auto& database : databases) {
    if (context.backend_pool) context.backend_pool->close_database(database.name);
    if (context.hubs && database.dropped) {
      ReplicationHubs& hubs = *context.hubs;
      co_await run_blocking(hubs.blocking(), [&] { return hubs.release(database.name); });
    }
  }
}

upstream::awaitable<void> relay_client_to_upstream(upstream::MessageStream& client,
                                                   upstream::Transport& to,
                                                   const ServerContext& context,
                                                   const StatementSource& source,
                                                   SessionState& state, asio::steady_timer& wake,
                                                   Counter* relayed) {
  const SqlRewrite& rewrite = context.rewrite;
  Bytes batch;
  for (;;) {
    auto view = co_await client.read_frame_view();
    if (!view.ok()) {
      auto peer = client.transport().peer_address();
      note_client_failure(context, view.error(), peer ? peer->to_string() : "local");
      co_return;
    }
    if (state.draining && state.idle()) {
      // Shutting down between requests: this one is not sent upstream. end_when_idle ends the
      // session (it may not have run yet when a quick client already sends its next query).
      wake_up(state, wake);
      asio::steady_timer parked(co_await asio::this_coro::executor,
                                asio::steady_timer::time_point::max());
      co_await parked.async_wait(upstream::kAsTuple);
      co_return;
    }
    // Forward everything already buffered in one write, so pipelined clients stay fast.
    std::optional<wire::FrameView> next = *view;
    bool terminate = false;
    while (next && !terminate) {
      ClientFrame frame(*next);
      if (frame.tag == 'X' && context.backend_pool && batch.empty() && state.upstream_held == 0 &&
          state.protocol.reusable_after_terminate()) {
        state.protocol.client_left = true;  // not forwarded: the backend goes to the pool
        co_return;
      }
      const auto used_alone = watches_database_ddl(context) ? databases_used_alone_in(frame)
                                                            : std::vector<DatabaseUsedAlone>();
      if (!used_alone.empty()) {
        // Sent after what came before it, once pgrelay has let go of the database. The frame's
        // view stays valid: nothing reads the client meanwhile.
        if (!batch.empty()) {
          if (relayed) relayed->inc(batch.size());
          if (!(co_await to.write_all(batch)).ok()) co_return;
          batch.clear();
        }
        co_await release_databases(used_alone, context);
      }
      append_client_frame(frame, rewrite, source, batch);
      state.protocol.count_client_frame(frame.tag);
      terminate = frame.tag == 'X';
      if (batch.size() >= kClientBatchBytes) break;
      auto more = client.reader().next_view();
      next = more.ok() ? *more : std::nullopt;
    }
    if (relayed) relayed->inc(batch.size());
    if (!(co_await to.write_all(batch)).ok()) co_return;
    batch.clear();
    if (terminate) co_return;
  }
}

// Moves the session to the relay loop, where it runs at less cost: true when it ended there;
// false when it stays on this path (TLS) or came back (a DROP DATABASE, shutdown), with its
// sockets and the bytes in flight back in place.
upstream::awaitable<bool> ended_on_loop(RelayLoop& loop, upstream::MessageStream& client,
                                        upstream::Transport& to, Bytes& buffer, std::size_t& kept,
                                        SessionState& state, ServerContext& context,
                                        const StatementSource& source, Counter* to_client,
                                        Counter* to_upstream) {
  if (client.transport().is_tls() || to.is_tls()) co_return false;
  auto executor = co_await asio::this_coro::executor;
  auto peer = client.transport().peer_address();
  const std::string host = peer ? peer->to_string() : std::string("local");
  // Only a closed socket cannot be released: then the session is over.
  auto client_socket = client.transport().release_socket();
  if (!client_socket) co_return true;
  auto upstream_socket = to.release_socket();
  if (!upstream_socket) co_return true;

  RelayedSession session;
  session.client = std::move(*client_socket);
  session.upstream = std::move(*upstream_socket);
  session.state = std::move(state.protocol);
  session.from_client = client.reader().take_buffered();
  session.from_upstream.assign(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(kept));
  session.client_limits = client.reader().limits();
  session.source = source;
  session.rewrite = &context.rewrite;
  session.watch_database_ddl = watches_database_ddl(context);
  session.keep_backend = context.backend_pool != nullptr;
  session.to_client_bytes = to_client;
  session.to_upstream_bytes = to_upstream;
  RelayedSession back = co_await loop.relay(std::move(session));

  state.protocol = std::move(back.state);
  if (back.client_error) note_client_failure(context, *back.client_error, host);
  if (back.ended) co_return true;
  auto client_transport = upstream::Transport::adopt(executor, std::move(back.client));
  auto upstream_transport = upstream::Transport::adopt(executor, std::move(back.upstream));
  if (!client_transport.ok() || !upstream_transport.ok()) co_return true;
  client.transport() = std::move(*client_transport);
  to = std::move(*upstream_transport);
  client.reader().feed(back.from_client);
  std::copy(back.from_upstream.begin(), back.from_upstream.end(), buffer.begin());
  kept = back.from_upstream.size();
  state.upstream_held = kept;
  if (state.protocol.client_left) co_return false;  // nothing more goes to either side
  // What the loop accepted but could not write yet goes first.
  if (!back.to_upstream.empty() && !(co_await to.write_all(back.to_upstream)).ok()) co_return true;
  if (!back.to_client.empty() && !(co_await client.write(back.to_client)).ok()) co_return true;
  co_return false;
}

}  // namespace

upstream::awaitable<void> run_pass_through(upstream::MessageStream& client,
                                           const wire::StartupMessage& startup, const User& user,
                                           ServerContext& context) {
  // pg_dump names itself (libpq's fallback_application_name); its dumps leave pgrelay out.
  const StatementSource source(user.replication ? SlotAccess::kGranted : SlotAccess::kDenied,
                               startup.find("application_name").value_or("") == "pg_dump");
  const std::string database(startup.database());
  StartupParameters parameters = upstream_parameters(startup);
  Result<upstream::UpstreamLink> link = upstream_absent("ordinary sessions");
  std::optional<upstream::UpstreamLink> kept_backend;
  if (context.backend_pool) kept_backend = context.backend_pool->take(database, parameters);
  if (kept_backend) {
    link = std::move(*kept_backend);
  } else if (context.upstream) {
    link = co_await upstream::connect_upstream(*context.upstream, database, parameters,
                                               context.upstream_tls);
  }
  if (!link.ok()) {
    auto peer = client.transport().peer_address();
    note_error_sent(context, link.error(), /*ends_session=*/true,
                    peer ? peer->to_string() : std::string("local"));
    Bytes out;
    out = wire::encode(wire::make_error_response(link.error(), wire::Severity::kFatal));
    (void)co_await client.write(out);
    co_return;
  }
  // The client gets the upstream backend's real pid (pg_backend_pid() agrees) and a secret of
  // ours, so a CancelRequest must come through pgrelay, which knows the upstream's secret.
  wire::BackendKeyData key = context.cancels.issue(link->key.pid, link->key);
  Counter* to_client = nullptr;
  Counter* to_upstream = nullptr;
  if (context.metrics) {
    to_client =
        &context.metrics->counter(server_metrics::kRelayedBytes, {{"direction", "to_client"}});
    to_upstream =
        &context.metrics->counter(server_metrics::kRelayedBytes, {{"direction", "to_upstream"}});
  }
  // What the upstream sent after its login goes through the filter like the rest: it may end
  // anywhere, even inside a message.
  SessionState state;
  Bytes buffer = link->stream.reader().take_buffered();
  std::size_t kept = buffer.size();
  state.upstream_held = kept;
  buffer.resize(upstream_buffer_bytes(kept));
  asio::steady_timer wake(co_await asio::this_coro::executor,
                          asio::steady_timer::time_point::max());
  auto token = context.shutdown.subscribe([&] {
    state.draining = true;
    wake_up(state, wake);
  });
  bool greeted = (co_await client.write(session_hello(link->parameters, key))).ok();
  if (greeted) {
    auto held = co_await forward_chunk(state, buffer, kept, client.transport());
    greeted = held.ok();
    if (greeted) kept = *held;
    state.upstream_held = kept;
  }
  bool relaying = greeted;
  if (relaying && context.relay_loop && !state.draining) {
    relaying =
        !co_await ended_on_loop(*context.relay_loop, client, link->stream.transport(), buffer, kept,
                                state, context, source, to_client, to_upstream);
  }
  if (relaying && !state.protocol.client_left) {
    co_await (copy_upstream_to_client(link->stream.transport(), client.transport(),
                                      std::move(buffer), kept, state, wake, to_client) ||
              relay_client_to_upstream(client, link->stream.transport(), context, source, state,
                                       wake, to_upstream) ||
              end_when_idle(client, state, wake));
  }
  context.shutdown.unsubscribe(token);
  context.cancels.forget(key);
  if (state.protocol.client_left && !state.draining && state.upstream_held == 0 &&
      state.protocol.from_upstream.at_message_boundary()) {
    client.transport().close();
    // What the backend reported during the session: the reset reports what it sets back, not
    // what the server changed by itself meanwhile (a reload, a promotion's in_hot_standby).
    for (const auto& [name, value] : state.protocol.from_upstream.reported_parameters()) {
      wire::record_parameter(link->parameters, wire::ParameterStatus{name, value});
    }
    co_await context.backend_pool->give_back(database, std::move(parameters), std::move(*link));
    co_return;
  }
  if (state.draining || state.protocol.client_left) {
    // End the upstream backend's session as a client would, not with a lost connection.
    (void)co_await link->stream.write(upstream::encode_frame('X', {}));
  }
  link->stream.transport().close();
}

}  // namespace pgrelay::server
