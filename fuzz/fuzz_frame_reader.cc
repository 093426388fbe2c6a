// Fuzzes FrameReader: any chunking of a stream gives the same frames, errors and end state.
//
// Input: a flags byte (bit 0: start in the startup phase, bit 1: small limits, bit 2: read the
// chunked stream with next_view()), a seed byte for the chunk sizes, then the stream. As a server
// does, the reader switches to the regular phase after a StartupMessage. Every regular frame also
// goes through the frontend and backend message parsers, which must re-encode what they accept
// to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <variant>
#include <vector>

#include "base/bytes.h"
#include "wire/backend_messages.h"
#include "wire/frame_reader.h"
#include "wire/frontend_messages.h"
#include "wire/messages.h"
#include "wire/startup.h"

namespace {

using namespace pgrelay;
using namespace pgrelay::wire;

void check(bool condition) {
  if (!condition) std::abort();
}

struct Outcome {
  std::vector<Frame> frames;
  std::vector<FrameReader::Phase> phases;  // the phase each frame was read in
  std::optional<Error> error;
  std::size_t buffered = 0;
  std::optional<Error> eof_error;
};

bool same_error(const Error& a, const Error& b) {
  return a.sqlstate == b.sqlstate && a.message == b.message && a.detail == b.detail;
}

bool same_optional_error(const std::optional<Error>& a, const std::optional<Error>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || same_error(*a, *b);
}

// Reads every complete frame, switching phase as a server does. Returns false once an error
// has been recorded.
bool drain(FrameReader& reader, bool use_view, Outcome& out) {
  for (;;) {
    const FrameReader::Phase phase = reader.phase();
    std::optional<Frame> frame;
    if (use_view) {
      auto view = reader.next_view();
      if (!view.ok()) {
        out.error = view.error();
        break;
      }
      if (!view->has_value()) return true;
      frame = Frame{(*view)->tag, Bytes((*view)->body.begin(), (*view)->body.end())};
    } else {
      auto next = reader.next();
      if (!next.ok()) {
        out.error = next.error();
        break;
      }
      if (!next->has_value()) return true;
      frame = std::move(**next);
    }
    const std::size_t limit = phase == FrameReader::Phase::kStartup
                                  ? reader.limits().max_startup_body
                                  : reader.limits().max_message_body;
    check(frame->body.size() <= limit);
    if (phase == FrameReader::Phase::kStartup) {
      check(frame->tag == 0 && frame->body.size() >= 4);
      auto packet = parse_startup_packet(frame->body);
      if (packet.ok() && std::holds_alternative<StartupMessage>(*packet)) {
        reader.set_phase(FrameReader::Phase::kRegular);
      }
    }
    out.frames.push_back(std::move(*frame));
    out.phases.push_back(phase);
  }
  // Errors are sticky.
  auto again = reader.next();
  check(!again.ok() && same_error(again.error(), *out.error));
  auto again_view = reader.next_view();
  check(!again_view.ok() && same_error(again_view.error(), *out.error));
  return false;
}

void finish(const FrameReader& reader, Outcome& out) {
  out.buffered = reader.buffered();
  Status eof = reader.finish_at_eof();
  if (!eof.ok()) out.eof_error = eof.error();
  if (out.error) check(out.eof_error && same_error(*out.eof_error, *out.error));
  if (!out.error) check(eof.ok() == (out.buffered == 0));
}

// xorshift32: chunk sizes reproducible from the seed byte.
struct Rng {
  std::uint32_t state;
  std::uint32_t next() {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  }
};

template <typename T>
void check_roundtrip(const Result<T>& parsed, char tag, ByteView body) {
  if (!parsed.ok()) {
    check(!parsed.error().message.empty());
    return;
  }
  const Bytes again = encode(*parsed);
  check(again.size() == body.size() + 5);
  check(static_cast<char>(again[0]) == tag);
  check(std::equal(body.begin(), body.end(), again.begin() + 5));
}

// Regular-phase frames through the message codecs.
void check_messages(const Frame& frame) {
  const ByteView body(frame.body);
  auto frontend = parse_frontend(frame.tag, body);
  check_roundtrip(frontend, frame.tag, body);
  if (frontend.ok()) check(tag_of(*frontend) == frame.tag);
  auto backend = parse_backend(frame.tag, body);
  check_roundtrip(backend, frame.tag, body);
  if (backend.ok()) check(tag_of(*backend) == frame.tag);
  if (frame.tag == 'p') {
    check_roundtrip(parse_password_message(body), 'p', body);
    check_roundtrip(parse_sasl_initial_response(body), 'p', body);
    check_roundtrip(parse_sasl_response(body), 'p', body);
  }
  if (frame.tag == 'R') check_roundtrip(parse_authentication(body), 'R', body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::uint8_t flags = data[0];
  const FrameReader::Phase start =
      (flags & 1) != 0 ? FrameReader::Phase::kStartup : FrameReader::Phase::kRegular;
  FrameLimits limits;
  if ((flags & 2) != 0) {
    limits.max_startup_body = 64;
    limits.max_message_body = 256;
  }
  const bool chunked_view = (flags & 4) != 0;
  const ByteView stream(data + 2, size - 2);

  // All at once.
  Outcome whole;
  {
    FrameReader reader(start, limits);
    reader.feed(stream);
    drain(reader, /*use_view=*/false, whole);
    finish(reader, whole);
  }

  // In chunks of 0 bytes to a few hundred, mostly small.
  Outcome chunked;
  {
    FrameReader reader(start, limits);
    Rng rng{0x9E3779B9u ^ (std::uint32_t{data[1]} * 0x01000193u) ^
            static_cast<std::uint32_t>(size)};
    std::size_t pos = 0;
    bool ok = true;
    while (ok && pos < stream.size()) {
      const std::uint32_t r = rng.next();
      std::size_t n = 0;
      switch (r & 3) {
        case 0:
          n = 1;
          break;
        case 1:
          n = (r >> 8) % 8;
          break;
        case 2:
          n = (r >> 8) % 64;
          break;
        default:
          n = (r >> 8) % 512;
          break;
      }
      n = std::min(n, stream.size() - pos);
      reader.feed(stream.subspan(pos, n));
      pos += n;
      ok = drain(reader, chunked_view, chunked);
    }
    finish(reader, chunked);
  }

  check(whole.frames == chunked.frames);
  check(whole.phases == chunked.phases);
  check(same_optional_error(whole.error, chunked.error));
  check(same_optional_error(whole.eof_error, chunked.eof_error));
  if (!whole.error) {
    check(whole.buffered == chunked.buffered);
    std::size_t consumed = 0;
    for (std::size_t i = 0; i < whole.frames.size(); ++i) {
      consumed +=
          whole.frames[i].body.size() + (whole.phases[i] == FrameReader::Phase::kStartup ? 4 : 5);
    }
    check(consumed + whole.buffered == stream.size());
  }

  for (std::size_t i = 0; i < whole.frames.size(); ++i) {
    if (whole.phases[i] == FrameReader::Phase::kRegular) check_messages(whole.frames[i]);
  }
  return 0;
}
