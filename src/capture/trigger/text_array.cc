// Splits a text[] in PostgreSQL's binary send format (array_send) into its elements.
#include "capture/trigger/text_array.h"

#include <cstdint>

namespace pgrelay::capture {
namespace {

constexpr std::uint32_t kTextOid = 25;

// Reads big-endian 32-bit words off the front of a view.
class Words {
 public:
  explicit Words(std::string_view bytes) : bytes_(bytes) {}
  std::optional<std::int32_t> next() {
    if (bytes_.size() < 4) return std::nullopt;
    const auto* b = reinterpret_cast<const unsigned char*>(bytes_.data());
    const std::uint32_t v = (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) |
                            (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
    bytes_.remove_prefix(4);
    return static_cast<std::int32_t>(v);
  }
  std::optional<std::string_view> take(std::size_t n) {
    if (bytes_.size() < n) return std::nullopt;
    std::string_view out = bytes_.substr(0, n);
    bytes_.remove_prefix(n);
    return out;
  }
  bool done() const { return bytes_.empty(); }

 private:
  std::string_view bytes_;
};

void put_word(std::string& out, std::uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

}  // namespace

Result<TextElements> parse_text_array(std::string_view binary) {
  auto malformed = [](const char* why) {
    return Error::make(sqlstate::kDataCorrupted,
                       std::string("malformed row array in the change table: ") + why);
  };
  Words in(binary);
  auto ndim = in.next();
  auto flags = in.next();
  auto type = in.next();
  if (!ndim || !flags || !type) return malformed("truncated header");
  if (static_cast<std::uint32_t>(*type) != kTextOid) return malformed("not a text[]");
  if (*flags != 0 && *flags != 1) return malformed("unknown flags");
  TextElements out;
  if (*ndim == 0) {
    if (!in.done()) return malformed("bytes after an empty array");
    return out;
  }
  if (*ndim != 1) return malformed("more than one dimension");
  auto count = in.next();
  auto lower = in.next();
  if (!count || !lower || *count < 0) return malformed("truncated dimensions");
  // Each element takes at least its 4-byte length: a count past that is corrupt, and must not
  // size the reservation.
  if (static_cast<std::size_t>(*count) > binary.size() / 4) return malformed("count too large");
  out.reserve(static_cast<std::size_t>(*count));
  for (std::int32_t i = 0; i < *count; ++i) {
    auto length = in.next();
    if (!length) return malformed("truncated element");
    if (*length == -1) {
      if (*flags == 0) return malformed("NULL element without the null flag");
      out.emplace_back(std::nullopt);
      continue;
    }
    if (*length < 0) return malformed("negative element length");
    auto bytes = in.take(static_cast<std::size_t>(*length));
    if (!bytes) return malformed("truncated element");
    out.emplace_back(*bytes);
  }
  if (!in.done()) return malformed("bytes after the last element");
  return out;
}

std::string format_text_array(const TextElements& elements) {
  std::string out;
  bool has_null = false;
  for (const auto& e : elements) has_null = has_null || !e;
  put_word(out, elements.empty() ? 0 : 1);
  put_word(out, has_null ? 1 : 0);
  put_word(out, kTextOid);
  if (elements.empty()) return out;
  put_word(out, static_cast<std::uint32_t>(elements.size()));
  put_word(out, 1);
  for (const auto& e : elements) {
    put_word(out, e ? static_cast<std::uint32_t>(e->size()) : 0xFFFFFFFFu);
    if (e) out.append(*e);
  }
  return out;
}

}  // namespace pgrelay::capture
