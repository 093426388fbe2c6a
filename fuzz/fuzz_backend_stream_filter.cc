// Fuzzes BackendStreamFilter: any chunking of a stream forwards what a whole-stream model does.
//
// Input: a seed byte for the chunk sizes, then the stream. Notices whose body starts with an
// even byte are dropped. The model walks the whole stream at once: complete messages pass,
// except dropped notices; a cut-off header, or a cut-off notice or ParameterStatus short enough
// to be held, stays held; any other cut-off message passes as far as it goes; a length below 4
// stops tracking. The parameters recorded are those of the whole ParameterStatus messages that
// parse.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/backend_messages.h"
#include "wire/backend_stream_filter.h"

namespace {

using pgrelay::ByteView;
using pgrelay::wire::BackendStreamFilter;

void check(bool condition) {
  if (!condition) std::abort();
}

bool drop(ByteView body) {
  return !body.empty() && body[0] % 2 == 0;
}

struct Model {
  std::vector<std::uint8_t> out;
  std::uint64_t ready = 0;
  bool boundary = true;
  pgrelay::wire::ReportedParameters reported;
};

Model model(const std::uint8_t* data, std::size_t size) {
  Model m;
  std::size_t at = 0;
  while (at < size) {
    if (size - at < 5) break;
    std::uint32_t length = (std::uint32_t{data[at + 1]} << 24) |
                           (std::uint32_t{data[at + 2]} << 16) |
                           (std::uint32_t{data[at + 3]} << 8) | data[at + 4];
    if (length < 4) {
      m.out.insert(m.out.end(), data + at, data + size);
      m.boundary = false;
      return m;
    }
    std::size_t total = 1 + std::size_t{length};
    bool whole = size - at >= total;
    const bool notice = data[at] == 'N';
    if ((notice || data[at] == 'S') && total <= BackendStreamFilter::kMaxHeldMessage) {
      if (!whole) break;
      const ByteView body(data + at + 5, length - 4);
      if (!notice || !drop(body)) m.out.insert(m.out.end(), data + at, data + at + total);
      if (!notice) {
        if (auto status = pgrelay::wire::parse_parameter_status(body); status.ok()) {
          pgrelay::wire::record_parameter(m.reported, std::move(*status));
        }
      }
      at += total;
      continue;
    }
    std::size_t end = whole ? at + total : size;
    m.out.insert(m.out.end(), data + at, data + end);
    if (!whole) {
      m.boundary = false;
      return m;
    }
    if (data[at] == 'Z' && length > 4) ++m.ready;
    at = end;
  }
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::uint32_t seed = data[0];
  const std::uint8_t* stream = data + 1;
  std::size_t stream_size = size - 1;

  BackendStreamFilter filter(drop);
  std::vector<std::uint8_t> buffer(BackendStreamFilter::kMaxHeldMessage * 2);
  std::vector<std::uint8_t> out;
  std::size_t kept = 0, fed = 0;
  while (fed < stream_size) {
    seed = seed * 1103515245u + 12345u;
    std::size_t room = buffer.size() - kept;
    check(room > 0);
    std::size_t n = std::min<std::size_t>({stream_size - fed, room, 1 + (seed >> 16) % 97});
    std::memcpy(buffer.data() + kept, stream + fed, n);
    fed += n;
    auto pass = filter.process(std::span(buffer.data(), kept + n));
    check(pass.send + pass.keep <= kept + n);
    out.insert(out.end(), buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(pass.send));
    std::memmove(buffer.data(), buffer.data() + pass.send, pass.keep);
    kept = pass.keep;
  }
  Model expected = model(stream, stream_size);
  check(out == expected.out);
  check(filter.ready_for_query_count() == expected.ready);
  check(filter.at_message_boundary() == expected.boundary);
  check(filter.reported_parameters() == expected.reported);
  return 0;
}
