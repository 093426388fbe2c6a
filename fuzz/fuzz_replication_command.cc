// Fuzzes the replication command grammar and pgoutput options: determinism, canonical round trip.
//
// The input is a command string. Besides parsing it twice (same result, NUL ends the command),
// an accepted command is printed back in a canonical form (every name double-quoted, every
// value a string literal) that must parse to the same command; START_REPLICATION options go
// through the pgoutput option checks, and the input also goes through the lexer and
// split_identifier_string on its own.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/bytes.h"
#include "pgoutput/decoder.h"
#include "pgoutput/encoder.h"
#include "pgoutput/options.h"
#include "pgoutput/repl_command.h"
#include "pgoutput/repl_lexer.h"

namespace {

using namespace pgrelay;
using namespace pgrelay::pgoutput;

void check(bool condition) {
  if (!condition) std::abort();
}

// ---- An unambiguous description, for comparing results ----

void put(std::string& out, std::string_view s) {
  out += std::to_string(s.size());
  out += ':';
  out += s;
  out += ';';
}

void put_generic(std::string& out, const std::vector<GenericOption>& options) {
  put(out, std::to_string(options.size()));
  for (const GenericOption& o : options) {
    put(out, o.name);
    if (!o.value) {
      put(out, "-");
    } else {
      put(out, o.value->kind == GenericOption::Value::Kind::kString ? "s" : "i");
      put(out, o.value->text);
    }
  }
}

struct Describer {
  std::string& out;
  void operator()(const IdentifySystem&) { put(out, "identify"); }
  void operator()(const Show& c) {
    put(out, "show");
    put(out, c.name);
  }
  void operator()(const TimelineHistory& c) {
    put(out, "history");
    put(out, std::to_string(c.timeline));
  }
  void operator()(const CreateReplicationSlot& c) {
    put(out, "create");
    put(out, c.slot_name);
    put(out, c.temporary ? "temp" : "perm");
    put(out, c.kind == SlotKind::kLogical ? "logical" : "physical");
    put(out, c.plugin);
    put(out, std::to_string(static_cast<int>(c.snapshot)));
    put(out,
        std::to_string(c.two_phase) + std::to_string(c.reserve_wal) + std::to_string(c.failover));
    put_generic(out, c.options);
  }
  void operator()(const ReadReplicationSlot& c) {
    put(out, "read");
    put(out, c.slot_name);
  }
  void operator()(const DropReplicationSlot& c) {
    put(out, "drop");
    put(out, c.slot_name);
    put(out, c.wait ? "wait" : "nowait");
  }
  void operator()(const AlterReplicationSlot& c) {
    put(out, "alter");
    put(out, c.slot_name);
    put_generic(out, c.options);
    put(out, c.failover ? std::to_string(*c.failover) : "-");
    put(out, c.two_phase ? std::to_string(*c.two_phase) : "-");
  }
  void operator()(const StartReplication& c) {
    put(out, "start");
    put(out, c.kind == SlotKind::kLogical ? "logical" : "physical");
    put(out, c.slot_name ? "1" + *c.slot_name : "0");
    put(out, std::to_string(c.start.value()));
    put(out, std::to_string(c.timeline));
    put(out, std::to_string(c.options.size()));
    for (const PluginOption& o : c.options) {
      put(out, o.name);
      put(out, o.value ? "1" + *o.value : "0");
    }
  }
};

std::string describe_command(const CommandVariant& command) {
  std::string out;
  std::visit(Describer{out}, command);
  return out;
}

std::string describe(const Result<ReplicationCommand>& r) {
  std::string out;
  if (!r.ok()) {
    put(out, "error");
    put(out, r.error().sqlstate);
    put(out, r.error().message);
    put(out, r.error().detail);
    put(out, r.error().hint);
    return out;
  }
  out = describe_command(r->command);
  for (const Notice& n : r->notices) {
    put(out, n.sqlstate);
    put(out, n.message);
  }
  return out;
}

// ---- The canonical form of an accepted command ----

// Names never contain '"' (the scanner has no escape for it) nor NUL.
std::string ident(std::string_view name) {
  check(name.find('"') == std::string_view::npos && name.find('\0') == std::string_view::npos);
  check(name.size() < kNameDataLen);
  return "\"" + std::string(name) + "\"";
}

std::string literal(std::string_view value) {
  check(value.find('\0') == std::string_view::npos);
  std::string out = "'";
  for (char c : value) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

// A dotted name: each part double-quoted. A quoted part may itself hold dots, which only splits
// it differently; the joined name stays the same.
std::string dotted(std::string_view name) {
  std::string out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = name.find('.', start);
    out += ident(name.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return out;
    out += '.';
    start = dot + 1;
  }
}

std::string generic_options(const std::vector<GenericOption>& options) {
  std::string out = " (";
  for (std::size_t i = 0; i < options.size(); ++i) {
    if (i > 0) out += ", ";
    out += ident(options[i].name);
    const auto& value = options[i].value;
    if (!value) continue;
    if (value->kind == GenericOption::Value::Kind::kString) {
      out += " " + literal(value->text);
    } else {
      // An integer value is the UCONST read as int32: print the unsigned number it came from.
      const long long v = std::stoll(value->text);
      check(v >= INT32_MIN && v <= INT32_MAX);
      out += " " + std::to_string(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)));
    }
  }
  return out + ")";
}

struct Printer {
  std::string operator()(const IdentifySystem&) { return "IDENTIFY_SYSTEM"; }
  std::string operator()(const Show& c) { return "SHOW " + dotted(c.name); }
  std::string operator()(const TimelineHistory& c) {
    check(c.timeline != 0);
    return "TIMELINE_HISTORY " + std::to_string(c.timeline);
  }
  std::string operator()(const CreateReplicationSlot& c) {
    std::string out = "CREATE_REPLICATION_SLOT " + ident(c.slot_name);
    if (c.temporary) out += " TEMPORARY";
    if (c.kind == SlotKind::kLogical) {
      out += " LOGICAL " + ident(c.plugin);
    } else {
      check(c.plugin.empty());
      out += " PHYSICAL";
    }
    if (!c.options.empty()) out += generic_options(c.options);
    return out;
  }
  std::string operator()(const ReadReplicationSlot& c) {
    return "READ_REPLICATION_SLOT " + dotted(c.slot_name);
  }
  std::string operator()(const DropReplicationSlot& c) {
    return "DROP_REPLICATION_SLOT " + ident(c.slot_name) + (c.wait ? " WAIT" : "");
  }
  std::string operator()(const AlterReplicationSlot& c) {
    check(!c.options.empty());
    return "ALTER_REPLICATION_SLOT " + ident(c.slot_name) + generic_options(c.options);
  }
  std::string operator()(const StartReplication& c) {
    std::string out = "START_REPLICATION";
    if (c.kind == SlotKind::kLogical) {
      check(c.slot_name.has_value() && c.timeline == 0);
      out += " SLOT " + ident(*c.slot_name) + " LOGICAL " + c.start.to_string();
      if (!c.options.empty()) {
        out += " (";
        for (std::size_t i = 0; i < c.options.size(); ++i) {
          if (i > 0) out += ", ";
          out += ident(c.options[i].name);
          if (c.options[i].value) out += " " + literal(*c.options[i].value);
        }
        out += ")";
      }
      return out;
    }
    check(c.options.empty());
    if (c.slot_name) out += " SLOT " + ident(*c.slot_name);
    out += " PHYSICAL " + c.start.to_string();
    if (c.timeline != 0) out += " TIMELINE " + std::to_string(c.timeline);
    return out;
  }
};

// ---- pgoutput options ----

std::string quoted_list(const std::vector<std::string>& names, char separator = ',') {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += separator;
    out += '"';
    for (char c : names[i]) {
      out += c;
      if (c == '"') out += '"';
    }
    out += '"';
  }
  return out;
}

// Names split from any text re-split identically once quoted (they are already truncated).
void check_split(std::string_view text, char separator) {
  auto names = split_identifier_string(text, separator);
  if (!names) return;
  for (const std::string& n : *names) {
    check(n.size() < kNameDataLen);
    check(n.find('\0') == std::string::npos);
  }
  auto again = split_identifier_string(quoted_list(*names, separator), separator);
  check(again.has_value() && *again == *names);
}

bool same_options(const PgoutputOptions& a, const PgoutputOptions& b) {
  return a.proto_version == b.proto_version && a.publication_names == b.publication_names &&
         a.binary == b.binary && a.messages == b.messages && a.streaming == b.streaming &&
         a.two_phase == b.two_phase && a.origin == b.origin;
}

void check_plugin_options(const std::vector<PluginOption>& options) {
  auto parsed = parse_pgoutput_options(options);
  auto started = pgoutput_options_for_start(options);
  if (!parsed.ok()) {
    check(!started.ok() && started.error().message == parsed.error().message);
    return;
  }
  Status startup = check_pgoutput_startup(*parsed);
  check(started.ok() == startup.ok());
  if (!started.ok()) {
    check(started.error().message == startup.error().message);
    return;
  }
  check(same_options(*started, *parsed));
  const PgoutputOptions& o = *started;
  check(o.proto_version >= kProtoMinVersion && o.proto_version <= kProtoMaxVersion);
  check(!o.publication_names.empty());
  for (const PluginOption& option : options) {
    if (option.name == "publication_names" && option.value) check_split(*option.value, ',');
  }
  auto requoted = split_identifier_string(quoted_list(o.publication_names), ',');
  check(requoted.has_value() && *requoted == o.publication_names);

  // Options pgoutput accepts are options the decoder accepts.
  pgoutput::DecoderOptions decoder_options;
  decoder_options.protocol_version = static_cast<int>(o.proto_version);
  decoder_options.parallel_streaming = o.streaming == StreamingMode::kParallel;
  pgoutput::Decoder decoder(decoder_options);
  const Bytes begin = encode(Message(Begin{wire::Lsn(1), 0, 1}));
  check(decoder.decode(begin).ok());
}

void check_option_values(const CommandVariant& command) {
  auto generic = [](const std::vector<GenericOption>& options) {
    for (const GenericOption& o : options) {
      check(option_string(o).ok() == o.value.has_value());
      auto b = option_boolean(o);
      if (!o.value) check(b.ok() && *b);
    }
  };
  if (const auto* c = std::get_if<CreateReplicationSlot>(&command)) generic(c->options);
  if (const auto* c = std::get_if<AlterReplicationSlot>(&command)) generic(c->options);
  if (const auto* c = std::get_if<StartReplication>(&command)) {
    for (const PluginOption& o : c->options) {
      check(option_string(o).ok() == o.value.has_value());
      auto b = option_boolean(o);
      if (!o.value) check(b.ok() && *b);
    }
  }
}

void check_lexer(std::string_view text) {
  const std::string_view c_string = text.substr(0, text.find('\0'));
  Lexer lexer(text);
  std::size_t last_end = 0;
  for (std::size_t steps = 0;; ++steps) {
    check(steps <= c_string.size() + 1);  // every token but the end consumes input
    auto token = lexer.next();
    if (!token.ok()) {
      check(token.error().sqlstate == sqlstate::kSyntaxError);
      break;
    }
    check(token->offset >= last_end && token->offset <= c_string.size());
    if (token->kind == Token::Kind::kEnd) break;
    check(!token->raw.empty());
    check(token->raw.data() == c_string.data() + token->offset);
    last_end = token->offset + token->raw.size();
    check(last_end <= c_string.size());
    if (token->kind == Token::Kind::kIdent) check(token->text.size() < kNameDataLen);
    if (token->kind == Token::Kind::kKeyword) {
      check(find_keyword(token->raw) == token->keyword);
      check(keyword_text(token->keyword) == token->raw);
    }
  }
  for (const Notice& n : lexer.notices()) check(n.sqlstate == kNameTooLongSqlstate);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<ReplicationCommand> parsed = parse_replication_command(text);
  const std::string description = describe(parsed);
  check(describe(parse_replication_command(text)) == description);
  // As for a C string, nothing after a NUL counts.
  const std::string_view c_string = text.substr(0, text.find('\0'));
  if (c_string.size() != text.size()) {
    check(describe(parse_replication_command(c_string)) == description);
  }
  check_lexer(text);
  check_split(text, ',');
  check_split(text, '.');

  if (!parsed.ok()) {
    if (parsed.error().sqlstate == sqlstate::kFeatureNotSupported) {
      check(is_replication_command(text));
    }
    return 0;
  }
  check(is_replication_command(text));
  for (const Notice& n : parsed->notices) check(n.sqlstate == kNameTooLongSqlstate);
  check_option_values(parsed->command);

  const std::string canonical = std::visit(Printer{}, parsed->command);
  Result<ReplicationCommand> reparsed = parse_replication_command(canonical);
  check(reparsed.ok());
  check(reparsed->notices.empty());
  check(describe_command(reparsed->command) == describe_command(parsed->command));
  // Semicolon and surrounding whitespace are allowed.
  Result<ReplicationCommand> with_semicolon = parse_replication_command(" " + canonical + " ;\n");
  check(with_semicolon.ok() &&
        describe_command(with_semicolon->command) == describe_command(parsed->command));

  if (const auto* start = std::get_if<StartReplication>(&parsed->command)) {
    if (start->kind == SlotKind::kLogical) check_plugin_options(start->options);
  }
  return 0;
}
