// The deterministic workload shared by the crash-test writer and its checker.
#pragma once

#include <cstdint>
#include <string>

#include "log/change_log.h"

namespace pgrelay::log::crash {

// Transaction n's payload: its size varies from a few bytes to several records so that kills
// land inside multi-record entries too.
inline std::string payload(std::uint64_t n) {
  std::uint64_t h = n * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  std::size_t size = (h % 16 == 0) ? 100000 + h % 400000 : 16 + h % 2000;
  // A 64-byte block that depends on n, repeated: cheap to build even in a debug build, and
  // any misplaced or torn piece of another transaction's data would not match it.
  std::string block = "txn-" + std::to_string(n) + ":";
  while (block.size() < 64) block += static_cast<char>('a' + (block.size() * 7 + n) % 26);
  std::string s;
  s.reserve(size + 64);
  while (s.size() < size) s += block;
  s.resize(size);
  return s;
}

inline EntryMeta meta(std::uint64_t n) {
  EntryMeta m;
  m.kind = EntryKind::kTransaction;
  m.begin_lsn = Lsn(n * 1000);
  m.commit_lsn = Lsn(n * 1000 + 500);
  m.end_lsn = Lsn(n * 1000 + 501);
  m.commit_time = static_cast<std::int64_t>(n);
  m.xid = static_cast<std::uint32_t>(n);
  m.change_count = 1;
  return m;
}

}  // namespace pgrelay::log::crash
