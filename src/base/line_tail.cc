// The last lines written to a stream, kept in memory for whoever shows them later (the admin
// page's log tail).
#include "base/line_tail.h"

#include <algorithm>
#include <fstream>

namespace pgrelay {

namespace {

// The last `count` of `lines` holding `filter`, oldest first.
template <typename Lines>
std::vector<std::string> last_matching(const Lines& lines, std::size_t count,
                                       std::string_view filter) {
  std::vector<std::string> out;
  for (auto it = lines.rbegin(); it != lines.rend() && out.size() < count; ++it) {
    if (filter.empty() || std::string_view(*it).find(filter) != std::string_view::npos) {
      out.push_back(*it);
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

void LineTail::add(std::string_view text) {
  if (text.ends_with('\n')) text.remove_suffix(1);
  std::lock_guard lock(mu_);
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = text.find('\n', start);
    lines_.emplace_back(text.substr(start, nl == std::string_view::npos ? nl : nl - start));
    ++added_;
    if (lines_.size() > capacity_) lines_.pop_front();
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
}

std::vector<std::string> LineTail::last(std::size_t count, std::string_view filter) const {
  std::lock_guard lock(mu_);
  return last_matching(lines_, count, filter);
}

std::uint64_t LineTail::added() const {
  std::lock_guard lock(mu_);
  return added_;
}

std::vector<std::string> tail_file(const std::string& path, std::size_t count,
                                   std::string_view filter, std::size_t window) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const std::streamoff size = in.tellg();
  const std::streamoff from =
      size > static_cast<std::streamoff>(window) ? size - static_cast<std::streamoff>(window) : 0;
  in.seekg(from);
  std::vector<std::string> lines;
  std::string line;
  if (from > 0) std::getline(in, line);  // a line cut by the window
  while (std::getline(in, line)) lines.push_back(std::move(line));
  return last_matching(lines, count, filter);
}

}  // namespace pgrelay
