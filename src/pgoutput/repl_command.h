// Replication command grammar: walsender command strings parsed into typed commands (repl_gram.y).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.h"
#include "pgoutput/repl_lexer.h"
#include "wire/lsn.h"

namespace pgrelay::pgoutput {

// One element of a parenthesized generic option list: `name`, `name value`, `name 'str'`, `name 7`.
struct GenericOption {
  struct Value {
    enum class Kind { kString, kInteger };
    Kind kind = Kind::kString;
    // For kInteger, the number as Postgres's defGetString prints it (a signed 32-bit value).
    std::string text;
    bool operator==(const Value&) const = default;
  };
  std::string name;
  std::optional<Value> value;
  bool operator==(const GenericOption&) const = default;
};

// One START_REPLICATION ... LOGICAL option, handed to the output plugin in the order given.
struct PluginOption {
  std::string name;
  std::optional<std::string> value;
  bool operator==(const PluginOption&) const = default;
};

enum class SlotKind { kPhysical, kLogical };
enum class SnapshotAction { kExport, kNothing, kUse };

struct IdentifySystem {};

struct Show {
  std::string name;  // dotted names joined with '.', e.g. "myext.setting"
};

struct TimelineHistory {
  std::uint32_t timeline = 0;  // never 0
};

struct CreateReplicationSlot {
  std::string slot_name;
  bool temporary = false;
  SlotKind kind = SlotKind::kLogical;
  std::string plugin;  // output plugin; empty for physical slots
  // Interpreted as walsender's parseCreateReplSlotOptions does, with its defaults.
  SnapshotAction snapshot = SnapshotAction::kExport;
  bool two_phase = false;
  bool reserve_wal = false;
  bool failover = false;  // PG17
  // The options as written; legacy keywords appear as Postgres maps them (snapshot 'use', ...).
  std::vector<GenericOption> options;
};

struct ReadReplicationSlot {
  std::string slot_name;
};

struct DropReplicationSlot {
  std::string slot_name;
  bool wait = false;
};

// PG17 command; options as written plus the ones PG17/18 understand.
struct AlterReplicationSlot {
  std::string slot_name;
  std::vector<GenericOption> options;
  std::optional<bool> failover;
  std::optional<bool> two_phase;
};

struct StartReplication {
  SlotKind kind = SlotKind::kPhysical;
  std::optional<std::string> slot_name;  // always set for logical
  wire::Lsn start;
  std::uint32_t timeline = 0;         // physical only; 0 means "not given"
  std::vector<PluginOption> options;  // logical only
};

using CommandVariant =
    std::variant<IdentifySystem, Show, TimelineHistory, CreateReplicationSlot, ReadReplicationSlot,
                 DropReplicationSlot, AlterReplicationSlot, StartReplication>;

struct ReplicationCommand {
  CommandVariant command;
  // NOTICEs Postgres would have sent while parsing (identifier truncation).
  std::vector<Notice> notices;

  template <typename T>
  bool is() const {
    return std::holds_alternative<T>(command);
  }
  template <typename T>
  const T& as() const {
    return std::get<T>(command);
  }
};

// True when the first token is a replication command keyword (replication_scanner_is_replication_
// command). Anything else on a replication=database connection is ordinary SQL. Keywords are
// case-sensitive exactly as in Postgres: "identify_system" is SQL, not a replication command.
bool is_replication_command(std::string_view command);

// Parses a whole replication command (optionally ending in ';'). Errors carry Postgres's SQLSTATE
// and message text. BASE_BACKUP and UPLOAD_MANIFEST parse but are refused with 0A000, because
// pgrelay serves logical replication only.
Result<ReplicationCommand> parse_replication_command(std::string_view command);

// defGetString / defGetBoolean: how walsender and output plugins read an option's value.
Result<std::string> option_string(const GenericOption& option);
Result<bool> option_boolean(const GenericOption& option);
Result<std::string> option_string(const PluginOption& option);
Result<bool> option_boolean(const PluginOption& option);

}  // namespace pgrelay::pgoutput
