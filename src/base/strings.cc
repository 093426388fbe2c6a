// Small text helpers shared by the layers: joining names for messages and logs, reading numbers.
#include "base/strings.h"

#include <charconv>

namespace pgrelay {

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

std::optional<std::uint64_t> parse_decimal(std::string_view text) {
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace pgrelay
