// Fuzzes the text[] parser of trigger capture: no crash on any input, and what it accepts
// comes back the same through array_send's format.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "capture/trigger/text_array.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view binary(reinterpret_cast<const char*>(data), size);
  auto elements = pgrelay::capture::parse_text_array(binary);
  if (!elements.ok()) return 0;
  const std::string again_bytes = pgrelay::capture::format_text_array(*elements);
  auto again = pgrelay::capture::parse_text_array(again_bytes);
  if (!again.ok() || *again != *elements) std::abort();
  return 0;
}
