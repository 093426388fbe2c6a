// Postgres protocol frames over a Transport: reads whole frames, writes encoded messages.
#include "upstream/message_stream.h"

namespace pgrelay::upstream {

Bytes encode_frame(char tag, ByteView body) {
  Bytes out;
  out.reserve(body.size() + 5);
  append_frame(out, tag, body);
  return out;
}

void append_frame(Bytes& out, char tag, ByteView body) {
  ByteWriter w(std::move(out));
  w.u8(static_cast<std::uint8_t>(tag));
  w.u32(static_cast<std::uint32_t>(body.size() + 4));
  w.raw(body);
  out = std::move(w).take();
}

awaitable<Result<wire::Frame>> MessageStream::read_frame() {
  for (;;) {
    auto frame = reader_.next();
    if (!frame.ok()) co_return frame.error();
    if (frame->has_value()) co_return std::move(**frame);
    auto n = co_await transport_.read_some(asio::buffer(buffer_));
    if (!n.ok()) co_return n.error();
    reader_.feed(ByteView(buffer_.data(), *n));
  }
}

}  // namespace pgrelay::upstream
