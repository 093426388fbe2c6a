// Log sequence numbers: parse and format Postgres's "X/Y" notation, compare, add.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pgrelay::wire {

class Lsn {
 public:
  constexpr Lsn() = default;
  constexpr explicit Lsn(std::uint64_t value) : value_(value) {}

  static constexpr Lsn invalid() { return Lsn(0); }
  // Parses "X/Y" where X and Y are 1-8 hex digits (zero padding allowed), as pg_lsn_in does.
  static std::optional<Lsn> parse(std::string_view text);

  constexpr std::uint64_t value() const { return value_; }
  constexpr bool is_valid() const { return value_ != 0; }
  // Formats as Postgres does: "%X/%X" (upper-case hex, no padding).
  std::string to_string() const;

  constexpr Lsn operator+(std::uint64_t bytes) const { return Lsn(value_ + bytes); }
  // Bytes between two positions; caller ensures *this >= other.
  constexpr std::uint64_t operator-(Lsn other) const { return value_ - other.value_; }
  constexpr auto operator<=>(const Lsn&) const = default;

 private:
  std::uint64_t value_ = 0;
};

}  // namespace pgrelay::wire
