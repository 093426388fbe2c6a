// The last lines written to a stream, kept in memory for whoever shows them later (the admin
// page's log tail).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace pgrelay {

// Thread-safe. Each line gets a sequence number, so a reader can ask for what came after the
// last line it saw.
class LineTail {
 public:
  explicit LineTail(std::size_t capacity) : capacity_(capacity) {}

  // Keeps `text` (one or more lines; a trailing newline is dropped).
  void add(std::string_view text);
  // The last `count` lines that contain `filter` (all when empty), oldest first.
  std::vector<std::string> last(std::size_t count, std::string_view filter = {}) const;
  // How many lines were ever added.
  std::uint64_t added() const;

 private:
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::deque<std::string> lines_;
  std::uint64_t added_ = 0;
};

// The last `count` lines of the file at `path` that contain `filter` (all when empty), oldest
// first, read from at most its last `window` bytes; empty when it cannot be read.
std::vector<std::string> tail_file(const std::string& path, std::size_t count,
                                   std::string_view filter = {}, std::size_t window = 1 << 20);

}  // namespace pgrelay
