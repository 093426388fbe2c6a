// Ordinary sessions: relays a client to its own upstream backend, rewriting catalog queries.
//
// Upstream to client is a byte copy: nothing the upstream says needs changing after login.
// Client to upstream goes frame by frame, because a Query or Parse naming a virtualized catalog
// object is rewritten; every other frame is forwarded as it came, in batches.
#include "server/pass_through.h"

#include <asio/experimental/awaitable_operators.hpp>

#include "server/command_result.h"
#include "server/session_start.h"
#include "upstream/upstream_login.h"
#include "wire/frontend_messages.h"

namespace pgrelay::server {
namespace {

using namespace asio::experimental::awaitable_operators;

constexpr std::size_t kBatchBytes = 64 * 1024;

// `relayed` (optional) counts the bytes: one atomic add per read, nothing more on this path.
upstream::awaitable<void> copy_upstream_to_client(upstream::Transport& from,
                                                  upstream::Transport& to, Counter* relayed) {
  std::vector<std::uint8_t> buffer(64 * 1024);
  for (;;) {
    auto n = co_await from.read_some(asio::buffer(buffer));
    if (!n.ok()) co_return;
    if (relayed) relayed->inc(*n);
    if (!(co_await to.write_all(ByteView(buffer.data(), *n))).ok()) co_return;
  }
}

// The frame to send upstream for one client frame: rewritten if it is a Query or Parse whose
// SQL names a virtualized object, else the original bytes.
void append_client_frame(const wire::Frame& frame, const SqlRewrite& rewrite, Bytes& out) {
  if (rewrite && (frame.tag == 'Q' || frame.tag == 'P')) {
    if (frame.tag == 'Q') {
      if (auto query = wire::parse_query(frame.body); query.ok()) {
        if (auto sql = rewrite(query->sql)) {
          Bytes encoded = wire::encode(wire::Query{*sql});
          out.insert(out.end(), encoded.begin(), encoded.end());
          return;
        }
      }
    } else if (auto parse = wire::parse_parse(frame.body); parse.ok()) {
      if (auto sql = rewrite(parse->sql)) {
        parse->sql = *sql;
        Bytes encoded = wire::encode(*parse);
        out.insert(out.end(), encoded.begin(), encoded.end());
        return;
      }
    }
  }
  Bytes encoded = upstream::encode_frame(frame.tag, frame.body);
  out.insert(out.end(), encoded.begin(), encoded.end());
}

upstream::awaitable<void> relay_client_to_upstream(upstream::MessageStream& client,
                                                   upstream::Transport& to,
                                                   const ServerContext& context, Counter* relayed) {
  const SqlRewrite& rewrite = context.rewrite;
  Bytes batch;
  for (;;) {
    auto frame = co_await client.read_frame();
    if (!frame.ok()) {
      if (frame.error().sqlstate == sqlstate::kProtocolViolation) {
        count(context.metrics, server_metrics::kProtocolErrors);
        if (context.logger) {
          auto peer = client.transport().peer_address();
          context.logger->warning("session closed for a protocol violation",
                                  {{"error", frame.error().message},
                                   {"host", peer ? peer->to_string() : std::string("local")}});
        }
      }
      co_return;
    }
    append_client_frame(*frame, rewrite, batch);
    bool terminate = frame->tag == 'X';
    // Forward everything already buffered in one write, so pipelined clients stay fast.
    while (!terminate && batch.size() < kBatchBytes) {
      auto more = client.reader().next();
      if (!more.ok() || !more->has_value()) break;
      append_client_frame(**more, rewrite, batch);
      terminate = (*more)->tag == 'X';
    }
    if (relayed) relayed->inc(batch.size());
    if (!(co_await to.write_all(batch)).ok()) co_return;
    batch.clear();
    if (terminate) co_return;
  }
}

}  // namespace

upstream::awaitable<void> run_pass_through(upstream::MessageStream& client,
                                           const wire::StartupMessage& startup,
                                           ServerContext& context) {
  auto link =
      co_await upstream::connect_upstream(context.upstream, std::string(startup.database()),
                                          upstream_parameters(startup), context.upstream_tls);
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
  Bytes hello = session_hello(link->parameters, key);
  Bytes early = link->stream.reader().take_buffered();  // sent by the upstream after login
  hello.insert(hello.end(), early.begin(), early.end());
  Counter* to_client = nullptr;
  Counter* to_upstream = nullptr;
  if (context.metrics) {
    to_client =
        &context.metrics->counter(server_metrics::kRelayedBytes, {{"direction", "to_client"}});
    to_upstream =
        &context.metrics->counter(server_metrics::kRelayedBytes, {{"direction", "to_upstream"}});
  }
  if ((co_await client.write(hello)).ok()) {
    co_await (copy_upstream_to_client(link->stream.transport(), client.transport(), to_client) ||
              relay_client_to_upstream(client, link->stream.transport(), context, to_upstream));
  }
  context.cancels.forget(key);
  link->stream.transport().close();
}

}  // namespace pgrelay::server
