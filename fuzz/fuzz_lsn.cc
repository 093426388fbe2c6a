// Fuzzes LSN parsing: any text either fails to parse or round-trips through to_string().
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "wire/lsn.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto lsn = pgrelay::wire::Lsn::parse(text);
  if (lsn) {
    auto again = pgrelay::wire::Lsn::parse(lsn->to_string());
    if (!again || *again != *lsn) std::abort();
  }
  return 0;
}
