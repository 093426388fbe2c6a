// Tokenizer for walsender replication commands, following Postgres's repl_scanner.l token rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "wire/lsn.h"

namespace pgrelay::pgoutput {

// NAMEDATALEN in a stock Postgres build; identifiers keep at most kNameDataLen - 1 bytes.
inline constexpr std::size_t kNameDataLen = 64;
// ERRCODE_NAME_TOO_LONG, the SQLSTATE of the truncation NOTICE.
inline constexpr const char* kNameTooLongSqlstate = "42622";

// A non-error message Postgres would send as a NoticeResponse while parsing.
struct Notice {
  std::string sqlstate;
  std::string message;
};

// Replication keywords. Like Postgres's flex rules they match only when written in upper case.
enum class Keyword {
  kAlterReplicationSlot,
  kBaseBackup,
  kCreateReplicationSlot,
  kDropReplicationSlot,
  kExportSnapshot,
  kIdentifySystem,
  kLogical,
  kNoexportSnapshot,
  kPhysical,
  kReadReplicationSlot,
  kReserveWal,
  kShow,
  kSlot,
  kStartReplication,
  kTemporary,
  kTimeline,
  kTimelineHistory,
  kTwoPhase,
  kUploadManifest,
  kUseSnapshot,
  kWait,
};

// The keyword's spelling in a command ("START_REPLICATION").
std::string_view keyword_text(Keyword keyword);
// Exact (case-sensitive) keyword lookup, as flex matches it.
std::optional<Keyword> find_keyword(std::string_view text);

struct Token {
  enum class Kind {
    kEnd,      // end of input
    kKeyword,  // keyword
    kIdent,    // IDENT: downcased unquoted or verbatim "quoted" identifier, truncated
    kString,   // SCONST: '...' with '' collapsed
    kUInt,     // UCONST: decimal digits
    kLsn,      // RECPTR: hex/hex
    kChar,     // any other single byte: ( ) , ; . and anything unexpected
  };
  Kind kind = Kind::kEnd;
  Keyword keyword = Keyword::kShow;  // meaningful for kKeyword only
  std::string text;                  // identifier or string value; the byte for kChar
  std::uint32_t uint_value = 0;      // kUInt
  wire::Lsn lsn;                     // kLsn
  std::size_t offset = 0;            // byte offset of the token in the command
  std::string_view raw;              // the token as written
};

// Pulls tokens one at a time so that, as in Postgres, a lexical error past a syntax error is never
// reported (the parser stops before reading it).
class Lexer {
 public:
  // The command is read as a C string would be: anything after a NUL byte is ignored.
  explicit Lexer(std::string_view input);

  Result<Token> next();
  // Truncation notices for identifiers lexed so far.
  const std::vector<Notice>& notices() const { return notices_; }

 private:
  Result<Token> lex_quoted(char quote, std::size_t start);
  Token lex_word(std::size_t start);
  Result<Token> lex_number(std::size_t start);
  void truncate_with_notice(std::string& ident);

  std::string_view input_;
  std::size_t pos_ = 0;
  std::vector<Notice> notices_;
};

// Postgres's downcase_identifier for a UTF-8 database: ASCII letters only.
std::string downcase_identifier(std::string_view ident);
// Byte length of the longest prefix of at most kNameDataLen - 1 bytes that does not split a UTF-8
// character (pg_mbcliplen).
std::size_t identifier_clip_length(std::string_view ident);

}  // namespace pgrelay::pgoutput
