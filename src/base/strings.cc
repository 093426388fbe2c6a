// Small text helpers shared by the layers: joining names for messages and logs.
#include "base/strings.h"

namespace pgrelay {

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

}  // namespace pgrelay
