// Splits a composite value's text output (record_out, e.g. `NEW::text`) back into its fields.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace pgrelay::capture {

using Fields = std::vector<std::optional<std::string>>;  // nullopt is NULL

// The fields of record_out's text for a row type with `expected` columns. record_out prints
// NULL as nothing and quotes every other value that is empty or holds a quote, backslash,
// parenthesis, comma or white space (doubling quotes and backslashes inside), so the split is
// exact. `expected` only disambiguates "()", which is both zero columns and one NULL column; the
// result may have another count (the caller checks it). XX001 for text record_out cannot print.
Result<Fields> parse_record_text(std::string_view text, std::size_t expected);

// The text record_out prints for `fields`, by the rules above: the inverse of
// parse_record_text, which its tests and fuzzing check it against.
std::string format_record_text(const Fields& fields);

}  // namespace pgrelay::capture
