// Fuzzes the .env reader: any text parses or is refused with a line number, never crashes;
// what parses is printed back and parses to the same variables.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "zero/dotenv.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto vars = pgrelay::zero::parse_dotenv(text, ".env");
  if (!vars.ok()) {
    if (vars.error().message.find(", line ") == std::string::npos) std::abort();
    return 0;
  }
  // Written back with every value single-quoted where it holds no quote of its own.
  std::string again;
  for (const auto& [name, value] : *vars) {
    if (name.empty()) std::abort();
    if (value.find('\'') != std::string::npos) return 0;
    again += name + "='" + value + "'\n";
  }
  auto reparsed = pgrelay::zero::parse_dotenv(again, ".env");
  if (!reparsed.ok() || *reparsed != *vars) std::abort();
  return 0;
}
