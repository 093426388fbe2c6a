// Fuzzes the row-text parser of trigger capture: no crash on any input, and what it accepts
// comes back the same after record_out's quoting.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "capture/trigger/record_text.h"

namespace {

std::string quote_like_record_out(const pgrelay::capture::Fields& fields) {
  std::string out = "(";
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) out += ',';
    if (!fields[i]) continue;
    const std::string& v = *fields[i];
    const bool quote = v.empty() || v.find_first_of("\"\\(), \t\n\r\v\f") != std::string::npos;
    if (quote) out += '"';
    for (char c : v) {
      if (c == '"' || c == '\\') out += c;
      out += c;
    }
    if (quote) out += '"';
  }
  return out + ")";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto fields = pgrelay::capture::parse_record_text(text, size % 8);
  if (!fields.ok()) return 0;
  auto again = pgrelay::capture::parse_record_text(quote_like_record_out(*fields), fields->size());
  if (!again.ok() || *again != *fields) std::abort();
  return 0;
}
