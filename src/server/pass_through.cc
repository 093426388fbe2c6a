// Ordinary sessions: relays a client to its own upstream backend, rewriting catalog queries.
//
// Upstream to client is a byte copy, followed message by message only through the headers:
// that tells when a reply is complete (for a clean end at shutdown), and lets one upstream
// notice be dropped (below). Client to upstream goes frame by frame, because a Query or Parse
// naming a virtualized catalog object is rewritten; every other frame is forwarded as it
// came, in batches.
#include "server/pass_through.h"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <cstring>

#include "server/blocking.h"
#include "server/command_result.h"
#include "server/session_start.h"
#include "server/sql_rewrite.h"
#include "upstream/upstream_login.h"
#include "wire/backend_stream_filter.h"
#include "wire/frontend_messages.h"
#include "wire/messages.h"

namespace pgrelay::server {
namespace {

using namespace asio::experimental::awaitable_operators;

constexpr std::size_t kBatchBytes = 64 * 1024;
constexpr std::size_t kCopyBufferBytes = 64 * 1024;
static_assert(kCopyBufferBytes > 2 * wire::BackendStreamFilter::kMaxHeldNotice);

// CREATE PUBLICATION warns "wal_level is insufficient to publish logical changes" on an
// upstream without wal_level=logical. Through pgrelay, publications do work and wal_level
// reads 'logical', so the warning would be false: it is dropped. Matched on the fields that
// are not translated (severity, SQLSTATE, routine), so lc_messages does not matter.
bool is_false_wal_level_warning(ByteView body) {
  auto notice = wire::parse_notice_response(body);
  return notice.ok() && notice->severity() == "WARNING" && notice->sqlstate() == "55000" &&
         notice->find(wire::error_field::kRoutine) == std::string_view("CreatePublication");
}

// What the two directions of one session know of each other, on the session's thread.
struct RelayState {
  wire::BackendStreamFilter from_upstream{is_false_wal_level_warning};
  std::uint64_t replies_expected = 0;  // Query, Sync and FunctionCall frames forwarded
  bool unsynced = false;               // extended-protocol frames forwarded since the last Sync
  bool draining = false;               // the server is shutting down
  bool woken = false;  // `wake` was cancelled on purpose (not by the session ending)

  // No reply the client waits for is still to come.
  bool idle() const {
    return !unsynced && from_upstream.ready_for_query_count() >= replies_expected &&
           from_upstream.at_message_boundary();
  }
  void count_client_frame(char tag) {
    switch (tag) {
      case 'Q':
      case 'F':
        ++replies_expected;
        break;
      case 'S':
        ++replies_expected;
        unsynced = false;
        break;
      case 'P':
      case 'B':
      case 'E':
      case 'D':
      case 'C':
      case 'H':
        unsynced = true;
        break;
      default:
        break;
    }
  }
};

void wake_up(RelayState& state, asio::steady_timer& wake) {
  state.woken = true;
  wake.cancel();
}

// Forwards `buffer[0, filled)` through the filter and keeps what it holds back at the front.
upstream::awaitable<Result<std::size_t>> forward_chunk(RelayState& state, Bytes& buffer,
                                                       std::size_t filled,
                                                       upstream::Transport& to) {
  auto pass = state.from_upstream.process(std::span(buffer.data(), filled));
  if (pass.send > 0) PGRELAY_CO_TRY(co_await to.write_all(ByteView(buffer.data(), pass.send)));
  std::memmove(buffer.data(), buffer.data() + pass.send, pass.keep);
  co_return pass.keep;
}

// `relayed` (optional) counts the bytes: one atomic add per read, nothing more on this path.
upstream::awaitable<void> copy_upstream_to_client(upstream::Transport& from,
                                                  upstream::Transport& to, Bytes buffer,
                                                  std::size_t kept, RelayState& state,
                                                  asio::steady_timer& wake, Counter* relayed) {
  for (;;) {
    auto n = co_await from.read_some(asio::buffer(buffer.data() + kept, buffer.size() - kept));
    if (!n.ok()) co_return;
    if (relayed) relayed->inc(*n);
    auto held = co_await forward_chunk(state, buffer, kept + *n, to);
    if (!held.ok()) co_return;
    kept = *held;
    if (state.draining && state.idle()) wake_up(state, wake);
  }
}

// Ends the session once the server is shutting down and no reply is in flight, with the
// FATAL a Postgres backend sends when its server shuts down.
upstream::awaitable<void> end_when_idle(upstream::MessageStream& client, RelayState& state,
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

// One client frame, with the statement of a Query or Parse parsed once: both the DROP DATABASE
// check and the catalog rewrite read it.
struct ClientFrame {
  explicit ClientFrame(wire::FrameView view) : tag(view.tag), body(view.body) {
    if (tag == 'Q') {
      if (auto parsed = wire::parse_query(body); parsed.ok()) query = std::move(*parsed);
    } else if (tag == 'P') {
      if (auto parsed = wire::parse_parse(body); parsed.ok()) parse = std::move(*parsed);
    }
  }
  const std::string* sql() const {
    if (query) return &query->sql;
    if (parse) return &parse->sql;
    return nullptr;
  }

  char tag;
  ByteView body;  // borrows the client stream's buffer: valid until its next read
  std::optional<wire::Query> query;
  std::optional<wire::Parse> parse;
};

// The frame to send upstream for one client frame: rewritten if it is a Query or Parse whose
// SQL names a virtualized object, else the original bytes.
void append_client_frame(ClientFrame& frame, const SqlRewrite& rewrite,
                         const StatementSource& source, Bytes& out) {
  if (rewrite && frame.sql()) {
    if (auto sql = rewrite(*frame.sql(), source)) {
      Bytes encoded;
      if (frame.query) {
        encoded = wire::encode(wire::Query{*sql});
      } else {
        frame.parse->sql = *sql;
        encoded = wire::encode(*frame.parse);
      }
      out.insert(out.end(), encoded.begin(), encoded.end());
      return;
    }
  }
  wire::append_frame(out, frame.tag, frame.body);
}

// The databases a Query or Parse drops (see dropped_databases).
std::vector<std::string> dropped_databases_in(const ClientFrame& frame) {
  return frame.sql() ? dropped_databases(*frame.sql()) : std::vector<std::string>();
}

// Before DROP DATABASE goes upstream, pgrelay stops capturing those databases: its own
// connections there would make the upstream refuse the drop as in use.
upstream::awaitable<void> release_databases(const std::vector<std::string>& databases,
                                            ReplicationHubs& hubs) {
  for (const auto& database : databases) {
    co_await run_blocking(hubs.blocking(), [&] { return hubs.release(database); });
  }
}

upstream::awaitable<void> relay_client_to_upstream(upstream::MessageStream& client,
                                                   upstream::Transport& to,
                                                   const ServerContext& context,
                                                   const StatementSource& source, RelayState& state,
                                                   asio::steady_timer& wake, Counter* relayed) {
  const SqlRewrite& rewrite = context.rewrite;
  Bytes batch;
  for (;;) {
    auto view = co_await client.read_frame_view();
    if (!view.ok()) {
      if (view.error().sqlstate == sqlstate::kProtocolViolation) {
        count(context.metrics, server_metrics::kProtocolErrors);
        if (context.logger) {
          auto peer = client.transport().peer_address();
          context.logger->warning("session closed for a protocol violation",
                                  {{"error", view.error().message},
                                   {"host", peer ? peer->to_string() : std::string("local")}});
        }
      }
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
      const auto dropped = context.hubs ? dropped_databases_in(frame) : std::vector<std::string>();
      if (!dropped.empty()) {
        // Sent after what came before it, once pgrelay has let go of the database. The frame's
        // view stays valid: nothing reads the client meanwhile.
        if (!batch.empty()) {
          if (relayed) relayed->inc(batch.size());
          if (!(co_await to.write_all(batch)).ok()) co_return;
          batch.clear();
        }
        co_await release_databases(dropped, *context.hubs);
      }
      append_client_frame(frame, rewrite, source, batch);
      state.count_client_frame(frame.tag);
      terminate = frame.tag == 'X';
      if (batch.size() >= kBatchBytes) break;
      auto more = client.reader().next_view();
      next = more.ok() ? *more : std::nullopt;
    }
    if (relayed) relayed->inc(batch.size());
    if (!(co_await to.write_all(batch)).ok()) co_return;
    batch.clear();
    if (terminate) co_return;
  }
}

}  // namespace

upstream::awaitable<void> run_pass_through(upstream::MessageStream& client,
                                           const wire::StartupMessage& startup, const User& user,
                                           ServerContext& context) {
  // pg_dump names itself (libpq's fallback_application_name); its dumps leave pgrelay out.
  const StatementSource source(user.replication ? SlotAccess::kGranted : SlotAccess::kDenied,
                               startup.find("application_name").value_or("") == "pg_dump");
  Result<upstream::UpstreamLink> link = upstream_absent("ordinary sessions");
  if (context.upstream) {
    link = co_await upstream::connect_upstream(*context.upstream, std::string(startup.database()),
                                               upstream_parameters(startup), context.upstream_tls);
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
  RelayState state;
  Bytes buffer = link->stream.reader().take_buffered();
  std::size_t kept = buffer.size();
  buffer.resize(std::max(kCopyBufferBytes, kept + kCopyBufferBytes / 2));
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
  }
  if (greeted) {
    co_await (copy_upstream_to_client(link->stream.transport(), client.transport(),
                                      std::move(buffer), kept, state, wake, to_client) ||
              relay_client_to_upstream(client, link->stream.transport(), context, source, state,
                                       wake, to_upstream) ||
              end_when_idle(client, state, wake));
  }
  context.shutdown.unsubscribe(token);
  context.cancels.forget(key);
  if (state.draining) {
    // End the upstream backend's session as a client would, not with a lost connection.
    (void)co_await link->stream.write(upstream::encode_frame('X', {}));
  }
  link->stream.transport().close();
}

}  // namespace pgrelay::server
