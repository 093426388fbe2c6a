// Postgres protocol frames over a Transport: reads whole frames, writes encoded messages.
#include "upstream/message_stream.h"

#include "wire/messages.h"

namespace pgrelay::upstream {

Bytes encode_frame(char tag, ByteView body) {
  Bytes out;
  out.reserve(body.size() + 5);
  wire::append_frame(out, tag, body);
  return out;
}

awaitable<Result<wire::Frame>> MessageStream::read_frame() {
  auto view = co_await read_frame_view();
  if (!view.ok()) co_return view.error();
  co_return wire::Frame{view->tag, Bytes(view->body.begin(), view->body.end())};
}

awaitable<Result<wire::FrameView>> MessageStream::read_frame_view() {
  for (;;) {
    auto frame = reader_.next_view();
    if (!frame.ok()) co_return frame.error();
    if (frame->has_value()) co_return **frame;
    auto n = co_await transport_.read_some(asio::buffer(buffer_));
    if (!n.ok()) co_return n.error();
    reader_.feed(ByteView(buffer_.data(), *n));
  }
}

}  // namespace pgrelay::upstream
