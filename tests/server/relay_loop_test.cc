// RelayLoop over local socket pairs, the test playing client and upstream: frames, rewrites,
// backpressure, the hand-back before a DROP DATABASE and at shutdown, and how sessions end.
#include "server/relay_loop.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <string>
#include <thread>

#include "wire/frame_reader.h"
#include "wire/messages.h"

namespace pgrelay::server {
namespace {

using namespace std::chrono_literals;

Bytes frame(char tag, const std::string& body) {
  Bytes out;
  wire::append_frame(out, tag,
                     ByteView(reinterpret_cast<const std::uint8_t*>(body.data()), body.size()));
  return out;
}

Bytes query(const std::string& sql) {
  return frame('Q', sql + std::string(1, '\0'));
}

Bytes prefix(const Bytes& bytes, std::size_t n) {
  return Bytes(bytes.begin(), bytes.begin() + n);
}

Bytes concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

void send_all(int fd, const Bytes& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << std::strerror(errno);
    sent += static_cast<std::size_t>(n);
  }
}

// Reads exactly `n` bytes, or fewer if the peer closes or nothing comes for two seconds.
Bytes read_exactly(int fd, std::size_t n) {
  Bytes out(n);
  std::size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0) break;
    const ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  out.resize(got);
  return out;
}

// True when the peer has closed (EOF within two seconds, nothing before it).
bool closed_by_peer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 2000) <= 0) return false;
  std::uint8_t byte = 0;
  return ::recv(fd, &byte, 1, 0) == 0;
}

// Nothing arrives within 100 ms.
bool quiet(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 100) == 0;
}

// One session on a running loop: the test holds the far ends of its two sockets.
class LoopSession {
 public:
  explicit LoopSession(bool watch_drops = false, bool keep_backend = false) {
    EXPECT_TRUE(loop_.start().ok());
    rewrite_ = [](std::string_view sql, const StatementSource&) -> std::optional<std::string> {
      if (sql == "SELECT 1") return std::string("SELECT 2");
      return std::nullopt;
    };
    session_.client = pair(client_);
    session_.upstream = pair(upstream_);
    session_.rewrite = &rewrite_;
    session_.watch_database_ddl = watch_drops;
    session_.keep_backend = keep_backend;
    io_thread_ = std::thread([this] { io_.run(); });
  }
  ~LoopSession() {
    loop_.stop();
    work_.reset();
    io_.stop();
    io_thread_.join();
    ::close(client_);
    ::close(upstream_);
  }

  // Hands the session to the loop; `returned()` gives it back.
  void start() {
    asio::co_spawn(
        io_,
        [this]() -> upstream::awaitable<void> {
          returned_.set_value(co_await loop_.relay(std::move(session_)));
        },
        asio::detached);
    for (int i = 0; i < 200 && loop_.session_count() == 0; ++i) std::this_thread::sleep_for(5ms);
    ASSERT_EQ(loop_.session_count(), 1u);
  }
  RelayedSession returned() {
    auto future = returned_.get_future();
    if (future.wait_for(5s) != std::future_status::ready) {
      ADD_FAILURE() << "the session did not come back";
      loop_.stop();  // which gives it back
    }
    return future.get();
  }

  RelayLoop& loop() { return loop_; }
  int client() const { return client_; }
  int upstream() const { return upstream_; }

 private:
  static upstream::NativeSocket pair(int& far_end) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    far_end = fds[1];
    return upstream::NativeSocket{UniqueFd(fds[0]), upstream::NativeSocket::Kind::kUnix};
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  RelayLoop loop_;
  SqlRewrite rewrite_;
  RelayedSession session_;
  std::promise<RelayedSession> returned_;
  int client_ = -1;
  int upstream_ = -1;
  std::thread io_thread_;
};

TEST(RelayLoopTest, RelaysFramesSplitAnywhereAndRewritesCatalogQueries) {
  LoopSession s;
  s.start();
  const Bytes first = query("SELECT 1");
  const Bytes second = query("SELECT now()");
  // The first frame's header comes in two pieces, then the rest with the second frame.
  send_all(s.client(), prefix(first, 3));
  std::this_thread::sleep_for(20ms);
  send_all(s.client(), concat({Bytes(first.begin() + 3, first.end()), second}));
  const Bytes expected = concat({query("SELECT 2"), second});
  EXPECT_EQ(read_exactly(s.upstream(), expected.size()), expected);

  const Bytes replies = concat({frame('C', std::string("SELECT 1") + '\0'), frame('Z', "I"),
                                frame('C', std::string("SELECT 1") + '\0'), frame('Z', "I")});
  send_all(s.upstream(), prefix(replies, 7));
  std::this_thread::sleep_for(20ms);
  send_all(s.upstream(), Bytes(replies.begin() + 7, replies.end()));
  EXPECT_EQ(read_exactly(s.client(), replies.size()), replies);

  // Terminate goes upstream, then both sockets close.
  send_all(s.client(), frame('X', ""));
  EXPECT_EQ(read_exactly(s.upstream(), 5), frame('X', ""));
  EXPECT_TRUE(closed_by_peer(s.upstream()));
  EXPECT_TRUE(closed_by_peer(s.client()));
  RelayedSession back = s.returned();
  EXPECT_TRUE(back.ended);
  EXPECT_FALSE(back.client_error);
  EXPECT_EQ(back.state.replies_expected, 2u);
  EXPECT_EQ(back.state.from_upstream.ready_for_query_count(), 2u);
  EXPECT_EQ(s.loop().session_count(), 0u);
}

// Megabytes each way to peers that read only later: the loop holds what the kernel will not
// take, stops reading the other side meanwhile, and delivers every byte in order.
TEST(RelayLoopTest, SlowReadersGetEveryByteInOrder) {
  LoopSession s;
  s.start();
  Bytes to_client;
  Bytes to_upstream;
  for (int i = 0; i < 64; ++i) {
    const std::string body(64 * 1024 - 1, static_cast<char>('a' + i % 26));
    const Bytes row = frame('D', body);
    to_client.insert(to_client.end(), row.begin(), row.end());
    const Bytes copy_data = frame('d', body);
    to_upstream.insert(to_upstream.end(), copy_data.begin(), copy_data.end());
  }
  std::thread upstream_writer([&] { send_all(s.upstream(), to_client); });
  std::thread client_writer([&] { send_all(s.client(), to_upstream); });
  std::this_thread::sleep_for(300ms);  // both peers' buffers and the loop's fill up
  Bytes at_upstream;
  std::thread upstream_reader(
      [&] { at_upstream = read_exactly(s.upstream(), to_upstream.size()); });
  const Bytes at_client = read_exactly(s.client(), to_client.size());
  upstream_reader.join();
  upstream_writer.join();
  client_writer.join();
  EXPECT_TRUE(at_client == to_client) << at_client.size() << " of " << to_client.size();
  EXPECT_TRUE(at_upstream == to_upstream) << at_upstream.size() << " of " << to_upstream.size();
  // The upstream hangs up: the client is told by its socket closing.
  ::shutdown(s.upstream(), SHUT_RDWR);
  EXPECT_TRUE(closed_by_peer(s.client()));
  EXPECT_TRUE(s.returned().ended);
}

TEST(RelayLoopTest, ADropDatabaseGoesBackToItsCoroutineUnsent) {
  LoopSession s(/*watch_drops=*/true);
  s.start();
  const Bytes drop = query("DROP DATABASE other");
  const Bytes partial = prefix(query("SELECT 5"), 4);
  send_all(s.client(), concat({query("SELECT 1"), drop, partial}));
  // What came before the drop went upstream; the drop did not.
  EXPECT_EQ(read_exactly(s.upstream(), query("SELECT 2").size()), query("SELECT 2"));
  RelayedSession back = s.returned();
  EXPECT_FALSE(back.ended);
  EXPECT_EQ(back.from_client, concat({drop, partial}));
  EXPECT_TRUE(back.to_upstream.empty());
  EXPECT_EQ(back.state.replies_expected, 1u);
  EXPECT_TRUE(back.client.fd && back.upstream.fd);
  EXPECT_TRUE(quiet(s.upstream()));
}

// With keep_backend: a client that ends its session between replies leaves its backend to the
// pool, the Terminate unsent; one that ends it with a reply owed ends the backend's too.
TEST(RelayLoopTest, AnIdleClientsTerminateGivesTheBackendBackUnsent) {
  LoopSession s(/*watch_drops=*/false, /*keep_backend=*/true);
  s.start();
  send_all(s.client(), query("SELECT 5"));
  EXPECT_EQ(read_exactly(s.upstream(), query("SELECT 5").size()), query("SELECT 5"));
  const Bytes reply = concat({frame('C', std::string("SELECT 1") + '\0'), frame('Z', "I")});
  send_all(s.upstream(), reply);
  EXPECT_EQ(read_exactly(s.client(), reply.size()), reply);
  send_all(s.client(), concat({frame('X', ""), query("SELECT 6")}));
  RelayedSession back = s.returned();
  EXPECT_FALSE(back.ended);
  EXPECT_TRUE(back.state.client_left);
  EXPECT_TRUE(back.from_client.empty());  // nothing after a Terminate counts
  EXPECT_TRUE(back.to_upstream.empty());
  EXPECT_TRUE(back.client.fd && back.upstream.fd);
  EXPECT_TRUE(quiet(s.upstream()));
}

TEST(RelayLoopTest, ATerminateWithAReplyOwedEndsTheBackendToo) {
  LoopSession s(/*watch_drops=*/false, /*keep_backend=*/true);
  s.start();
  send_all(s.client(), concat({query("SELECT 5"), frame('X', "")}));
  const Bytes sent = concat({query("SELECT 5"), frame('X', "")});
  EXPECT_EQ(read_exactly(s.upstream(), sent.size()), sent);
  RelayedSession back = s.returned();
  EXPECT_TRUE(back.ended);
  EXPECT_FALSE(back.state.client_left);
}

TEST(RelayLoopTest, RecallGivesBackEveryByteInFlightAndTakesNoMore) {
  LoopSession s;
  s.start();
  // A partial frame from the client; a partial notice from the upstream, which the filter holds
  // until it is whole (it may be the warning pgrelay drops).
  const Bytes partial_query = prefix(query("SELECT 9"), 7);
  const Bytes notice = frame('N', "SWARNING");
  const Bytes partial_notice = prefix(notice, 6);
  send_all(s.client(), partial_query);
  send_all(s.upstream(), partial_notice);
  EXPECT_TRUE(quiet(s.client()));
  EXPECT_TRUE(quiet(s.upstream()));
  s.loop().recall_all();
  RelayedSession back = s.returned();
  EXPECT_FALSE(back.ended);
  EXPECT_EQ(back.from_client, partial_query);
  EXPECT_EQ(back.from_upstream, partial_notice);
  EXPECT_TRUE(back.client.fd && back.upstream.fd);
  EXPECT_EQ(s.loop().session_count(), 0u);

  // A session handed over after the recall comes straight back.
  asio::io_context io;
  RelayedSession again;
  again.from_client = partial_query;
  std::optional<RelayedSession> at_once;
  asio::co_spawn(
      io,
      [&]() -> upstream::awaitable<void> { at_once = co_await s.loop().relay(std::move(again)); },
      asio::detached);
  io.run_for(2s);
  ASSERT_TRUE(at_once);
  EXPECT_FALSE(at_once->ended);
  EXPECT_EQ(at_once->from_client, partial_query);
}

TEST(RelayLoopTest, AProtocolViolationEndsTheSessionAfterWhatCameBefore) {
  LoopSession s;
  s.start();
  const Bytes bad = {'Q', 0, 0, 0, 2};  // a length below 4
  send_all(s.client(), concat({query("SELECT 3"), bad}));
  EXPECT_EQ(read_exactly(s.upstream(), query("SELECT 3").size()), query("SELECT 3"));
  EXPECT_TRUE(closed_by_peer(s.upstream()));
  RelayedSession back = s.returned();
  EXPECT_TRUE(back.ended);
  ASSERT_TRUE(back.client_error);
  EXPECT_EQ(back.client_error->sqlstate, "08P01");
}

TEST(RelayLoopTest, TheUpstreamsLastWordsReachTheClientBeforeItsSocketCloses) {
  LoopSession s;
  s.start();
  const Bytes fatal = frame('E', std::string("SFATAL\0C57P01\0Mterminating\0\0", 29));
  send_all(s.upstream(), fatal);
  ::shutdown(s.upstream(), SHUT_RDWR);
  EXPECT_EQ(read_exactly(s.client(), fatal.size()), fatal);
  EXPECT_TRUE(closed_by_peer(s.client()));
  EXPECT_TRUE(s.returned().ended);
}

TEST(RelayLoopTest, AClientsLastFramesAndItsHangUpTogetherEndTheSession) {
  LoopSession s;
  s.start();
  send_all(s.client(), concat({query("SELECT 4"), frame('S', "")}));
  ::shutdown(s.client(), SHUT_WR);
  const Bytes expected = concat({query("SELECT 4"), frame('S', "")});
  EXPECT_EQ(read_exactly(s.upstream(), expected.size()), expected);
  EXPECT_TRUE(closed_by_peer(s.upstream()));
  RelayedSession back = s.returned();
  EXPECT_TRUE(back.ended);
  EXPECT_FALSE(back.client_error);
}

TEST(RelayLoopTest, StopGivesSessionsBackToGoOnElsewhere) {
  LoopSession s;
  s.start();
  send_all(s.client(), query("SELECT now()"));
  EXPECT_EQ(read_exactly(s.upstream(), query("SELECT now()").size()), query("SELECT now()"));
  s.loop().stop();
  RelayedSession back = s.returned();
  EXPECT_FALSE(back.ended);
  EXPECT_TRUE(back.client.fd && back.upstream.fd);
  EXPECT_EQ(back.state.replies_expected, 1u);
}

}  // namespace
}  // namespace pgrelay::server
