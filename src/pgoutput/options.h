// pgoutput START_REPLICATION options: parse and check them as pgoutput_startup does.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "pgoutput/repl_command.h"

namespace pgrelay::pgoutput {

// Logical replication protocol versions (logicalproto.h).
inline constexpr std::uint32_t kProtoMinVersion = 1;
inline constexpr std::uint32_t kProtoStreamVersion = 2;
inline constexpr std::uint32_t kProtoTwoPhaseVersion = 3;
inline constexpr std::uint32_t kProtoStreamParallelVersion = 4;
// The highest version pgrelay speaks.
inline constexpr std::uint32_t kProtoMaxVersion = 4;

enum class StreamingMode { kOff, kOn, kParallel };
enum class OriginFilter { kAny, kNone };

struct PgoutputOptions {
  std::uint32_t proto_version = 0;
  std::vector<std::string> publication_names;
  bool binary = false;
  bool messages = false;
  StreamingMode streaming = StreamingMode::kOff;
  bool two_phase = false;
  OriginFilter origin = OriginFilter::kAny;
};

// parse_output_parameters: each option at most once, values checked, required options present.
Result<PgoutputOptions> parse_pgoutput_options(std::span<const PluginOption> options);

// The version checks of pgoutput_startup against what the server speaks.
Status check_pgoutput_startup(const PgoutputOptions& options,
                              std::uint32_t server_max_version = kProtoMaxVersion);

// Both of the above, in Postgres's order.
Result<PgoutputOptions> pgoutput_options_for_start(
    std::span<const PluginOption> options, std::uint32_t server_max_version = kProtoMaxVersion);

// SplitIdentifierString: separator-separated names, whitespace around them ignored, unquoted names
// downcased, "quoted" names verbatim with "" meaning ", all truncated to 63 bytes. An empty input
// gives no names; nullopt means invalid syntax (empty unquoted name, unmatched quote, junk).
std::optional<std::vector<std::string>> split_identifier_string(std::string_view text,
                                                                char separator = ',');

}  // namespace pgrelay::pgoutput
