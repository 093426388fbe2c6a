// JSON string literals from arbitrary bytes, and the UTF-8 well-formedness they rest on.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pgrelay {

// Length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629: no overlongs, no
// surrogates, nothing past U+10FFFF), or 0 when the byte there starts none.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i);

// Whether every byte of `text` belongs to a well-formed UTF-8 sequence.
bool is_valid_utf8(std::string_view text);

// Appends `text` as a quoted JSON string: '"', '\\' and control characters (and DEL) escaped,
// a byte that starts no well-formed UTF-8 sequence replaced by U+FFFD (JSON is UTF-8), runs
// of plain bytes copied at once.
void append_json_string(std::string& out, std::string_view text);

}  // namespace pgrelay
