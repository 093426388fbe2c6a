// Small text helpers shared by the layers: joining names for messages and logs, reading numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pgrelay {

// The items with `separator` between them ("a, b, c" by default); empty for none.
std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");

// `text` as an unsigned decimal number, all of it; nullopt for anything else (empty, a sign,
// a space, too large).
std::optional<std::uint64_t> parse_decimal(std::string_view text);

}  // namespace pgrelay
