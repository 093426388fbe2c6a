// Postgres protocol frames over a Transport: reads whole frames, writes encoded messages.
#include "upstream/message_stream.h"

namespace pgrelay::upstream {

Bytes encode_frame(char tag, ByteView body) {
  Bytes out;
  out.reserve(body.size() + 5);
  out.push_back(static_cast<std::uint8_t>(tag));
  auto length = static_cast<std::uint32_t>(body.size() + 4);
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<std::uint8_t>(length >> shift));
  out.insert(out.end(), body.begin(), body.end());
  return out;
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
