// Postgres protocol frames over a Transport: reads whole frames, writes encoded messages.
#pragma once

#include <array>
#include <cstdint>

#include "base/result.h"
#include "upstream/transport.h"
#include "wire/frame_reader.h"

namespace pgrelay::upstream {

// A regular-phase frame as bytes: tag, length, body (wire::append_frame appends one).
Bytes encode_frame(char tag, ByteView body);

class MessageStream {
 public:
  MessageStream(Transport transport, wire::FrameReader::Phase phase, wire::FrameLimits limits = {})
      : transport_(std::move(transport)), reader_(phase, limits) {}

  // The next whole frame. An Error on EOF, a network failure, or a malformed frame.
  awaitable<Result<wire::Frame>> read_frame();
  // As read_frame, without copying the body: the view is valid until the next read (a relay's
  // hot path forwards it at once).
  awaitable<Result<wire::FrameView>> read_frame_view();
  awaitable<Status> write(ByteView bytes) { co_return co_await transport_.write_all(bytes); }

  Transport& transport() { return transport_; }
  wire::FrameReader& reader() { return reader_; }

 private:
  Transport transport_;
  wire::FrameReader reader_;
  std::array<std::uint8_t, 16384> buffer_{};
};

}  // namespace pgrelay::upstream
