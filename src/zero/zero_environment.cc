// The environment zero-cache runs with: pgrelay's databases for it, and the user's ZERO_*
// settings, which win.
#include "zero/zero_environment.h"

namespace pgrelay::zero {

std::vector<std::string> zero_cache_environment(
    const std::vector<std::string>& inherited, const std::map<std::string, std::string>& dotenv,
    const std::map<std::string, std::string>& defaults) {
  std::map<std::string, std::string> merged;
  for (const auto& entry : inherited) {
    const auto eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    merged.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  for (const auto& [name, value] : dotenv) {
    if (name.starts_with("ZERO_")) merged.emplace(name, value);
  }
  for (const auto& [name, value] : defaults) merged.emplace(name, value);
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const auto& [name, value] : merged) out.push_back(name + "=" + value);
  return out;
}

std::string environment_value(const std::vector<std::string>& environment,
                              const std::string& name) {
  const std::string prefix = name + "=";
  for (const auto& entry : environment) {
    if (entry.starts_with(prefix)) return entry.substr(prefix.size());
  }
  return {};
}

}  // namespace pgrelay::zero
