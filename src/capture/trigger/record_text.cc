// Splits a composite value's text output (record_out, e.g. `NEW::text`) back into its fields.
#include "capture/trigger/record_text.h"

namespace pgrelay::capture {

Result<Fields> parse_record_text(std::string_view text, std::size_t expected) {
  auto malformed = [&](const char* why) {
    return Error::make(sqlstate::kDataCorrupted,
                       std::string("malformed row text in the change table: ") + why);
  };
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    return malformed("not enclosed in parentheses");
  }
  Fields out;
  if (text == "()" && expected == 0) return out;
  const std::string_view body = text.substr(1, text.size() - 2);
  std::size_t i = 0;
  while (true) {
    // One field: up to the next comma outside quotes, or the end.
    std::string value;
    bool quoted_or_escaped = false;
    bool any = false;
    while (i < body.size() && (body[i] != ',')) {
      const char c = body[i];
      if (c == '"') {
        quoted_or_escaped = true;
        ++i;
        while (true) {
          if (i >= body.size()) return malformed("unterminated quoted value");
          if (body[i] == '"') {
            if (i + 1 < body.size() && body[i + 1] == '"') {
              value += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (body[i] == '\\') {
            if (i + 1 >= body.size()) return malformed("backslash at the end");
            value += body[i + 1];
            i += 2;
            continue;
          }
          value += body[i++];
        }
      } else if (c == '\\') {
        if (i + 1 >= body.size()) return malformed("backslash at the end");
        quoted_or_escaped = true;
        value += body[i + 1];
        i += 2;
      } else {
        value += c;
        ++i;
      }
      any = true;
    }
    if (!any && !quoted_or_escaped) {
      out.emplace_back(std::nullopt);
    } else {
      out.emplace_back(std::move(value));
    }
    if (i >= body.size()) break;
    ++i;  // the comma
  }
  return out;
}

}  // namespace pgrelay::capture
