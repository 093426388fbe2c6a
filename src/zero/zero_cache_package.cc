// Finds zero-cache: the @rocicorp/zero package an app installed, the script that starts it,
// and the Node it runs on.
#include "zero/zero_cache_package.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace pgrelay::zero {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPackagePath = "node_modules/@rocicorp/zero";

Error not_installed(const std::string& where) {
  return Error::make(sqlstate::kUndefinedFile, "zero-cache is not installed: " + where,
                     "Run `npm install @rocicorp/zero` in your app's directory (pgrelay zero "
                     "looks for node_modules/@rocicorp/zero there and in the directories above "
                     "it), or give its place with --zero-cache PATH.");
}

bool has_package_json(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "package.json", ec);
}

}  // namespace

Result<ZeroCachePackage> read_zero_cache_package(const std::string& dir) {
  const std::string path = dir + "/package.json";
  std::ifstream in(path);
  if (!in) return not_installed("there is no " + path);
  std::ostringstream text;
  text << in.rdbuf();
  const auto json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return Error::make(sqlstate::kDataCorrupted, path + " is not a JSON object",
                       "Install the package again: npm install @rocicorp/zero");
  }
  ZeroCachePackage out;
  out.dir = dir;
  if (json.value("name", std::string()) != "@rocicorp/zero") {
    return not_installed(path + " is not @rocicorp/zero's");
  }
  out.version = json.value("version", std::string());
  std::string bin;
  if (auto it = json.find("bin"); it != json.end()) {
    if (it->is_string()) {
      bin = it->get<std::string>();
    } else if (it->is_object() && it->contains("zero-cache") && (*it)["zero-cache"].is_string()) {
      bin = (*it)["zero-cache"].get<std::string>();
    }
  }
  if (bin.empty()) {
    return Error::make(sqlstate::kUndefinedFile,
                       path + " names no zero-cache program (\"bin\": {\"zero-cache\": ...})",
                       "Install a version of @rocicorp/zero that ships zero-cache: npm install "
                       "@rocicorp/zero@latest");
  }
  out.entry = (fs::path(dir) / bin).lexically_normal().string();
  std::error_code ec;
  if (!fs::is_regular_file(out.entry, ec)) {
    return Error::make(sqlstate::kUndefinedFile,
                       "zero-cache's program " + out.entry + " is missing",
                       "Install the package again: npm install @rocicorp/zero");
  }
  if (auto engines = json.find("engines"); engines != json.end() && engines->is_object()) {
    out.node_engine = engines->value("node", std::string());
  }
  return out;
}

Result<ZeroCachePackage> find_zero_cache(const std::string& given, const std::string& cwd) {
  if (!given.empty()) {
    std::error_code ec;
    const fs::path place = fs::absolute(given, ec);
    if (has_package_json(place / kPackagePath)) {
      return read_zero_cache_package((place / kPackagePath).string());
    }
    if (has_package_json(place)) return read_zero_cache_package(place.string());
    return not_installed("--zero-cache " + given +
                         " is neither @rocicorp/zero's directory nor an app directory holding " +
                         kPackagePath);
  }
  for (fs::path dir = fs::path(cwd);; dir = dir.parent_path()) {
    if (has_package_json(dir / kPackagePath)) {
      return read_zero_cache_package((dir / kPackagePath).string());
    }
    if (dir == dir.root_path() || dir.parent_path() == dir) break;
  }
  return not_installed("there is no " + std::string(kPackagePath) + " in " + cwd +
                       " or the directories above it");
}

Result<std::string> find_node(const std::string& given, const std::string& path_variable) {
  if (!given.empty()) {
    if (::access(given.c_str(), X_OK) == 0) return given;
    return Error::make(sqlstate::kUndefinedFile,
                       "--node " + given + " is not a program pgrelay can run",
                       "Give the path of a Node.js binary (node 22 or later for zero-cache).");
  }
  std::stringstream dirs(path_variable);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/node";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return Error::make(sqlstate::kUndefinedFile, "Node.js is not installed: no node on PATH",
                     "Install Node.js 22 or later (https://nodejs.org, or apt-get install "
                     "nodejs), or give its binary with --node PATH.");
}

std::optional<int> node_major_version(const std::string& version_output) {
  std::size_t i = version_output.find_first_of("0123456789");
  if (i == std::string::npos) return std::nullopt;
  int major = 0;
  std::size_t digits = 0;
  for (; i < version_output.size() && std::isdigit(static_cast<unsigned char>(version_output[i]));
       ++i, ++digits) {
    if (digits > 6) return std::nullopt;
    major = major * 10 + (version_output[i] - '0');
  }
  return major;
}

std::optional<int> least_major_version(const std::string& range) {
  // Each alternative of "A || B" admits its own least version; the range admits the least.
  std::optional<int> least;
  std::size_t start = 0;
  while (start <= range.size()) {
    std::size_t end = range.find("||", start);
    std::string part =
        range.substr(start, end == std::string::npos ? std::string::npos : end - start);
    part.erase(
        std::remove_if(part.begin(), part.end(), [](unsigned char c) { return std::isspace(c); }),
        part.end());
    for (const char* prefix : {">=", "^", "~", "="}) {
      if (part.starts_with(prefix)) {
        part.erase(0, std::string(prefix).size());
        break;
      }
    }
    if (part.empty() || !std::isdigit(static_cast<unsigned char>(part[0]))) return std::nullopt;
    auto major = node_major_version(part);
    if (!major) return std::nullopt;
    least = least ? std::min(*least, *major) : *major;
    if (end == std::string::npos) break;
    start = end + 2;
  }
  return least;
}

}  // namespace pgrelay::zero
