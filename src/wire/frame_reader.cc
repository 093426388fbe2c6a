// Reassembles protocol v3 frames (startup packets, tagged messages) from arbitrary byte chunks.
#include "wire/frame_reader.h"

#include <cstring>
#include <string>

#include "wire/messages.h"

namespace pgrelay::wire {
namespace {

std::uint32_t load_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

}  // namespace

void FrameReader::feed(ByteView chunk) {
  if (chunk.empty()) return;
  if (pos_ == buf_.size()) {
    // Everything consumed: restart at the front without moving anything.
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > 0 && pos_ >= buf_.size() - pos_) {
    // Moving the unconsumed tail costs at most what was consumed since the last compaction, so
    // the total copying stays linear in the stream size.
    const std::size_t tail = buf_.size() - pos_;
    std::memmove(buf_.data(), buf_.data() + pos_, tail);
    buf_.resize(tail);
    pos_ = 0;
  }
  buf_.insert(buf_.end(), chunk.begin(), chunk.end());
}

bool FrameReader::length_ok(std::uint32_t declared) const {
  const bool startup = phase_ == Phase::kStartup;
  const std::size_t max_body = startup ? limits_.max_startup_body : limits_.max_message_body;
  return declared >= (startup ? 8u : 4u) && declared - 4 <= max_body;
}

Error FrameReader::length_error(char tag, std::uint32_t declared) const {
  const bool startup = phase_ == Phase::kStartup;
  const std::string got = std::to_string(declared);
  if (startup) {
    // A startup packet must at least hold its length word and a 4-byte protocol/request code.
    if (declared < 8) {
      return Error::protocol("invalid length of startup packet: declared length " + got +
                             ", the minimum is 8");
    }
    return Error::protocol("invalid length of startup packet: declared length " + got +
                           " exceeds the maximum of " +
                           std::to_string(limits_.max_startup_body + 4));
  }
  if (declared < 4) {
    return Error::protocol("invalid message length: message type " + describe_tag(tag) +
                           " declares length " + got + ", the minimum is 4");
  }
  return Error::protocol("invalid message length: message type " + describe_tag(tag) +
                         " declares length " + got + ", exceeding the maximum of " +
                         std::to_string(limits_.max_message_body + 4));
}

Result<std::optional<FrameView>> FrameReader::next_view() {
  if (error_) return *error_;
  const std::size_t avail = buf_.size() - pos_;
  const std::size_t header = header_size();
  if (avail < header) return std::optional<FrameView>();

  const std::uint8_t* p = buf_.data() + pos_;
  const char tag = phase_ == Phase::kStartup ? '\0' : static_cast<char>(p[0]);
  const std::uint32_t declared = load_be32(p + header - 4);
  if (!length_ok(declared)) {
    error_ = length_error(tag, declared);
    return *error_;
  }
  // Deliberately no reserve() for the announced size: memory grows only as bytes really arrive,
  // so a peer cannot make us hold `max_message_body` per connection by sending a header alone.
  const std::size_t body_len = declared - 4;
  if (avail - header < body_len) return std::optional<FrameView>();

  FrameView frame{tag, ByteView(p + header, body_len)};
  pos_ += header + body_len;
  return std::optional<FrameView>(frame);
}

Result<std::optional<Frame>> FrameReader::next() {
  auto view = next_view();
  if (!view.ok()) return view.error();
  if (!view->has_value()) return std::optional<Frame>();
  const FrameView& v = **view;
  return std::optional<Frame>(Frame{v.tag, Bytes(v.body.begin(), v.body.end())});
}

Status FrameReader::finish_at_eof() const {
  if (error_) return *error_;
  const std::size_t avail = buf_.size() - pos_;
  if (avail == 0) return {};
  const std::size_t header = header_size();
  const bool startup = phase_ == Phase::kStartup;
  if (avail < header) {
    if (startup) {
      return Error::make(
          sqlstate::kProtocolViolation, "incomplete startup packet", {},
          "end of stream after " + std::to_string(avail) + " byte(s) of the 4-byte length word");
    }
    return Error::make(
        sqlstate::kProtocolViolation, "unexpected EOF within message length word", {},
        "end of stream after " + std::to_string(avail) + " byte(s) of the 5-byte message header");
  }
  const std::uint8_t* p = buf_.data() + pos_;
  const std::uint32_t declared = load_be32(p + header - 4);
  if (!length_ok(declared)) return length_error(startup ? '\0' : static_cast<char>(p[0]), declared);
  const std::size_t total = std::size_t{declared} + (startup ? 0 : 1);
  if (avail >= total) {
    return Error::make(sqlstate::kInternalError, "unread message left at end of stream", {},
                       "finish_at_eof() was called before next() returned all complete frames");
  }
  const std::string detail =
      "end of stream after " + std::to_string(avail) + " of " + std::to_string(total) + " bytes";
  if (startup) {
    return Error::make(sqlstate::kProtocolViolation, "incomplete startup packet", {}, detail);
  }
  return Error::make(sqlstate::kProtocolViolation, "incomplete message at end of stream", {},
                     detail + " of a message of type " + describe_tag(static_cast<char>(p[0])));
}

Bytes FrameReader::take_buffered() {
  Bytes rest(buf_.begin() + static_cast<std::ptrdiff_t>(pos_), buf_.end());
  buf_.clear();
  pos_ = 0;
  return rest;
}

}  // namespace pgrelay::wire
