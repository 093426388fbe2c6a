// Log sequence numbers: parse and format Postgres's "X/Y" notation.
#include "wire/lsn.h"

#include <cstdio>

namespace pgrelay::wire {

namespace {

// Parses 1..8 hex digits into *out; returns false on anything else.
bool parse_hex32(std::string_view s, std::uint32_t* out) {
  if (s.empty() || s.size() > 8) return false;
  std::uint32_t v = 0;
  for (char c : s) {
    std::uint32_t d;
    if (c >= '0' && c <= '9') {
      d = static_cast<std::uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<std::uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      d = static_cast<std::uint32_t>(c - 'A' + 10);
    } else {
      return false;
    }
    v = (v << 4) | d;
  }
  *out = v;
  return true;
}

}  // namespace

std::optional<Lsn> Lsn::parse(std::string_view text) {
  auto slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::uint32_t hi = 0;
  std::uint32_t lo = 0;
  if (!parse_hex32(text.substr(0, slash), &hi) || !parse_hex32(text.substr(slash + 1), &lo)) {
    return std::nullopt;
  }
  return Lsn((static_cast<std::uint64_t>(hi) << 32) | lo);
}

std::string Lsn::to_string() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%X/%X", static_cast<unsigned>(value_ >> 32),
                static_cast<unsigned>(value_ & 0xffffffffu));
  return buf;
}

}  // namespace pgrelay::wire
