// CRC-32C (Castagnoli), the checksum of every log record; hardware-accelerated where available.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/bytes.h"

namespace pgrelay::log {

// Extends `crc` (the CRC of some prefix) with `n` more bytes. crc32c_extend(0, ...) starts afresh.
std::uint32_t crc32c_extend(std::uint32_t crc, const std::uint8_t* data, std::size_t n);

inline std::uint32_t crc32c(ByteView data) { return crc32c_extend(0, data.data(), data.size()); }

}  // namespace pgrelay::log
