// MessageStream over a connected local socket pair: frames split across reads, views, errors.
#include "upstream/message_stream.h"

#include <gtest/gtest.h>

#include <string>

#include "wire/messages.h"

namespace pgrelay::upstream {
namespace {

Bytes frame(char tag, const std::string& body) {
  Bytes out;
  wire::append_frame(out, tag,
                     ByteView(reinterpret_cast<const std::uint8_t*>(body.data()), body.size()));
  return out;
}

std::string text(ByteView body) {
  return std::string(body.begin(), body.end());
}

// Runs `reader` against a MessageStream on one end of a socket pair while the test writes the
// other end in `pieces`, one write per piece (each its own read on the other side).
template <typename Reader>
void run_with_pieces(const std::vector<Bytes>& pieces, Reader reader) {
  asio::io_context io;
  unix_socket::socket ours(io), theirs(io);
  asio::local::connect_pair(ours, theirs);
  MessageStream stream(Transport(std::move(ours)), wire::FrameReader::Phase::kRegular);
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        co_await reader(stream);
        done = true;
      },
      asio::detached);
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        asio::steady_timer gap(io);
        for (const Bytes& piece : pieces) {
          co_await asio::async_write(theirs, asio::buffer(piece), kAsTuple);
          gap.expires_after(std::chrono::milliseconds(5));
          co_await gap.async_wait(kAsTuple);
        }
        theirs.close();
      },
      asio::detached);
  io.run_for(std::chrono::seconds(10));
  EXPECT_TRUE(done) << "the reader did not finish";
}

TEST(MessageStreamTest, AFrameViewIsWholeAcrossReadsSplitInItsHeaderAndBody) {
  Bytes first = frame('Q', "SELECT 1");
  Bytes second = frame('X', "");
  Bytes all = first;
  all.insert(all.end(), second.begin(), second.end());
  // Split inside the first header, inside its body, and with the second frame glued on.
  std::vector<Bytes> pieces = {Bytes(all.begin(), all.begin() + 3),
                               Bytes(all.begin() + 3, all.begin() + 9),
                               Bytes(all.begin() + 9, all.end())};
  run_with_pieces(pieces, [](MessageStream& stream) -> awaitable<void> {
    auto view = co_await stream.read_frame_view();
    EXPECT_TRUE(view.ok());
    if (!view.ok()) co_return;
    EXPECT_EQ(view->tag, 'Q');
    EXPECT_EQ(text(view->body), "SELECT 1");
    // The second frame came in the same read: it is buffered, no read needed.
    auto buffered = stream.reader().next_view();
    EXPECT_TRUE(buffered.ok() && buffered->has_value());
    if (buffered.ok() && buffered->has_value()) {
      EXPECT_EQ((*buffered)->tag, 'X');
      EXPECT_TRUE((*buffered)->body.empty());
    }
    auto after = co_await stream.read_frame_view();
    EXPECT_FALSE(after.ok()) << "EOF after the last frame is an error";
  });
}

TEST(MessageStreamTest, AFrameViewLengthOutOfBoundsIsAProtocolViolation) {
  // Declared length 2: shorter than the length word itself.
  std::vector<Bytes> pieces = {Bytes{'Q', 0, 0, 0, 2}};
  run_with_pieces(pieces, [](MessageStream& stream) -> awaitable<void> {
    auto view = co_await stream.read_frame_view();
    EXPECT_FALSE(view.ok());
    if (!view.ok()) {
      EXPECT_EQ(view.error().sqlstate, sqlstate::kProtocolViolation);
    }
  });
}

TEST(MessageStreamTest, EndOfStreamInsideAFrameViewIsAnError) {
  Bytes partial = frame('Q', "SELECT 1");
  partial.resize(partial.size() - 2);
  run_with_pieces({partial}, [](MessageStream& stream) -> awaitable<void> {
    auto view = co_await stream.read_frame_view();
    EXPECT_FALSE(view.ok());
  });
}

}  // namespace
}  // namespace pgrelay::upstream
