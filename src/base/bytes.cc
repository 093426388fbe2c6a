// Big-endian byte readers and writers for network protocols.
#include "base/bytes.h"

#include <cstring>

namespace pgrelay {

void ByteWriter::cstr(std::string_view s) {
  raw(s);
  buf_.push_back(0);
}

void ByteWriter::patch_u32(std::size_t offset, std::uint32_t v) {
  store_be(buf_.data() + offset, v);
}

std::string ByteReader::cstr() {
  if (!ok_ || pos_ == data_.size()) {
    ok_ = false;
    return {};
  }
  const void* nul = std::memchr(data_.data() + pos_, 0, data_.size() - pos_);
  if (nul == nullptr) {
    ok_ = false;
    return {};
  }
  std::size_t len =
      static_cast<std::size_t>(static_cast<const std::uint8_t*>(nul) - (data_.data() + pos_));
  std::string s(reinterpret_cast<const char*>(data_.data() + pos_), len);
  pos_ += len + 1;
  return s;
}

ByteView ByteReader::bytes(std::size_t n) {
  if (!need(n)) return {};
  ByteView v = data_.subspan(pos_, n);
  pos_ += n;
  return v;
}

std::string ByteReader::string(std::size_t n) {
  ByteView v = bytes(n);
  return std::string(as_chars(v));
}

ByteView ByteReader::rest() {
  if (!ok_) return {};
  ByteView v = data_.subspan(pos_);
  pos_ = data_.size();
  return v;
}

}  // namespace pgrelay
