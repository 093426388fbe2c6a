// Splits a composite value's text output (record_out, e.g. `NEW::text`) back into its fields.
#include "capture/trigger/record_text.h"

#include <cstring>

namespace pgrelay::capture {
namespace {

// The first of `chars` in text at or after `from`, or npos. One memchr per character, each
// stopping at the nearest found so far: a few vector scans instead of a test per byte (as
// string_view::find_first_of makes).
std::size_t find_first(std::string_view text, std::size_t from, std::string_view chars) {
  const char* begin = text.data();
  const char* nearest = begin + text.size();
  for (char c : chars) {
    const std::size_t length = static_cast<std::size_t>(nearest - (begin + from));
    if (const void* at = std::memchr(begin + from, c, length)) {
      nearest = static_cast<const char*>(at);
    }
  }
  return nearest == begin + text.size() ? std::string_view::npos
                                        : static_cast<std::size_t>(nearest - begin);
}

}  // namespace

Result<Fields> parse_record_text(std::string_view text, std::size_t expected) {
  auto malformed = [&](const char* why) {
    return Error::make(sqlstate::kDataCorrupted,
                       std::string("malformed row text in the change table: ") + why);
  };
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    return malformed("not enclosed in parentheses");
  }
  Fields out;
  out.reserve(expected);
  if (text == "()" && expected == 0) return out;
  const std::string_view body = text.substr(1, text.size() - 2);
  constexpr std::string_view kSpecial = ",\"\\";
  std::size_t i = 0;
  while (true) {
    // Most fields have no quote or backslash: the bytes up to the comma, or NULL when none.
    const std::size_t special = find_first(body, i, kSpecial);
    if (special == std::string_view::npos || body[special] == ',') {
      const std::size_t end = special == std::string_view::npos ? body.size() : special;
      if (end == i) {
        out.emplace_back(std::nullopt);
      } else {
        out.emplace_back(std::string(body.substr(i, end - i)));
      }
      if (special == std::string_view::npos) break;
      i = end + 1;
      continue;
    }
    // A quoted or escaped field (never NULL, "" included), copied a run at a time.
    std::string value(body.substr(i, special - i));
    i = special;
    while (i < body.size() && body[i] != ',') {
      if (body[i] == '"') {
        ++i;
        while (true) {
          const std::size_t stop = find_first(body, i, "\"\\");
          if (stop == std::string_view::npos) return malformed("unterminated quoted value");
          value.append(body.substr(i, stop - i));
          i = stop;
          if (body[i] == '"') {
            if (i + 1 < body.size() && body[i + 1] == '"') {
              value += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (i + 1 >= body.size()) return malformed("backslash at the end");
          value += body[i + 1];
          i += 2;
        }
      } else if (body[i] == '\\') {
        if (i + 1 >= body.size()) return malformed("backslash at the end");
        value += body[i + 1];
        i += 2;
      } else {
        const std::size_t stop = find_first(body, i, kSpecial);
        const std::size_t end = stop == std::string_view::npos ? body.size() : stop;
        value.append(body.substr(i, end - i));
        i = end;
      }
    }
    out.emplace_back(std::move(value));
    if (i >= body.size()) break;
    ++i;  // the comma
  }
  return out;
}

std::string format_record_text(const Fields& fields) {
  std::string out = "(";
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) out += ',';
    if (!fields[i]) continue;
    const std::string& v = *fields[i];
    const bool quote = v.empty() || v.find_first_of("\"\\(), \t\n\r\v\f") != std::string::npos;
    if (quote) out += '"';
    for (char c : v) {
      if (c == '"' || c == '\\') out += c;
      out += c;
    }
    if (quote) out += '"';
  }
  return out + ")";
}

}  // namespace pgrelay::capture
