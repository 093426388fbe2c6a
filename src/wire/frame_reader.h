// Reassembles protocol v3 frames (startup packets, tagged messages) from arbitrary byte chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "base/bytes.h"
#include "base/result.h"

namespace pgrelay::wire {

// One complete message. tag is 0 for an untagged startup-phase packet; body excludes tag and
// length.
struct Frame {
  char tag = 0;
  Bytes body;
  bool operator==(const Frame&) const = default;
};

// A frame that borrows the reader's buffer: valid only until the next call to any non-const
// FrameReader method. Lets hot paths (replication streams, pass-through) skip a copy per message.
struct FrameView {
  char tag = 0;
  ByteView body;
};

// Limits count body bytes (declared length minus the 4-byte length word), as Postgres's own
// checks do (MAX_STARTUP_PACKET_LENGTH, pq_getmessage's maxlen). A declared length is checked
// as soon as its header arrives, before waiting for the body; memory is never reserved from it.
struct FrameLimits {
  std::size_t max_startup_body = 10000;
  std::size_t max_message_body = std::size_t{64} << 20;
};

class FrameReader {
 public:
  enum class Phase {
    kStartup,  // int32 length (including itself), then body; the caller switches phases
    kRegular,  // 1-byte tag, int32 length (including itself), then body
  };

  using Limits = FrameLimits;

  explicit FrameReader(Phase phase, Limits limits = {}) : phase_(phase), limits_(limits) {}

  // Takes effect from the next frame; bytes already buffered are read in the new phase.
  void set_phase(Phase phase) { phase_ = phase; }
  Phase phase() const { return phase_; }
  const Limits& limits() const { return limits_; }

  void feed(ByteView chunk);

  // The next complete frame, nullopt when more bytes are needed, or an 08P01 error for a length
  // out of bounds. Errors are sticky: the stream cannot be resynchronised after a bad length.
  Result<std::optional<Frame>> next();
  // As next(), without copying the body (see FrameView).
  Result<std::optional<FrameView>> next_view();

  // Call when the peer closed the stream: ok only if no partial message is left (and no unread
  // complete one, which would be a caller bug).
  Status finish_at_eof() const;

  // Bytes received but not yet returned as frames (e.g. to detect data sent before a TLS
  // handshake).
  std::size_t buffered() const { return buf_.size() - pos_; }
  // Removes and returns the bytes fed but not yet returned as frames (a relay that stops
  // parsing forwards them as they are).
  Bytes take_buffered();

 private:
  std::size_t header_size() const { return phase_ == Phase::kStartup ? 4 : 5; }
  bool length_ok(std::uint32_t declared) const;
  // Only called when !length_ok(declared).
  Error length_error(char tag, std::uint32_t declared) const;

  Bytes buf_;
  std::size_t pos_ = 0;  // start of the first unconsumed byte in buf_
  Phase phase_;
  Limits limits_;
  std::optional<Error> error_;
};

}  // namespace pgrelay::wire
