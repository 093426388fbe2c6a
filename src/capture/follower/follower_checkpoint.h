// What a follower's log remembers of the stream it follows: the log id and the last sequence
// it applied, written as a checkpoint entry in the same batch as the entries it covers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/bytes.h"
#include "base/result.h"

namespace pgrelay::capture {

struct FollowerCheckpoint {
  std::string stream;
  std::uint64_t log_id = 0;      // the primary's log
  std::uint64_t stream_seq = 0;  // every message up to it is in the log (or was skipped)
  bool operator==(const FollowerCheckpoint&) const = default;
};

Bytes encode_follower_checkpoint(const FollowerCheckpoint& checkpoint);
// nullopt for a checkpoint written by something else (trigger or native capture): a log that
// is not a follower's. An error for one that begins as a follower's but is damaged.
Result<std::optional<FollowerCheckpoint>> decode_follower_checkpoint(ByteView data);

}  // namespace pgrelay::capture
