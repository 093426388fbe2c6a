// Relays plain-socket pass-through sessions on one epoll thread; reads only after data came.
#include "server/relay_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <array>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <cerrno>
#include <cstring>

#include "base/thread_name.h"
#include "upstream/message_stream.h"

namespace pgrelay::server {
namespace {

constexpr std::size_t kReadBytes = 64 * 1024;
constexpr int kMaxEvents = 64;
constexpr std::uint32_t kReadEvents = EPOLLIN | EPOLLRDHUP | EPOLLET;

bool would_block(int error) {
  return error == EAGAIN || error == EWOULDBLOCK;
}

}  // namespace

// One hand-over: the session's bytes, and how its coroutine is woken when they come back.
struct RelayLoop::Ticket {
  RelayedSession session;  // the loop's from adoption until it posts the ticket back
  asio::any_io_executor executor;
  asio::steady_timer* waiter = nullptr;  // on the executor's thread only
  bool returned = false;                 // on the executor's thread only
};

// One socket of a session, as the loop last heard of it.
struct RelayLoop::Endpoint {
  Session* session = nullptr;
  int fd = -1;
  bool open = true;
  bool readable = true;  // data may be waiting: an event came since the last short read
  // The peer closed or reset: no event will follow the last data, so reads go on to the EOF.
  bool peer_closed = false;
  bool writable = true;          // no send has come back short since the last EPOLLOUT
  bool watching_writes = false;  // EPOLLOUT is in the epoll set (only while outbox waits)
  Bytes outbox;                  // to write to this socket
};

struct RelayLoop::Session {
  explicit Session(std::shared_ptr<Ticket> owner)
      : ticket(std::move(owner)),
        frames(wire::FrameReader::Phase::kRegular, ticket->session.client_limits) {
    client.session = this;
    upstream.session = this;
  }
  RelayedSession& relayed() { return ticket->session; }

  std::shared_ptr<Ticket> ticket;
  Endpoint client;
  Endpoint upstream;
  wire::FrameReader frames;  // from the client
  Bytes upstream_buffer;     // from the upstream: [0, upstream_kept) held by the filter
  std::size_t upstream_kept = 0;
  Bytes batch;           // client frames on their way upstream
  bool closing = false;  // a side hung up (or the client sent Terminate): flush, then end
  bool done = false;     // given back
};

RelayLoop::RelayLoop() = default;
RelayLoop::~RelayLoop() {
  stop();
}

Status RelayLoop::start() {
  epoll_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return Error::make("58000", std::string("epoll_create1: ") + std::strerror(errno));
  wake_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_) return Error::make("58000", std::string("eventfd: ") + std::strerror(errno));
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.ptr = nullptr;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &event) != 0) {
    return Error::make("58000", std::string("epoll_ctl: ") + std::strerror(errno));
  }
  read_buffer_.resize(kReadBytes);
  {
    std::lock_guard lock(mu_);
    running_ = true;
  }
  thread_ = start_named_thread("relay-loop", [this] { run(); });
  return {};
}

void RelayLoop::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  if (!thread_.joinable()) return;
  signal();
  thread_.join();
}

void RelayLoop::recall_all() {
  {
    std::lock_guard lock(mu_);
    if (recalling_) return;
    recalling_ = true;
  }
  signal();
}

void RelayLoop::signal() {
  const std::uint64_t one = 1;
  if (wake_) (void)!::write(wake_.get(), &one, sizeof one);
}

std::size_t RelayLoop::session_count() const {
  std::lock_guard lock(mu_);
  return session_count_;
}

upstream::awaitable<RelayedSession> RelayLoop::relay(RelayedSession session) {
  auto ticket = std::make_shared<Ticket>();
  ticket->session = std::move(session);
  ticket->executor = co_await asio::this_coro::executor;
  bool accepted = false;
  {
    std::lock_guard lock(mu_);
    if (running_ && !stopping_ && !recalling_) {
      incoming_.push_back(ticket);
      accepted = true;
    }
  }
  if (!accepted) co_return std::move(ticket->session);
  signal();
  // The loop posts the ticket back to this executor: until then it owns the session.
  asio::steady_timer waiter(ticket->executor, asio::steady_timer::time_point::max());
  ticket->waiter = &waiter;
  struct Unhook {
    Ticket& ticket;
    ~Unhook() { ticket.waiter = nullptr; }
  } unhook{*ticket};
  while (!ticket->returned) co_await waiter.async_wait(upstream::kAsTuple);
  co_return std::move(ticket->session);
}

void RelayLoop::run() {
  std::array<epoll_event, kMaxEvents> events{};
  bool stopping = false;
  while (!stopping) {
    const int n = ::epoll_wait(epoll_.get(), events.data(), kMaxEvents, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // EBADF and the like: nothing more can be waited for; give everything back
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {
        std::uint64_t count = 0;
        (void)!::read(wake_.get(), &count, sizeof count);
        take_commands();
        std::lock_guard lock(mu_);
        stopping = stopping_;
        continue;
      }
      auto& endpoint = *static_cast<Endpoint*>(events[i].data.ptr);
      Session& session = *endpoint.session;
      if (session.done) continue;  // given back earlier in this batch
      if (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) endpoint.peer_closed = true;
      if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) endpoint.readable = true;
      if (events[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) endpoint.writable = true;
      pump(session);
    }
    // Sessions given back during the batch are freed only now: a later event of the same
    // batch may still name one of their endpoints.
    retired_.clear();
  }
  // Stopped, or epoll failed: every session goes back, and none comes in from now on.
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  while (!sessions_.empty()) give_back(*sessions_.begin()->second, /*ended=*/false);
  retired_.clear();
  take_commands();  // hands back what came in meanwhile
}

void RelayLoop::take_commands() {
  std::vector<std::shared_ptr<Ticket>> incoming;
  bool recall = false;
  {
    std::lock_guard lock(mu_);
    incoming.swap(incoming_);
    recall = recalling_ || stopping_;
  }
  for (auto& ticket : incoming) {
    if (recall) {
      post_back(std::move(ticket));
    } else {
      adopt(std::move(ticket));
    }
  }
  if (!recall) return;
  // A session already hanging up finishes here: what it still writes is the last of it.
  std::vector<Session*> going;
  for (auto& [key, session] : sessions_) {
    if (!session->closing) going.push_back(key);
  }
  for (Session* session : going) give_back(*session, /*ended=*/false);
}

void RelayLoop::adopt(std::shared_ptr<Ticket> ticket) {
  auto owned = std::make_unique<Session>(std::move(ticket));
  Session& session = *owned;
  RelayedSession& relayed = session.relayed();
  session.client.fd = relayed.client.fd.get();
  session.upstream.fd = relayed.upstream.fd.get();
  session.client.outbox = std::move(relayed.to_client);
  session.upstream.outbox = std::move(relayed.to_upstream);
  session.frames.feed(relayed.from_client);
  relayed.from_client.clear();
  session.upstream_buffer.resize(upstream_buffer_bytes(relayed.from_upstream.size()));
  std::copy(relayed.from_upstream.begin(), relayed.from_upstream.end(),
            session.upstream_buffer.begin());
  session.upstream_kept = relayed.from_upstream.size();
  relayed.from_upstream.clear();

  epoll_event client_event{};
  client_event.events = kReadEvents;
  client_event.data.ptr = &session.client;
  epoll_event upstream_event{};
  upstream_event.events = kReadEvents;
  upstream_event.data.ptr = &session.upstream;
  sessions_.emplace(&session, std::move(owned));
  {
    std::lock_guard lock(mu_);
    ++session_count_;
  }
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, session.client.fd, &client_event) != 0 ||
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, session.upstream.fd, &upstream_event) != 0) {
    give_back(session, /*ended=*/false);  // the asio path can still carry it
    return;
  }
  pump(session);
}

void RelayLoop::pump(Session& session) {
  while (!session.done) {
    bool moved = flush(session, session.upstream);
    moved |= flush(session, session.client);
    if (session.done) return;
    if (session.closing) {
      if (session.client.outbox.empty() && session.upstream.outbox.empty()) {
        give_back(session, /*ended=*/true);
        return;
      }
      if (!moved) return;  // waits for EPOLLOUT
      continue;
    }
    // One direction waits while the other side has not taken what it was sent: the kernel's
    // buffers, not this loop's, hold a slow reader's backlog.
    if (session.upstream.outbox.empty()) {
      moved |= forward_client_frames(session);
      if (session.done || session.closing) continue;
      if (session.upstream.outbox.empty() && session.client.readable) {
        moved |= read_client(session);
        if (session.done || session.closing) continue;
      }
    }
    if (session.client.outbox.empty() && session.upstream.readable) {
      moved |= read_upstream(session);
    }
    if (!moved) return;
  }
}

void RelayLoop::post_back(std::shared_ptr<Ticket> ticket) {
  auto executor = ticket->executor;
  asio::post(executor, [ticket = std::move(ticket)] {
    ticket->returned = true;
    if (ticket->waiter) ticket->waiter->cancel();
  });
}

namespace {

// Adds or removes EPOLLOUT: watched only while a send came back short, so that a peer reading
// (a Unix socket reports each read as writability) does not wake the loop.
bool watch_writes(int epoll, int fd, void* endpoint, bool on) {
  epoll_event event{};
  event.events = kReadEvents | (on ? EPOLLOUT : 0u);
  event.data.ptr = endpoint;
  return ::epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &event) == 0;
}

}  // namespace

bool RelayLoop::flush(Session& session, Endpoint& to) {
  if (!to.open || to.outbox.empty() || !to.writable) return false;
  const ssize_t n = ::send(to.fd, to.outbox.data(), to.outbox.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0) {
    if (errno == EINTR) return true;
    if (!would_block(errno)) {
      hang_up(session, to);
      return true;
    }
    await_writable(session, to);
    return false;
  }
  to.outbox.erase(to.outbox.begin(), to.outbox.begin() + n);
  if (!to.outbox.empty()) {
    await_writable(session, to);
  } else if (to.watching_writes) {
    to.watching_writes = !watch_writes(epoll_.get(), to.fd, &to, false);
  }
  return true;
}

bool RelayLoop::send_or_keep(Session& session, Endpoint& to, ByteView bytes) {
  if (!to.open || bytes.empty()) return true;
  std::size_t sent = 0;
  if (to.outbox.empty() && to.writable) {
    const ssize_t n = ::send(to.fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && !would_block(errno) && errno != EINTR) {
      hang_up(session, to);
      return false;
    }
    sent = n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  if (sent == bytes.size()) return true;
  to.outbox.insert(to.outbox.end(), bytes.begin() + static_cast<std::ptrdiff_t>(sent), bytes.end());
  await_writable(session, to);
  return to.open;
}

void RelayLoop::await_writable(Session& session, Endpoint& to) {
  to.writable = false;
  if (to.watching_writes) return;
  to.watching_writes = watch_writes(epoll_.get(), to.fd, &to, true);
  if (!to.watching_writes) hang_up(session, to);  // it could never be written again
}

std::size_t RelayLoop::receive(Session& session, Endpoint& from, std::uint8_t* into,
                               std::size_t space) {
  for (;;) {
    const ssize_t n = ::recv(from.fd, into, space, MSG_DONTWAIT);
    if (n > 0) {
      // A short read drained the socket: the next data comes with an event of its own.
      if (static_cast<std::size_t>(n) < space && !from.peer_closed) from.readable = false;
      return static_cast<std::size_t>(n);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && would_block(errno)) {
      from.readable = false;
    } else {
      hang_up(session, from);  // EOF, or the connection failed
    }
    return 0;
  }
}

bool RelayLoop::read_client(Session& session) {
  const std::size_t n = receive(session, session.client, read_buffer_.data(), read_buffer_.size());
  if (n == 0) return session.closing;
  session.frames.feed(ByteView(read_buffer_.data(), n));
  forward_client_frames(session);
  return true;
}

bool RelayLoop::send_batch(Session& session) {
  RelayedSession& relayed = session.relayed();
  if (session.batch.empty()) return true;
  if (relayed.to_upstream_bytes) relayed.to_upstream_bytes->inc(session.batch.size());
  const bool open = send_or_keep(session, session.upstream, session.batch);
  session.batch.clear();
  return open;
}

bool RelayLoop::forward_client_frames(Session& session) {
  RelayedSession& relayed = session.relayed();
  bool moved = false;
  bool terminate = false;
  session.batch.clear();
  while (session.batch.size() < kClientBatchBytes) {
    auto view = session.frames.next_view();
    if (!view.ok()) {
      relayed.client_error = view.error();
      terminate = true;  // what came before the bad frame still goes upstream
      break;
    }
    if (!view->has_value()) break;
    ClientFrame frame(**view);
    if (relayed.watch_database_ddl && !databases_used_alone_in(frame).empty()) {
      // Its coroutine lets go of those databases, then sends the frame: it goes back unsent.
      if (!send_batch(session)) return true;
      Bytes rest = upstream::encode_frame(frame.tag, frame.body);
      Bytes buffered = session.frames.take_buffered();
      rest.insert(rest.end(), buffered.begin(), buffered.end());
      relayed.from_client = std::move(rest);
      give_back(session, /*ended=*/false);
      return true;
    }
    if (frame.tag == 'X' && relayed.keep_backend && session.batch.empty() &&
        relayed.state.reusable_after_terminate() && session.upstream_kept == 0 &&
        session.upstream.outbox.empty()) {
      // The client is gone; its backend, idle, goes to the pool. Whatever it sent after the
      // Terminate is dropped, as a backend would.
      (void)session.frames.take_buffered();
      relayed.from_client.clear();
      relayed.state.client_left = true;
      give_back(session, /*ended=*/false);
      return true;
    }
    append_client_frame(frame, *relayed.rewrite, relayed.source, session.batch);
    relayed.state.count_client_frame(frame.tag);
    moved = true;
    if (frame.tag == 'X') {
      terminate = true;
      break;
    }
  }
  send_batch(session);
  if (terminate) {
    hang_up(session, session.client);
    moved = true;
  }
  return moved;
}

bool RelayLoop::read_upstream(Session& session) {
  RelayedSession& relayed = session.relayed();
  Bytes& buffer = session.upstream_buffer;
  const std::size_t n = receive(session, session.upstream, buffer.data() + session.upstream_kept,
                                buffer.size() - session.upstream_kept);
  if (n == 0) return session.closing;
  if (relayed.to_client_bytes) relayed.to_client_bytes->inc(n);
  auto pass =
      relayed.state.from_upstream.process(std::span(buffer.data(), session.upstream_kept + n));
  send_or_keep(session, session.client, ByteView(buffer.data(), pass.send));
  std::memmove(buffer.data(), buffer.data() + pass.send, pass.keep);
  session.upstream_kept = pass.keep;
  return true;
}

void RelayLoop::hang_up(Session& session, Endpoint& side) {
  side.open = false;
  side.outbox.clear();
  session.closing = true;
}

void RelayLoop::give_back(Session& session, bool ended) {
  session.done = true;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, session.client.fd, nullptr);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, session.upstream.fd, nullptr);
  RelayedSession& relayed = session.relayed();
  relayed.ended = ended;
  if (ended) {
    relayed.client.fd.reset();
    relayed.upstream.fd.reset();
  } else {
    relayed.to_client = std::move(session.client.outbox);
    relayed.to_upstream = std::move(session.upstream.outbox);
    if (relayed.from_client.empty()) relayed.from_client = session.frames.take_buffered();
    relayed.from_upstream.assign(
        session.upstream_buffer.begin(),
        session.upstream_buffer.begin() + static_cast<std::ptrdiff_t>(session.upstream_kept));
  }
  auto it = sessions_.find(&session);
  retired_.push_back(std::move(it->second));
  sessions_.erase(it);
  {
    std::lock_guard lock(mu_);
    --session_count_;
  }
  post_back(std::shared_ptr<Ticket>(session.ticket));
}

}  // namespace pgrelay::server
