// The log's manifest: which segments exist and what they hold; replaced atomically on change.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"
#include "wire/lsn.h"

namespace pgrelay::log {

using wire::Lsn;

struct SegmentInfo {
  std::uint64_t seq = 0;
  bool sealed = false;
  // Commit LSN and time of the first and last visible entry; invalid/0 while empty.
  Lsn first_lsn;
  Lsn last_lsn;
  std::int64_t first_time = 0;
  std::int64_t last_time = 0;
  std::uint64_t bytes = 0;

  bool operator==(const SegmentInfo&) const = default;
};

struct Manifest {
  std::uint64_t system_id = 0;
  std::uint64_t next_seq = 1;
  // Highest commit LSN of any entry in a removed segment: positions at or below it are gone.
  Lsn removed_through;
  std::vector<SegmentInfo> segments;  // ascending seq; the last is the active segment

  bool operator==(const Manifest&) const = default;
};

inline constexpr const char* kManifestName = "MANIFEST";

Bytes serialize_manifest(const Manifest& manifest);
// `path` names the file in errors.
Result<Manifest> parse_manifest(ByteView data, const std::string& path);

std::string segment_file_name(std::uint64_t seq);
std::string index_file_name(std::uint64_t seq);

}  // namespace pgrelay::log
