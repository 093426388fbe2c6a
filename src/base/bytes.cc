// Big-endian byte readers and writers for network protocols.
#include "base/bytes.h"

#include <cstring>

namespace pgrelay {

void ByteWriter::u16(std::uint16_t v) {
  buf_.push_back(static_cast<std::uint8_t>(v >> 8));
  buf_.push_back(static_cast<std::uint8_t>(v));
}

void ByteWriter::u32(std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) buf_.push_back(static_cast<std::uint8_t>(v >> shift));
}

void ByteWriter::u64(std::uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) buf_.push_back(static_cast<std::uint8_t>(v >> shift));
}

void ByteWriter::cstr(std::string_view s) {
  raw(s);
  buf_.push_back(0);
}

void ByteWriter::patch_u32(std::size_t offset, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_[offset + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (24 - 8 * i));
}

bool ByteReader::need(std::size_t n) {
  if (!ok_ || data_.size() - pos_ < n) {
    ok_ = false;
    return false;
  }
  return true;
}

std::uint8_t ByteReader::u8() {
  if (!need(1)) return 0;
  return data_[pos_++];
}

std::uint16_t ByteReader::u16() {
  if (!need(2)) return 0;
  std::uint16_t v = static_cast<std::uint16_t>((data_[pos_] << 8) | data_[pos_ + 1]);
  pos_ += 2;
  return v;
}

std::uint32_t ByteReader::u32() {
  if (!need(4)) return 0;
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | data_[pos_++];
  return v;
}

std::uint64_t ByteReader::u64() {
  if (!need(8)) return 0;
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | data_[pos_++];
  return v;
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
  std::size_t len = static_cast<std::size_t>(static_cast<const std::uint8_t*>(nul) - (data_.data() + pos_));
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
