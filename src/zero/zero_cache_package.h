// Finds zero-cache: the @rocicorp/zero package an app installed, the script that starts it,
// and the Node it runs on.
#pragma once

#include <optional>
#include <string>

#include "base/result.h"

namespace pgrelay::zero {

struct ZeroCachePackage {
  std::string dir;          // the package's directory (it holds package.json)
  std::string entry;        // the zero-cache script, from package.json's "bin"
  std::string version;      // package.json's "version"
  std::string node_engine;  // package.json's engines.node, e.g. ">=22"; empty when none
};

// The package at `given` (the package's own directory, or an app directory holding
// node_modules/@rocicorp/zero); with `given` empty, node_modules/@rocicorp/zero in `cwd` or
// the nearest directory above it that has one. When there is none, 58P01 with the npm
// command that installs it.
Result<ZeroCachePackage> find_zero_cache(const std::string& given, const std::string& cwd);

// The package as its package.json in `dir` describes it.
Result<ZeroCachePackage> read_zero_cache_package(const std::string& dir);

// The Node to run zero-cache on: `given`, or `node` found on PATH; 58P01 naming --node when
// there is none.
Result<std::string> find_node(const std::string& given, const std::string& path_variable);

// The major version `node --version` printed ("v22.23.5" is 22).
std::optional<int> node_major_version(const std::string& version_output);

// The least major version an engines.node range admits, for the simple ranges packages write
// (">=22", "^22.0.0", "22.x || 24.x", ">= 20.11"); nullopt for anything else.
std::optional<int> least_major_version(const std::string& range);

}  // namespace pgrelay::zero
