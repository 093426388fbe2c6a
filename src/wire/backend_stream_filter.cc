// Follows a relayed stream of backend messages: boundaries, ReadyForQuery, notices, parameters.
#include "wire/backend_stream_filter.h"

#include <algorithm>
#include <cstring>

namespace pgrelay::wire {
namespace {

constexpr std::size_t kHeaderSize = 5;  // type byte and int32 length (which counts itself)

std::uint32_t length_at(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

}  // namespace

BackendStreamFilter::Pass BackendStreamFilter::process(std::span<std::uint8_t> chunk) {
  std::uint8_t* data = chunk.data();
  const std::size_t size = chunk.size();
  std::size_t read = 0;   // next byte to look at
  std::size_t write = 0;  // end of the bytes to forward; below `read` once something is dropped
  auto forward = [&](std::size_t count) {
    if (write != read) std::memmove(data + write, data + read, count);
    write += count;
    read += count;
  };
  while (read < size) {
    if (!tracking_) {
      forward(size - read);
      break;
    }
    if (body_left_ > 0) {
      std::size_t count = std::min(body_left_, size - read);
      forward(count);
      body_left_ -= count;
      if (body_left_ == 0 && in_ready_) {
        status_ = static_cast<char>(data[write - 1]);
        ++ready_;
        in_ready_ = false;
      }
      continue;
    }
    if (size - read < kHeaderSize) break;  // a header cut in two: wait for the rest
    char tag = static_cast<char>(data[read]);
    std::uint32_t length = length_at(data + read + 1);
    if (length < 4) {
      tracking_ = false;
      continue;
    }
    std::size_t total = 1 + std::size_t{length};
    const bool held_until_whole = (tag == 'N' && drop_notice_) || tag == ParameterStatus::kTag;
    if (held_until_whole && total <= kMaxHeldMessage) {
      if (size - read < total) break;  // hold the message until it is whole
      const ByteView body(data + read + kHeaderSize, length - 4);
      if (tag == 'N' && drop_notice_(body)) {
        read += total;
        continue;
      }
      if (tag == ParameterStatus::kTag) {
        // A malformed one passes unrecorded: the client judges it.
        if (auto status = parse_parameter_status(body); status.ok()) {
          record_parameter(reported_, std::move(*status));
        }
      }
      forward(total);
      continue;
    }
    forward(kHeaderSize);
    body_left_ = length - 4;
    in_ready_ = tag == 'Z' && body_left_ > 0;
  }
  std::size_t held = size - read;
  if (write != read && held > 0) std::memmove(data + write, data + read, held);
  return Pass{write, held};
}

}  // namespace pgrelay::wire
