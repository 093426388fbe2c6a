// CRC-32C (Castagnoli): SSE4.2 crc32 instructions when the CPU has them, a table otherwise.
#include "log/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace pgrelay::log {

namespace {

constexpr std::uint32_t kPolynomial = 0x82F63B78;  // reflected Castagnoli polynomial

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr auto kTable = make_table();

std::uint32_t extend_portable(std::uint32_t crc, const std::uint8_t* data, std::size_t n) {
  std::uint32_t c = ~crc;
  for (std::size_t i = 0; i < n; ++i) c = kTable[(c ^ data[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t extend_sse42(std::uint32_t crc,
                                                              const std::uint8_t* data,
                                                              std::size_t n) {
  std::uint64_t c = ~crc;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, data, 8);
    c = _mm_crc32_u64(c, word);
    data += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *data++);
    --n;
  }
  return ~c32;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

std::uint32_t crc32c_extend(std::uint32_t crc, const std::uint8_t* data, std::size_t n) {
  if (n == 0) return crc;
#if defined(__x86_64__)
  if (cpu_has_sse42()) return extend_sse42(crc, data, n);
#endif
  return extend_portable(crc, data, n);
}

}  // namespace pgrelay::log
