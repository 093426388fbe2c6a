// Shared by frontend and backend messages: CopyData/CopyDone, framing, parse-error helpers.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"

namespace pgrelay::wire {

using Oid = std::uint32_t;
// 0 = text, 1 = binary; kept as the raw int16 because Postgres checks codes later, per use.
using FormatCode = std::int16_t;
inline constexpr FormatCode kTextFormat = 0;
inline constexpr FormatCode kBinaryFormat = 1;

// A frontend/backend protocol version; on the wire it is one int32, major << 16 | minor.
struct ProtocolVersion {
  std::uint16_t major = 3;
  std::uint16_t minor = 0;

  constexpr std::uint32_t code() const { return (std::uint32_t{major} << 16) | minor; }
  static constexpr ProtocolVersion from_code(std::uint32_t code) {
    return ProtocolVersion{static_cast<std::uint16_t>(code >> 16),
                           static_cast<std::uint16_t>(code & 0xFFFF)};
  }
  constexpr auto operator<=>(const ProtocolVersion&) const = default;
};

// CopyData ('d') travels in both directions, including every replication frame.
struct CopyData {
  static constexpr char kTag = 'd';
  Bytes data;
  bool operator==(const CopyData&) const = default;
};

// CopyDone ('c') travels in both directions.
struct CopyDone {
  static constexpr char kTag = 'c';
  bool operator==(const CopyDone&) const = default;
};

Bytes encode(const CopyData& m);
Bytes encode(const CopyDone& m);
Result<CopyData> parse_copy_data(ByteView body);
Result<CopyDone> parse_copy_done(ByteView body);

// A regular-phase frame whose body is known: its header (tag, then a length that counts itself
// and `body_size` bytes), or the whole frame appended to `out`, so that relaying or
// pre-framing a message copies its bytes once.
void append_frame_header(ByteWriter& w, char tag, std::size_t body_size);
void append_frame(Bytes& out, char tag, ByteView body);

// A tag as it reads in an error message: "Q" when printable, else its number.
std::string describe_tag(char tag);

namespace detail {

// Builds one framed message: optional tag, length placeholder, body; finish() patches the length.
class MessageWriter {
 public:
  // tag 0 writes an untagged (startup-phase) packet.
  explicit MessageWriter(char tag, std::size_t body_hint = 0);
  ByteWriter& body() { return w_; }
  Bytes finish() &&;

 private:
  ByteWriter w_;
  std::size_t length_at_ = 0;
};

// Writes s up to its first NUL plus a terminator, so a stray NUL can never corrupt the framing.
void put_cstr(ByteWriter& w, std::string_view s);

// Postgres's own wording (pqformat.c), with the message named in the detail.
Error insufficient_data(std::string_view what);
Error invalid_format(std::string_view what);
// Call after reading every field: a failed read means truncation, leftover bytes are trailing
// garbage.
Status check_complete(const ByteReader& r, std::string_view what);
// True when `count` items of at least `min_item_size` bytes each can still fit in what is left, so
// a hostile count is rejected before any vector is reserved.
inline bool count_fits(const ByteReader& r, std::size_t count, std::size_t min_item_size) {
  return count <= r.remaining() / min_item_size;
}
// Parses a message whose body must be empty.
Status expect_empty(ByteView body, std::string_view what);

// Format-code lists and value lists (int32 length, -1 = NULL, then bytes) behind an int16 count.
// Counts are read unsigned, as Postgres's pq_getmsgint(msg, 2) does. Readers return false on
// truncation, a negative length other than -1, or a count that cannot fit the remaining bytes.
void put_formats(ByteWriter& w, const std::vector<FormatCode>& formats);
void put_values(ByteWriter& w, const std::vector<std::optional<Bytes>>& values);
std::size_t values_size(const std::vector<std::optional<Bytes>>& values);
bool read_formats(ByteReader& r, std::vector<FormatCode>& out);
bool read_values(ByteReader& r, std::vector<std::optional<Bytes>>& out);
// A single value: int32 length (-1 = NULL), then bytes.
bool read_value(ByteReader& r, std::optional<Bytes>& out);

}  // namespace detail
}  // namespace pgrelay::wire
