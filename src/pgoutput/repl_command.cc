// Replication command grammar: walsender command strings parsed into typed commands (repl_gram.y).
#include "pgoutput/repl_command.h"

#include <cstddef>
#include <utility>

namespace pgrelay::pgoutput {

namespace {

constexpr const char* kAnySynopsis =
    "a replication command: IDENTIFY_SYSTEM, SHOW, TIMELINE_HISTORY, CREATE_REPLICATION_SLOT, "
    "READ_REPLICATION_SLOT, DROP_REPLICATION_SLOT, ALTER_REPLICATION_SLOT or START_REPLICATION";
constexpr const char* kShowSynopsis = "SHOW name";
constexpr const char* kReadSlotSynopsis = "READ_REPLICATION_SLOT slot_name";
constexpr const char* kTimelineHistorySynopsis = "TIMELINE_HISTORY timeline";
constexpr const char* kCreateSlotSynopsis =
    "CREATE_REPLICATION_SLOT slot_name [ TEMPORARY ] { PHYSICAL | LOGICAL output_plugin } "
    "[ ( option [ value ] [, ...] ) ]";
constexpr const char* kDropSlotSynopsis = "DROP_REPLICATION_SLOT slot_name [ WAIT ]";
constexpr const char* kAlterSlotSynopsis =
    "ALTER_REPLICATION_SLOT slot_name ( option [ value ] [, ...] )";
constexpr const char* kStartSynopsis =
    "START_REPLICATION SLOT slot_name LOGICAL XXX/XXX [ ( option [ 'value' ] [, ...] ) ] or "
    "START_REPLICATION [ SLOT slot_name ] [ PHYSICAL ] XXX/XXX [ TIMELINE timeline ]";
constexpr const char* kBaseBackupSynopsis = "BASE_BACKUP [ ( option [ value ] [, ...] ) ]";
constexpr const char* kNoArgumentsSynopsis = "the command alone, optionally followed by ';'";

Error conflicting_options(std::string_view hint) {
  return Error::make(sqlstate::kSyntaxError, "conflicting or redundant options", std::string(hint));
}

Error base_backup_refused(std::string detail) {
  return Error::make(sqlstate::kFeatureNotSupported, "pgrelay does not serve base backups",
                     "pgrelay serves logical replication only; use pg_basebackup against the "
                     "upstream server.",
                     std::move(detail));
}

// The keywords replication_scanner_is_replication_command accepts as a command's first token.
bool is_command_keyword(Keyword keyword) {
  switch (keyword) {
    case Keyword::kIdentifySystem:
    case Keyword::kBaseBackup:
    case Keyword::kStartReplication:
    case Keyword::kCreateReplicationSlot:
    case Keyword::kDropReplicationSlot:
    case Keyword::kAlterReplicationSlot:
    case Keyword::kReadReplicationSlot:
    case Keyword::kTimelineHistory:
    case Keyword::kUploadManifest:
    case Keyword::kShow:
      return true;
    default:
      return false;
  }
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

// Recursive descent over repl_gram.y. Tokens are pulled lazily and the first error (lexical,
// syntactic or semantic) is kept, so errors come out in the order Postgres's parser meets them.
class Parser {
 public:
  explicit Parser(std::string_view input) : lexer_(input) {}

  Result<ReplicationCommand> parse();

 private:
  bool ok() const { return !error_.has_value(); }
  void fail(Error e) {
    if (ok()) error_ = std::move(e);
  }
  void fail_syntax(bool name_expected = false);

  const Token& peek();
  void take() { have_token_ = false; }
  bool at(Keyword keyword);
  bool at_char(char c);
  bool accept(Keyword keyword);
  bool accept_char(char c);
  void expect_char(char c);
  std::string expect_ident();
  wire::Lsn expect_lsn();
  std::uint32_t expect_timeline();
  std::string var_name();
  std::vector<GenericOption> generic_option_list();
  std::vector<PluginOption> plugin_options();

  CommandVariant parse_create_slot();
  CommandVariant parse_start_replication();

  Lexer lexer_;
  Token token_;
  bool have_token_ = false;
  std::optional<Error> error_;
  const char* synopsis_ = kAnySynopsis;
};

const Token& Parser::peek() {
  if (!have_token_) {
    if (ok()) {
      auto next = lexer_.next();
      if (next.ok()) {
        token_ = std::move(next).value();
      } else {
        fail(next.take_error());
        token_ = Token{};
      }
    } else {
      token_ = Token{};
    }
    have_token_ = true;
  }
  return token_;
}

bool Parser::at(Keyword keyword) {
  const Token& t = peek();
  return ok() && t.kind == Token::Kind::kKeyword && t.keyword == keyword;
}

bool Parser::at_char(char c) {
  const Token& t = peek();
  return ok() && t.kind == Token::Kind::kChar && t.text[0] == c;
}

bool Parser::accept(Keyword keyword) {
  if (!at(keyword)) return false;
  take();
  return true;
}

bool Parser::accept_char(char c) {
  if (!at_char(c)) return false;
  take();
  return true;
}

void Parser::expect_char(char c) {
  if (!accept_char(c)) fail_syntax();
}

std::string Parser::expect_ident() {
  const Token& t = peek();
  if (!ok() || t.kind != Token::Kind::kIdent) {
    fail_syntax(/*name_expected=*/true);
    return {};
  }
  std::string name = t.text;
  take();
  return name;
}

wire::Lsn Parser::expect_lsn() {
  const Token& t = peek();
  if (!ok() || t.kind != Token::Kind::kLsn) {
    fail_syntax();
    return {};
  }
  wire::Lsn lsn = t.lsn;
  take();
  return lsn;
}

// Postgres checks the value as soon as the number is read, before looking further.
std::uint32_t Parser::expect_timeline() {
  const Token& t = peek();
  if (!ok() || t.kind != Token::Kind::kUInt) {
    fail_syntax();
    return 0;
  }
  std::uint32_t tli = t.uint_value;
  take();
  if (tli == 0) {
    fail(Error::make(sqlstate::kSyntaxError, "invalid timeline " + std::to_string(tli),
                     "Timeline IDs start at 1; IDENTIFY_SYSTEM reports the current one."));
  }
  return tli;
}

void Parser::fail_syntax(bool name_expected) {
  if (!ok()) return;
  const Token t = peek();
  if (!ok()) return;  // peek itself hit a lexical error, which takes precedence
  std::string detail;
  std::string hint = std::string("Expected ") + synopsis_ + ".";
  if (t.kind == Token::Kind::kEnd) {
    detail = "Unexpected end of command.";
  } else {
    detail = "Unexpected \"" + std::string(t.raw) + "\" at position " +
             std::to_string(t.offset + 1) + ".";
  }
  if (t.kind == Token::Kind::kIdent && !t.raw.empty() && t.raw[0] != '"' &&
      find_keyword(ascii_upper(t.raw))) {
    hint +=
        " Replication keywords are case-sensitive: write " + ascii_upper(t.raw) + " in upper case.";
  } else if (t.kind == Token::Kind::kKeyword && name_expected) {
    hint += " " + t.text +
            " is a replication keyword; write the name in lower case or "
            "double-quote it.";
  }
  fail(Error::make(sqlstate::kSyntaxError, "syntax error", std::move(hint), std::move(detail)));
}

// var_name: IDENT ( '.' IDENT )*
std::string Parser::var_name() {
  std::string name = expect_ident();
  while (ok() && accept_char('.')) name += "." + expect_ident();
  return name;
}

// generic_option_list: generic_option ( ',' generic_option )*, where an option name may also be
// any replication keyword (spelled in lower case) and the value an IDENT, SCONST or UCONST.
std::vector<GenericOption> Parser::generic_option_list() {
  std::vector<GenericOption> options;
  do {
    const Token& name = peek();
    if (!ok()) break;
    GenericOption option;
    if (name.kind == Token::Kind::kIdent) {
      option.name = name.text;
    } else if (name.kind == Token::Kind::kKeyword) {
      option.name = downcase_identifier(name.text);
    } else {
      fail_syntax();
      break;
    }
    take();
    const Token& value = peek();
    if (!ok()) break;
    if (value.kind == Token::Kind::kIdent || value.kind == Token::Kind::kString) {
      option.value = GenericOption::Value{GenericOption::Value::Kind::kString, value.text};
      take();
    } else if (value.kind == Token::Kind::kUInt) {
      // makeInteger() stores the uint32 in an int, so large values read back negative.
      option.value =
          GenericOption::Value{GenericOption::Value::Kind::kInteger,
                               std::to_string(static_cast<std::int32_t>(value.uint_value))};
      take();
    }
    options.push_back(std::move(option));
  } while (ok() && accept_char(','));
  return options;
}

// plugin_options: [ '(' IDENT [SCONST] ( ',' IDENT [SCONST] )* ')' ]
std::vector<PluginOption> Parser::plugin_options() {
  std::vector<PluginOption> options;
  if (!accept_char('(')) return options;
  do {
    PluginOption option;
    option.name = expect_ident();
    if (!ok()) break;
    const Token& value = peek();
    if (ok() && value.kind == Token::Kind::kString) {
      option.value = value.text;
      take();
    }
    options.push_back(std::move(option));
  } while (ok() && accept_char(','));
  if (ok()) expect_char(')');
  return options;
}

Status interpret_create_options(CreateReplicationSlot& cmd) {
  bool snapshot_given = false;
  bool reserve_wal_given = false;
  bool two_phase_given = false;
  bool failover_given = false;
  const bool logical = cmd.kind == SlotKind::kLogical;
  constexpr std::string_view kLogicalOnly =
      "Give each option once; SNAPSHOT, TWO_PHASE and FAILOVER apply to logical slots only.";
  for (const GenericOption& option : cmd.options) {
    if (option.name == "snapshot") {
      if (snapshot_given || !logical) return conflicting_options(kLogicalOnly);
      snapshot_given = true;
      auto action = option_string(option);
      if (!action.ok()) return action.error();
      if (*action == "export") {
        cmd.snapshot = SnapshotAction::kExport;
      } else if (*action == "nothing") {
        cmd.snapshot = SnapshotAction::kNothing;
      } else if (*action == "use") {
        cmd.snapshot = SnapshotAction::kUse;
      } else {
        return Error::make(sqlstate::kInvalidParameterValue,
                           "unrecognized value for CREATE_REPLICATION_SLOT option \"" +
                               option.name + "\": \"" + *action + "\"",
                           "Valid values are 'export', 'use' and 'nothing'.");
      }
    } else if (option.name == "reserve_wal") {
      if (reserve_wal_given || logical) {
        return conflicting_options(
            "Give each option once; RESERVE_WAL applies to physical slots only.");
      }
      reserve_wal_given = true;
      auto value = option_boolean(option);
      if (!value.ok()) return value.error();
      cmd.reserve_wal = *value;
    } else if (option.name == "two_phase") {
      if (two_phase_given || !logical) return conflicting_options(kLogicalOnly);
      two_phase_given = true;
      auto value = option_boolean(option);
      if (!value.ok()) return value.error();
      cmd.two_phase = *value;
    } else if (option.name == "failover") {
      if (failover_given || !logical) return conflicting_options(kLogicalOnly);
      failover_given = true;
      auto value = option_boolean(option);
      if (!value.ok()) return value.error();
      cmd.failover = *value;
    } else {
      // walsender uses elog() here, hence the internal-error SQLSTATE.
      return Error::make(sqlstate::kInternalError, "unrecognized option: " + option.name,
                         "CREATE_REPLICATION_SLOT accepts SNAPSHOT, TWO_PHASE and FAILOVER for "
                         "logical slots and RESERVE_WAL for physical slots.");
    }
  }
  return Status::ok_status();
}

Status interpret_alter_options(AlterReplicationSlot& cmd) {
  for (const GenericOption& option : cmd.options) {
    std::optional<bool>* target = nullptr;
    if (option.name == "failover") {
      target = &cmd.failover;
    } else if (option.name == "two_phase") {
      target = &cmd.two_phase;
    } else {
      return Error::make(sqlstate::kInternalError, "unrecognized option: " + option.name,
                         "ALTER_REPLICATION_SLOT accepts FAILOVER and TWO_PHASE.");
    }
    if (target->has_value()) return conflicting_options("Give each option once.");
    auto value = option_boolean(option);
    if (!value.ok()) return value.error();
    *target = *value;
  }
  return Status::ok_status();
}

CommandVariant Parser::parse_create_slot() {
  synopsis_ = kCreateSlotSynopsis;
  CreateReplicationSlot cmd;
  cmd.slot_name = expect_ident();
  cmd.temporary = accept(Keyword::kTemporary);
  if (accept(Keyword::kPhysical)) {
    cmd.kind = SlotKind::kPhysical;
  } else if (accept(Keyword::kLogical)) {
    cmd.kind = SlotKind::kLogical;
    cmd.plugin = expect_ident();
  } else {
    fail_syntax();
  }
  if (!ok()) return cmd;
  if (accept_char('(')) {
    cmd.options = generic_option_list();
    if (ok()) expect_char(')');
    return cmd;
  }
  // Pre-PG15 keyword options, mapped to the generic options the way repl_gram.y maps them.
  using Kind = GenericOption::Value::Kind;
  for (;;) {
    if (accept(Keyword::kExportSnapshot)) {
      cmd.options.push_back({"snapshot", GenericOption::Value{Kind::kString, "export"}});
    } else if (accept(Keyword::kNoexportSnapshot)) {
      cmd.options.push_back({"snapshot", GenericOption::Value{Kind::kString, "nothing"}});
    } else if (accept(Keyword::kUseSnapshot)) {
      cmd.options.push_back({"snapshot", GenericOption::Value{Kind::kString, "use"}});
    } else if (accept(Keyword::kReserveWal)) {
      cmd.options.push_back({"reserve_wal", GenericOption::Value{Kind::kString, "true"}});
    } else if (accept(Keyword::kTwoPhase)) {
      cmd.options.push_back({"two_phase", GenericOption::Value{Kind::kString, "true"}});
    } else {
      break;
    }
  }
  return cmd;
}

CommandVariant Parser::parse_start_replication() {
  synopsis_ = kStartSynopsis;
  StartReplication cmd;
  if (accept(Keyword::kSlot)) {
    cmd.slot_name = expect_ident();
    if (accept(Keyword::kLogical)) {
      cmd.kind = SlotKind::kLogical;
      cmd.start = expect_lsn();
      if (ok()) cmd.options = plugin_options();
      return cmd;
    }
  }
  cmd.kind = SlotKind::kPhysical;
  accept(Keyword::kPhysical);
  cmd.start = expect_lsn();
  if (accept(Keyword::kTimeline)) cmd.timeline = expect_timeline();
  return cmd;
}

Result<ReplicationCommand> Parser::parse() {
  const Token& first = peek();
  if (!ok()) return *error_;
  if (first.kind != Token::Kind::kKeyword || !is_command_keyword(first.keyword)) {
    fail_syntax();
    return *error_;
  }
  const Keyword keyword = first.keyword;
  take();

  CommandVariant command;
  std::optional<Error> refusal;
  switch (keyword) {
    case Keyword::kIdentifySystem:
      synopsis_ = kNoArgumentsSynopsis;
      command = IdentifySystem{};
      break;
    case Keyword::kShow:
      synopsis_ = kShowSynopsis;
      command = Show{var_name()};
      break;
    case Keyword::kReadReplicationSlot:
      synopsis_ = kReadSlotSynopsis;
      command = ReadReplicationSlot{var_name()};
      break;
    case Keyword::kTimelineHistory:
      synopsis_ = kTimelineHistorySynopsis;
      command = TimelineHistory{expect_timeline()};
      break;
    case Keyword::kCreateReplicationSlot:
      command = parse_create_slot();
      break;
    case Keyword::kDropReplicationSlot: {
      synopsis_ = kDropSlotSynopsis;
      DropReplicationSlot cmd;
      cmd.slot_name = expect_ident();
      cmd.wait = accept(Keyword::kWait);
      command = std::move(cmd);
      break;
    }
    case Keyword::kAlterReplicationSlot: {
      synopsis_ = kAlterSlotSynopsis;
      AlterReplicationSlot cmd;
      cmd.slot_name = expect_ident();
      expect_char('(');
      if (ok()) cmd.options = generic_option_list();
      if (ok()) expect_char(')');
      command = std::move(cmd);
      break;
    }
    case Keyword::kStartReplication:
      command = parse_start_replication();
      break;
    case Keyword::kBaseBackup:
      synopsis_ = kBaseBackupSynopsis;
      if (accept_char('(')) {
        generic_option_list();
        if (ok()) expect_char(')');
      }
      refusal = base_backup_refused("BASE_BACKUP is not supported.");
      break;
    case Keyword::kUploadManifest:
      synopsis_ = kNoArgumentsSynopsis;
      refusal = base_backup_refused(
          "UPLOAD_MANIFEST is only used to prepare an incremental BASE_BACKUP.");
      break;
    default:  // unreachable: is_command_keyword() filtered the rest
      break;
  }
  if (ok()) accept_char(';');
  if (ok() && peek().kind != Token::Kind::kEnd) fail_syntax();
  if (!ok()) return *error_;
  if (refusal) return *refusal;

  // Option semantics are checked once the command has parsed, as walsender does when running it.
  if (auto* create = std::get_if<CreateReplicationSlot>(&command)) {
    Status status = interpret_create_options(*create);
    if (!status.ok()) return status.error();
  } else if (auto* alter = std::get_if<AlterReplicationSlot>(&command)) {
    Status status = interpret_alter_options(*alter);
    if (!status.ok()) return status.error();
  }
  return ReplicationCommand{std::move(command), lexer_.notices()};
}

std::optional<bool> boolean_text(std::string_view text) {
  auto equals_ci = [&](std::string_view word) {
    if (text.size() != word.size()) return false;
    for (std::size_t i = 0; i < text.size(); ++i) {
      char c = text[i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      if (c != word[i]) return false;
    }
    return true;
  };
  if (equals_ci("true") || equals_ci("on")) return true;
  if (equals_ci("false") || equals_ci("off")) return false;
  return std::nullopt;
}

Error requires_parameter(const std::string& name) {
  return Error::make(sqlstate::kSyntaxError, name + " requires a parameter",
                     "Give the option a value, e.g. " + name + " 'value'.");
}

Error requires_boolean(const std::string& name) {
  return Error::make(sqlstate::kSyntaxError, name + " requires a Boolean value",
                     "Use true, false, on or off (or no value, meaning true).");
}

}  // namespace

bool is_replication_command(std::string_view command) {
  Lexer lexer(command);
  auto first = lexer.next();
  return first.ok() && first->kind == Token::Kind::kKeyword && is_command_keyword(first->keyword);
}

Result<ReplicationCommand> parse_replication_command(std::string_view command) {
  return Parser(command).parse();
}

Result<std::string> option_string(const GenericOption& option) {
  if (!option.value) return requires_parameter(option.name);
  return option.value->text;
}

Result<bool> option_boolean(const GenericOption& option) {
  if (!option.value) return true;
  if (option.value->kind == GenericOption::Value::Kind::kInteger) {
    if (option.value->text == "0") return false;
    if (option.value->text == "1") return true;
    return requires_boolean(option.name);
  }
  if (auto b = boolean_text(option.value->text)) return *b;
  return requires_boolean(option.name);
}

Result<std::string> option_string(const PluginOption& option) {
  if (!option.value) return requires_parameter(option.name);
  return *option.value;
}

Result<bool> option_boolean(const PluginOption& option) {
  if (!option.value) return true;
  if (auto b = boolean_text(*option.value)) return *b;
  return requires_boolean(option.name);
}

}  // namespace pgrelay::pgoutput
