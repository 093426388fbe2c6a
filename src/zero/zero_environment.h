// The environment zero-cache runs with: pgrelay's databases for it, and the user's ZERO_*
// settings, which win.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace pgrelay::zero {

// `inherited` (NAME=VALUE, as environ has it) passed on whole; then each ZERO_* variable of
// the app's .env that the environment does not set (the environment wins, as with dotenv);
// then each of pgrelay's `defaults` that neither sets. Sorted by name.
std::vector<std::string> zero_cache_environment(const std::vector<std::string>& inherited,
                                                const std::map<std::string, std::string>& dotenv,
                                                const std::map<std::string, std::string>& defaults);

// The value of NAME in an environment made by zero_cache_environment; empty when unset.
std::string environment_value(const std::vector<std::string>& environment, const std::string& name);

}  // namespace pgrelay::zero
