// Splits a text[] in PostgreSQL's binary send format (array_send) into its elements.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace pgrelay::capture {

using TextElements = std::vector<std::optional<std::string_view>>;  // nullopt is NULL

// The elements of a one-dimensional (or empty) text[] as array_send writes it: a header of
// dimensions, a null flag and the element type, then each element's length (-1 for NULL) and
// bytes. The views point into `binary`. XX001 for anything else, so a corrupt value is named
// rather than misread.
Result<TextElements> parse_text_array(std::string_view binary);

// The binary form array_send gives `elements`: the inverse of parse_text_array, which its tests
// and fuzzing check it against.
std::string format_text_array(const TextElements& elements);

}  // namespace pgrelay::capture
