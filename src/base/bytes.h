// Big-endian byte readers and writers for network protocols: bounds-checked, never over-read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pgrelay {

using Bytes = std::vector<std::uint8_t>;
using ByteView = std::span<const std::uint8_t>;

inline ByteView as_bytes(std::string_view s) {
  return ByteView(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
}
inline std::string_view as_chars(ByteView b) {
  return std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
}

// Stores `v` big-endian at `dst` (sizeof(T) bytes), for a field patched into a built frame.
template <typename T>
void store_be(std::uint8_t* dst, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    dst[i] = static_cast<std::uint8_t>(v >> (8 * (sizeof(T) - 1 - i)));
  }
}

// Appends big-endian integers, strings and raw bytes to an owned buffer.
class ByteWriter {
 public:
  ByteWriter() = default;
  explicit ByteWriter(Bytes initial) : buf_(std::move(initial)) {}

  void u8(std::uint8_t v) { buf_.push_back(v); }
  void i8(std::int8_t v) { u8(static_cast<std::uint8_t>(v)); }
  void u16(std::uint16_t v) { put(v); }
  void i16(std::int16_t v) { u16(static_cast<std::uint16_t>(v)); }
  void u32(std::uint32_t v) { put(v); }
  void i32(std::int32_t v) { u32(static_cast<std::uint32_t>(v)); }
  void u64(std::uint64_t v) { put(v); }
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  // A NUL-terminated string (the string must not itself contain NUL).
  void cstr(std::string_view s);
  void raw(ByteView b) { buf_.insert(buf_.end(), b.begin(), b.end()); }
  void raw(std::string_view s) { raw(as_bytes(s)); }

  // Overwrites a previously written big-endian u32 at `offset`.
  void patch_u32(std::size_t offset, std::uint32_t v);

  std::size_t size() const { return buf_.size(); }
  // Drops what was written past `size`.
  void truncate(std::size_t size) {
    if (size < buf_.size()) buf_.resize(size);
  }
  const Bytes& bytes() const& { return buf_; }
  Bytes take() && { return std::move(buf_); }
  Bytes take() & { return std::move(buf_); }

 private:
  // Inline and in one append: these run several times per message on every hot path.
  template <typename T>
  void put(T v) {
    std::uint8_t b[sizeof(T)];
    store_be(b, v);
    buf_.insert(buf_.end(), b, b + sizeof(T));
  }

  Bytes buf_;
};

// Reads big-endian values from a view. Every read checks bounds; a failed read leaves the
// reader in a failed state (and returns zero/empty), so a parser can read a whole message and
// check `ok()` once. It never reads past the view.
class ByteReader {
 public:
  explicit ByteReader(ByteView data) : data_(data) {}

  std::uint8_t u8() { return get<std::uint8_t>(); }
  std::int8_t i8() { return static_cast<std::int8_t>(u8()); }
  std::uint16_t u16() { return get<std::uint16_t>(); }
  std::int16_t i16() { return static_cast<std::int16_t>(u16()); }
  std::uint32_t u32() { return get<std::uint32_t>(); }
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::uint64_t u64() { return get<std::uint64_t>(); }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  // A NUL-terminated string; fails if no NUL remains.
  std::string cstr();
  // Exactly n bytes.
  ByteView bytes(std::size_t n);
  std::string string(std::size_t n);
  // Everything that is left.
  ByteView rest();

  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == data_.size(); }
  std::size_t remaining() const { return data_.size() - pos_; }
  std::size_t position() const { return pos_; }
  // Marks the reader failed (for semantic errors found by the caller).
  void fail() { ok_ = false; }

 private:
  bool need(std::size_t n) {
    if (!ok_ || data_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    return true;
  }
  // Inline, and from a local pointer so that the compiler makes it one load and a byte swap.
  template <typename T>
  T get() {
    if (!need(sizeof(T))) return 0;
    const std::uint8_t* p = data_.data() + pos_;
    T v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>((v << 8) | p[i]);
    pos_ += sizeof(T);
    return v;
  }

  ByteView data_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace pgrelay
