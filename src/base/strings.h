// Small text helpers shared by the layers: joining names for messages and logs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pgrelay {

// The items with `separator` between them ("a, b, c" by default); empty for none.
std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");

}  // namespace pgrelay
