// pgoutput START_REPLICATION options: parse and check them as pgoutput_startup does.
#include "pgoutput/options.h"

#include <limits>
#include <utility>

#include "pgoutput/repl_lexer.h"

namespace pgrelay::pgoutput {

namespace {

constexpr const char* kKnownOptionsHint =
    "pgoutput accepts proto_version, publication_names, binary, messages, streaming, two_phase "
    "and origin.";

// Postgres prints the uint32 version with %d.
std::string as_int(std::uint32_t v) {
  return std::to_string(static_cast<std::int32_t>(v));
}

Error conflicting(const std::string& name) {
  return Error::make(sqlstate::kSyntaxError, "conflicting or redundant options",
                     "Give the option \"" + name + "\" only once.");
}

bool equals_ci(std::string_view text, std::string_view lower_word) {
  if (text.size() != lower_word.size()) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != lower_word[i]) return false;
  }
  return true;
}

bool is_c_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// scanner_isspace: the SQL lexer's whitespace, which has no \v.
bool is_scanner_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

enum class UlongParse { kOk, kInvalid };

// strtoul(text, &end, 10) followed by Postgres's "errno != 0 || *end != '\0'" test: leading
// whitespace and a sign are allowed, a negative number wraps, overflow and trailing junk are
// invalid, and (a quirk kept here) the empty string reads as 0.
UlongParse parse_ulong(std::string_view text, std::uint64_t* out) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::size_t i = 0;
  while (i < text.size() && is_c_space(text[i])) ++i;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) {
    negative = text[i] == '-';
    ++i;
  }
  const std::size_t digits_start = i;
  std::uint64_t v = 0;
  bool overflow = false;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    auto d = static_cast<std::uint64_t>(text[i] - '0');
    if (v > (kMax - d) / 10) {
      overflow = true;
    } else {
      v = v * 10 + d;
    }
    ++i;
  }
  if (i == digits_start) {
    // No conversion: strtoul leaves end at the start of the text.
    *out = 0;
    return text.empty() ? UlongParse::kOk : UlongParse::kInvalid;
  }
  if (overflow || i != text.size()) return UlongParse::kInvalid;
  *out = negative ? (~v + 1) : v;
  return UlongParse::kOk;
}

Result<std::uint32_t> parse_proto_version(const PluginOption& option) {
  const std::string hint = "Request a protocol version between " + as_int(kProtoMinVersion) +
                           " and " + as_int(kProtoMaxVersion) + ", e.g. proto_version '" +
                           as_int(kProtoMaxVersion) + "'.";
  if (!option.value) {
    return Error::make(sqlstate::kSyntaxError, option.name + " requires a parameter", hint);
  }
  std::uint64_t parsed = 0;
  if (parse_ulong(*option.value, &parsed) != UlongParse::kOk) {
    return Error::make(sqlstate::kInvalidParameterValue, "invalid proto_version", hint);
  }
  if (parsed > std::numeric_limits<std::uint32_t>::max()) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "proto_version \"" + *option.value + "\" out of range", hint);
  }
  return static_cast<std::uint32_t>(parsed);
}

Result<std::vector<std::string>> parse_publication_names(const PluginOption& option) {
  const std::string hint =
      "Give a comma-separated list of publication names, e.g. publication_names "
      "'pub1,\"Pub Two\"'; double-quote names with upper case letters, spaces or commas.";
  if (!option.value) {
    return Error::make(sqlstate::kSyntaxError, option.name + " requires a parameter", hint);
  }
  auto names = split_identifier_string(*option.value, ',');
  if (!names) {
    return Error::make(sqlstate::kInvalidName, "invalid publication_names syntax", hint);
  }
  return std::move(*names);
}

// defGetStreamingMode (PG16+): a Boolean or "parallel"; no value means on.
Result<StreamingMode> parse_streaming(const PluginOption& option) {
  if (!option.value) return StreamingMode::kOn;
  const std::string& v = *option.value;
  if (equals_ci(v, "false") || equals_ci(v, "off")) return StreamingMode::kOff;
  if (equals_ci(v, "true") || equals_ci(v, "on")) return StreamingMode::kOn;
  if (equals_ci(v, "parallel")) return StreamingMode::kParallel;
  return Error::make(sqlstate::kSyntaxError,
                     option.name + " requires a Boolean value or \"parallel\"",
                     "Use true, false, on, off or parallel.");
}

Result<OriginFilter> parse_origin(const PluginOption& option) {
  if (!option.value) {
    return Error::make(sqlstate::kSyntaxError, option.name + " requires a parameter",
                       "Use origin 'any' or origin 'none'.");
  }
  if (equals_ci(*option.value, "none")) return OriginFilter::kNone;
  if (equals_ci(*option.value, "any")) return OriginFilter::kAny;
  return Error::make(sqlstate::kInvalidParameterValue,
                     "unrecognized origin value: \"" + *option.value + "\"",
                     "Use origin 'any' or origin 'none'.");
}

}  // namespace

std::optional<std::vector<std::string>> split_identifier_string(std::string_view text,
                                                                char separator) {
  text = text.substr(0, text.find('\0'));
  std::vector<std::string> names;
  std::size_t p = 0;
  const std::size_t n = text.size();
  while (p < n && is_scanner_space(text[p])) ++p;
  if (p == n) return names;

  for (bool done = false; !done;) {
    std::string name;
    if (p < n && text[p] == '"') {
      ++p;
      for (;;) {
        std::size_t close = text.find('"', p);
        if (close == std::string_view::npos) return std::nullopt;
        name.append(text.substr(p, close - p));
        if (close + 1 < n && text[close + 1] == '"') {
          name.push_back('"');
          p = close + 2;
          continue;
        }
        p = close + 1;
        break;
      }
    } else {
      const std::size_t start = p;
      while (p < n && text[p] != separator && !is_scanner_space(text[p])) ++p;
      if (p == start) return std::nullopt;
      name = downcase_identifier(text.substr(start, p - start));
    }
    while (p < n && is_scanner_space(text[p])) ++p;
    if (p < n && text[p] == separator) {
      ++p;
      while (p < n && is_scanner_space(text[p])) ++p;
    } else if (p == n) {
      done = true;
    } else {
      return std::nullopt;
    }
    name.resize(identifier_clip_length(name));
    names.push_back(std::move(name));
  }
  return names;
}

Result<PgoutputOptions> parse_pgoutput_options(std::span<const PluginOption> options) {
  PgoutputOptions out;
  bool proto_given = false;
  bool publications_given = false;
  bool binary_given = false;
  bool messages_given = false;
  bool streaming_given = false;
  bool two_phase_given = false;
  bool origin_given = false;

  auto take_boolean = [](const PluginOption& option, bool& given, bool& target) -> Status {
    if (given) return conflicting(option.name);
    given = true;
    auto value = option_boolean(option);
    if (!value.ok()) return value.error();
    target = *value;
    return Status::ok_status();
  };

  for (const PluginOption& option : options) {
    if (option.name == "proto_version") {
      if (proto_given) return conflicting(option.name);
      proto_given = true;
      auto version = parse_proto_version(option);
      if (!version.ok()) return version.error();
      out.proto_version = *version;
    } else if (option.name == "publication_names") {
      if (publications_given) return conflicting(option.name);
      publications_given = true;
      auto names = parse_publication_names(option);
      if (!names.ok()) return names.error();
      out.publication_names = std::move(names).value();
    } else if (option.name == "binary") {
      PGRELAY_TRY(take_boolean(option, binary_given, out.binary));
    } else if (option.name == "messages") {
      PGRELAY_TRY(take_boolean(option, messages_given, out.messages));
    } else if (option.name == "streaming") {
      if (streaming_given) return conflicting(option.name);
      streaming_given = true;
      auto mode = parse_streaming(option);
      if (!mode.ok()) return mode.error();
      out.streaming = *mode;
    } else if (option.name == "two_phase") {
      PGRELAY_TRY(take_boolean(option, two_phase_given, out.two_phase));
    } else if (option.name == "origin") {
      if (origin_given) return conflicting(option.name);
      origin_given = true;
      auto origin = parse_origin(option);
      if (!origin.ok()) return origin.error();
      out.origin = *origin;
    } else {
      // pgoutput reports this with elog(), hence the internal-error SQLSTATE.
      return Error::make(sqlstate::kInternalError, "unrecognized pgoutput option: " + option.name,
                         kKnownOptionsHint);
    }
  }
  if (!proto_given) {
    return Error::make(sqlstate::kInvalidParameterValue, "proto_version option missing",
                       "Add proto_version '" + as_int(kProtoMaxVersion) +
                           "' (or any version from " + as_int(kProtoMinVersion) +
                           ") to the START_REPLICATION options.");
  }
  if (!publications_given) {
    return Error::make(sqlstate::kInvalidParameterValue, "publication_names parameter missing",
                       "Add publication_names 'pub1,pub2' to the START_REPLICATION options.");
  }
  return out;
}

Status check_pgoutput_startup(const PgoutputOptions& options, std::uint32_t server_max_version) {
  const std::uint32_t v = options.proto_version;
  if (v > server_max_version) {
    return Error::make(sqlstate::kFeatureNotSupported,
                       "client sent proto_version=" + as_int(v) + " but server only supports " +
                           "protocol " + as_int(server_max_version) + " or lower",
                       "Request proto_version '" + as_int(server_max_version) + "' or lower.");
  }
  if (v < kProtoMinVersion) {
    return Error::make(sqlstate::kFeatureNotSupported,
                       "client sent proto_version=" + as_int(v) + " but server only supports " +
                           "protocol " + as_int(kProtoMinVersion) + " or higher",
                       "Request proto_version '" + as_int(kProtoMinVersion) + "' or higher.");
  }
  if (options.publication_names.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue, "publication_names parameter missing",
                       "Name at least one publication, e.g. publication_names 'pub1'.");
  }
  if (options.streaming == StreamingMode::kOn && v < kProtoStreamVersion) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "requested proto_version=" + as_int(v) +
                           " does not support streaming, need " + as_int(kProtoStreamVersion) +
                           " or higher",
                       "Request proto_version '" + as_int(kProtoStreamVersion) +
                           "' or higher, or set streaming 'off'.");
  }
  if (options.streaming == StreamingMode::kParallel && v < kProtoStreamParallelVersion) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "requested proto_version=" + as_int(v) +
                           " does not support parallel streaming, need " +
                           as_int(kProtoStreamParallelVersion) + " or higher",
                       "Request proto_version '" + as_int(kProtoStreamParallelVersion) +
                           "' or higher, or set streaming 'on'.");
  }
  if (options.two_phase && v < kProtoTwoPhaseVersion) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "requested proto_version=" + as_int(v) +
                           " does not support two-phase commit, need " +
                           as_int(kProtoTwoPhaseVersion) + " or higher",
                       "Request proto_version '" + as_int(kProtoTwoPhaseVersion) +
                           "' or higher, or set two_phase 'off'.");
  }
  return Status::ok_status();
}

Result<PgoutputOptions> pgoutput_options_for_start(std::span<const PluginOption> options,
                                                   std::uint32_t server_max_version) {
  auto parsed = parse_pgoutput_options(options);
  if (!parsed.ok()) return parsed;
  Status status = check_pgoutput_startup(*parsed, server_max_version);
  if (!status.ok()) return status.error();
  return parsed;
}

}  // namespace pgrelay::pgoutput
