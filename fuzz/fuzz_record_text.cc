// Fuzzes the row-text parser of trigger capture: no crash on any input, and what it accepts
// comes back the same after record_out's quoting.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "capture/trigger/record_text.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto fields = pgrelay::capture::parse_record_text(text, size % 8);
  if (!fields.ok()) return 0;
  auto again = pgrelay::capture::parse_record_text(pgrelay::capture::format_record_text(*fields),
                                                   fields->size());
  if (!again.ok() || *again != *fields) std::abort();
  return 0;
}
