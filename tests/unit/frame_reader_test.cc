// Tests frame reassembly: chunking, phases, length bounds checked from the header, EOF handling.
#include "wire/frame_reader.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace pgrelay::wire {
namespace {

using namespace std::string_literals;
using Phase = FrameReader::Phase;

Bytes tagged(char tag, std::string_view body) {
  ByteWriter w;
  w.u8(static_cast<std::uint8_t>(tag));
  w.u32(static_cast<std::uint32_t>(body.size() + 4));
  w.raw(body);
  return std::move(w).take();
}

Bytes untagged(std::string_view body) {
  ByteWriter w;
  w.u32(static_cast<std::uint32_t>(body.size() + 4));
  w.raw(body);
  return std::move(w).take();
}

Bytes header(char tag, std::uint32_t declared) {
  ByteWriter w;
  w.u8(static_cast<std::uint8_t>(tag));
  w.u32(declared);
  return std::move(w).take();
}

Frame frame(char tag, std::string_view body) {
  return Frame{tag, Bytes(body.begin(), body.end())};
}

void append(Bytes& out, const Bytes& more) {
  out.insert(out.end(), more.begin(), more.end());
}

// Drains every complete frame, failing the test on an error.
std::vector<Frame> drain(FrameReader& reader) {
  std::vector<Frame> out;
  for (;;) {
    auto next = reader.next();
    EXPECT_TRUE(next.ok()) << next.error().message;
    if (!next.ok() || !next->has_value()) return out;
    out.push_back(std::move(**next));
  }
}

// A stream of messages of varied sizes, including empty bodies and a body longer than 64 KiB.
std::vector<Frame> sample_frames() {
  std::vector<Frame> frames;
  frames.push_back(frame('Q', std::string("SELECT 1") + '\0'));
  frames.push_back(frame('S', ""));
  frames.push_back(frame('d', std::string(70000, 'x')));
  for (int i = 0; i < 50; ++i) frames.push_back(frame('D', std::string(i, static_cast<char>(i))));
  frames.push_back(frame('Z', "I"));
  return frames;
}

Bytes serialize(const std::vector<Frame>& frames) {
  Bytes out;
  for (const auto& f : frames) {
    append(out, tagged(f.tag, std::string_view(reinterpret_cast<const char*>(f.body.data()),
                                               f.body.size())));
  }
  return out;
}

TEST(FrameReader, ReadsOneMessageAndThenWants) {
  FrameReader reader(Phase::kRegular);
  reader.feed(tagged('Q', "abc"));
  auto first = reader.next();
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ(**first, frame('Q', "abc"));
  auto second = reader.next();
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->has_value());
  EXPECT_EQ(reader.buffered(), 0u);
  EXPECT_TRUE(reader.finish_at_eof().ok());
}

TEST(FrameReader, ManyMessagesInOneChunk) {
  const auto frames = sample_frames();
  FrameReader reader(Phase::kRegular);
  reader.feed(serialize(frames));
  EXPECT_EQ(drain(reader), frames);
  EXPECT_TRUE(reader.finish_at_eof().ok());
}

TEST(FrameReader, OneByteChunks) {
  const auto frames = sample_frames();
  const Bytes stream = serialize(frames);
  FrameReader reader(Phase::kRegular);
  std::vector<Frame> got;
  for (std::uint8_t b : stream) {
    reader.feed(ByteView(&b, 1));
    for (auto& f : drain(reader)) got.push_back(std::move(f));
  }
  EXPECT_EQ(got, frames);
  EXPECT_TRUE(reader.finish_at_eof().ok());
}

TEST(FrameReader, SplitAtEveryOffsetIncludingInsideTheLengthWord) {
  Bytes stream = tagged('P', "name");
  append(stream, tagged('B', "xy"));
  const std::vector<Frame> expected = {frame('P', "name"), frame('B', "xy")};
  for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
    FrameReader reader(Phase::kRegular);
    reader.feed(ByteView(stream).first(cut));
    auto got = drain(reader);
    reader.feed(ByteView(stream).subspan(cut));
    for (auto& f : drain(reader)) got.push_back(std::move(f));
    EXPECT_EQ(got, expected) << "cut at " << cut;
  }
}

TEST(FrameReader, RandomChunkSizesOverALongStream) {
  std::vector<Frame> frames;
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    const auto len = std::uniform_int_distribution<int>(0, 300)(rng);
    frames.push_back(
        frame(static_cast<char>('a' + i % 26), std::string(len, static_cast<char>(i))));
  }
  const Bytes stream = serialize(frames);
  FrameReader reader(Phase::kRegular);
  std::vector<Frame> got;
  for (std::size_t pos = 0; pos < stream.size();) {
    const std::size_t n =
        std::min<std::size_t>(stream.size() - pos, std::uniform_int_distribution<int>(1, 700)(rng));
    reader.feed(ByteView(stream).subspan(pos, n));
    pos += n;
    for (auto& f : drain(reader)) got.push_back(std::move(f));
  }
  EXPECT_EQ(got, frames);
  EXPECT_EQ(reader.buffered(), 0u);
}

TEST(FrameReader, ViewBorrowsTheSameBytes) {
  FrameReader reader(Phase::kRegular);
  reader.feed(tagged('d', "payload"));
  auto view = reader.next_view();
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(view->has_value());
  EXPECT_EQ((*view)->tag, 'd');
  EXPECT_EQ(as_chars((*view)->body), "payload");
}

TEST(FrameReader, StartupPhaseThenRegularWithBytesAlreadyBuffered) {
  // An SSLRequest-sized startup packet, then a regular message sent before the phase switch.
  const std::string startup_body = "\x04\xd2\x16\x2f"s;
  Bytes stream = untagged(startup_body);
  append(stream, tagged('Q', "x"));
  FrameReader reader(Phase::kStartup);
  reader.feed(stream);
  auto first = reader.next();
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ(**first, frame(0, startup_body));
  EXPECT_EQ(reader.buffered(), 6u);
  reader.set_phase(Phase::kRegular);
  auto second = reader.next();
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second->has_value());
  EXPECT_EQ(**second, frame('Q', "x"));
}

TEST(FrameReader, StartupPacketSplitIntoSingleBytes) {
  const std::string body = "\x00\x03\x00\x00user\0bob\0\0"s;
  const Bytes stream = untagged(body);
  FrameReader reader(Phase::kStartup);
  std::vector<Frame> got;
  for (std::uint8_t b : stream) {
    reader.feed(ByteView(&b, 1));
    for (auto& f : drain(reader)) got.push_back(std::move(f));
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], frame(0, body));
}

TEST(FrameReader, RejectsRegularLengthBelowFour) {
  for (std::uint32_t declared : {0u, 1u, 3u}) {
    FrameReader reader(Phase::kRegular);
    reader.feed(header('Q', declared));
    auto next = reader.next();
    ASSERT_FALSE(next.ok()) << declared;
    EXPECT_EQ(next.error().sqlstate, "08P01");
    EXPECT_EQ(next.error().message, "invalid message length: message type \"Q\" declares length " +
                                        std::to_string(declared) + ", the minimum is 4");
  }
}

TEST(FrameReader, RejectsStartupLengthBelowEight) {
  for (std::uint32_t declared : {0u, 4u, 7u}) {
    FrameReader reader(Phase::kStartup);
    ByteWriter w;
    w.u32(declared);
    reader.feed(w.bytes());
    auto next = reader.next();
    ASSERT_FALSE(next.ok()) << declared;
    EXPECT_EQ(next.error().sqlstate, "08P01");
    EXPECT_EQ(next.error().message, "invalid length of startup packet: declared length " +
                                        std::to_string(declared) + ", the minimum is 8");
  }
}

TEST(FrameReader, RejectsOversizedLengthFromTheHeaderAlone) {
  // Only the 5 header bytes arrive: the error must not wait for (or buffer) the announced body.
  for (std::uint32_t declared : {0x7FFFFFFFu, 0xFFFFFFFFu, (64u << 20) + 5}) {
    FrameReader reader(Phase::kRegular);
    reader.feed(header('D', declared));
    auto next = reader.next();
    ASSERT_FALSE(next.ok()) << declared;
    EXPECT_EQ(next.error().sqlstate, "08P01");
    EXPECT_EQ(next.error().message, "invalid message length: message type \"D\" declares length " +
                                        std::to_string(declared) +
                                        ", exceeding the maximum of 67108868");
    EXPECT_EQ(reader.buffered(), 5u);
  }
}

TEST(FrameReader, AcceptsExactlyTheLimitAndRejectsOneMore) {
  FrameReader::Limits limits;
  limits.max_message_body = 10;
  FrameReader ok_reader(Phase::kRegular, limits);
  ok_reader.feed(tagged('d', std::string(10, 'z')));
  auto ok = ok_reader.next();
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->has_value());

  FrameReader bad_reader(Phase::kRegular, limits);
  bad_reader.feed(header('d', 15));
  auto bad = bad_reader.next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message,
            "invalid message length: message type \"d\" declares length 15, exceeding the "
            "maximum of 14");
}

TEST(FrameReader, StartupLimitIsPostgresTenThousandByteBody) {
  FrameReader ok_reader(Phase::kStartup);
  ok_reader.feed(untagged(std::string(10000, 'a')));
  auto ok = ok_reader.next();
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->has_value());

  FrameReader bad_reader(Phase::kStartup);
  ByteWriter w;
  w.u32(10005);
  bad_reader.feed(w.bytes());
  auto bad = bad_reader.next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().sqlstate, "08P01");
  EXPECT_EQ(bad.error().message,
            "invalid length of startup packet: declared length 10005 exceeds the maximum of 10004");
}

TEST(FrameReader, ErrorsAreSticky) {
  FrameReader reader(Phase::kRegular);
  reader.feed(header('Q', 2));
  EXPECT_FALSE(reader.next().ok());
  reader.feed(tagged('S', ""));
  EXPECT_FALSE(reader.next().ok());
  EXPECT_FALSE(reader.finish_at_eof().ok());
}

TEST(FrameReader, EofInsideLengthWord) {
  FrameReader reader(Phase::kRegular);
  reader.feed(ByteView(header('Q', 9)).first(3));
  auto next = reader.next();
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
  Status s = reader.finish_at_eof();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().sqlstate, "08P01");
  EXPECT_EQ(s.error().message, "unexpected EOF within message length word");
}

TEST(FrameReader, EofInsideBody) {
  FrameReader reader(Phase::kRegular);
  const Bytes msg = tagged('D', "0123456789");
  reader.feed(ByteView(msg).first(msg.size() - 1));
  auto next = reader.next();
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
  Status s = reader.finish_at_eof();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().sqlstate, "08P01");
  EXPECT_EQ(s.error().message, "incomplete message at end of stream");
  EXPECT_EQ(s.error().detail, "end of stream after 14 of 15 bytes of a message of type \"D\"");
}

TEST(FrameReader, EofInsideStartupPacket) {
  const Bytes msg = untagged("\x00\x03\x00\x00"s);
  for (std::size_t cut = 1; cut < msg.size(); ++cut) {
    FrameReader reader(Phase::kStartup);
    reader.feed(ByteView(msg).first(cut));
    auto next = reader.next();
    ASSERT_TRUE(next.ok());
    EXPECT_FALSE(next->has_value());
    Status s = reader.finish_at_eof();
    ASSERT_FALSE(s.ok()) << cut;
    EXPECT_EQ(s.error().message, "incomplete startup packet");
  }
}

TEST(FrameReader, EofWithUnreadCompleteMessageIsACallerBug) {
  FrameReader reader(Phase::kRegular);
  reader.feed(tagged('S', ""));
  Status s = reader.finish_at_eof();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().sqlstate, "XX000");
}

TEST(FrameReader, LargeMessageInSmallChunks) {
  const std::string body(1 << 20, 'q');
  const Bytes msg = tagged('d', body);
  FrameReader reader(Phase::kRegular);
  std::vector<Frame> got;
  for (std::size_t pos = 0; pos < msg.size(); pos += 4096) {
    reader.feed(ByteView(msg).subspan(pos, std::min<std::size_t>(4096, msg.size() - pos)));
    for (auto& f : drain(reader)) got.push_back(std::move(f));
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], frame('d', body));
}

}  // namespace
}  // namespace pgrelay::wire
