// Helpers for change-log tests: temporary directories and synthetic entries.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "log/change_log.h"

namespace pgrelay::log::testing {

// A fresh directory removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/pgrelay-test-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    path_ = made != nullptr ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A transaction entry whose LSNs derive from `n`, with `data` as its payload.
inline PendingEntry txn(std::uint64_t n, ByteView data) {
  EntryMeta m;
  m.kind = EntryKind::kTransaction;
  m.begin_lsn = Lsn(n * 100);
  m.commit_lsn = Lsn(n * 100 + 50);
  m.end_lsn = Lsn(n * 100 + 51);
  m.commit_time = static_cast<std::int64_t>(n) * 1000;
  m.xid = static_cast<std::uint32_t>(n);
  m.change_count = 1;
  return PendingEntry{m, data};
}

inline std::string payload_for(std::uint64_t n, std::size_t size = 40) {
  std::string s = "txn-" + std::to_string(n) + ":";
  while (s.size() < size) s += static_cast<char>('a' + (s.size() + n) % 26);
  return s;
}

}  // namespace pgrelay::log::testing
