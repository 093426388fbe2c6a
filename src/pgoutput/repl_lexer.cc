// Tokenizer for walsender replication commands, following Postgres's repl_scanner.l token rules.
#include "pgoutput/repl_lexer.h"

#include <array>
#include <limits>
#include <utility>

namespace pgrelay::pgoutput {

namespace {

struct KeywordEntry {
  std::string_view text;
  Keyword keyword;
};

constexpr std::array<KeywordEntry, 21> kKeywords{{
    {"ALTER_REPLICATION_SLOT", Keyword::kAlterReplicationSlot},
    {"BASE_BACKUP", Keyword::kBaseBackup},
    {"CREATE_REPLICATION_SLOT", Keyword::kCreateReplicationSlot},
    {"DROP_REPLICATION_SLOT", Keyword::kDropReplicationSlot},
    {"EXPORT_SNAPSHOT", Keyword::kExportSnapshot},
    {"IDENTIFY_SYSTEM", Keyword::kIdentifySystem},
    {"LOGICAL", Keyword::kLogical},
    {"NOEXPORT_SNAPSHOT", Keyword::kNoexportSnapshot},
    {"PHYSICAL", Keyword::kPhysical},
    {"READ_REPLICATION_SLOT", Keyword::kReadReplicationSlot},
    {"RESERVE_WAL", Keyword::kReserveWal},
    {"SHOW", Keyword::kShow},
    {"SLOT", Keyword::kSlot},
    {"START_REPLICATION", Keyword::kStartReplication},
    {"TEMPORARY", Keyword::kTemporary},
    {"TIMELINE", Keyword::kTimeline},
    {"TIMELINE_HISTORY", Keyword::kTimelineHistory},
    {"TWO_PHASE", Keyword::kTwoPhase},
    {"UPLOAD_MANIFEST", Keyword::kUploadManifest},
    {"USE_SNAPSHOT", Keyword::kUseSnapshot},
    {"WAIT", Keyword::kWait},
}};

// PG16+ also treats \v as space (PG15 did not); accepting it only turns a syntax error into a
// parse.
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_hex_digit(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool is_high_bit(char c) {
  return (static_cast<unsigned char>(c) & 0x80) != 0;
}
bool is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || is_high_bit(c);
}
bool is_ident_cont(char c) {
  return is_ident_start(c) || is_digit(c) || c == '$';
}

unsigned hex_value(char c) {
  if (is_digit(c)) return static_cast<unsigned>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
  return static_cast<unsigned>(c - 'A' + 10);
}

// One half of an LSN. sscanf("%X") in Postgres silently wraps values wider than 32 bits; an LSN
// that wrapped would point somewhere the client never asked for, so we refuse it instead.
std::optional<std::uint32_t> parse_lsn_half(std::string_view digits) {
  std::uint64_t v = 0;
  for (char c : digits) {
    v = (v << 4) | hex_value(c);
    if (v > std::numeric_limits<std::uint32_t>::max()) return std::nullopt;
  }
  return static_cast<std::uint32_t>(v);
}

// strtoul (saturating at ULONG_MAX) stored into a uint32, which is what repl_scanner.l does.
std::uint32_t parse_uconst(std::string_view digits) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t v = 0;
  for (char c : digits) {
    auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (kMax - d) / 10) {
      v = kMax;
      break;
    }
    v = v * 10 + d;
  }
  return static_cast<std::uint32_t>(v);
}

std::size_t utf8_char_length(unsigned char lead) {
  if ((lead & 0x80) == 0) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 1;
}

Error syntax_error(std::string message, std::string hint) {
  return Error::make(sqlstate::kSyntaxError, std::move(message), std::move(hint));
}

}  // namespace

std::string_view keyword_text(Keyword keyword) {
  for (const auto& entry : kKeywords) {
    if (entry.keyword == keyword) return entry.text;
  }
  return {};
}

std::optional<Keyword> find_keyword(std::string_view text) {
  for (const auto& entry : kKeywords) {
    if (entry.text == text) return entry.keyword;
  }
  return std::nullopt;
}

std::string downcase_identifier(std::string_view ident) {
  std::string out(ident);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::size_t identifier_clip_length(std::string_view ident) {
  constexpr std::size_t kLimit = kNameDataLen - 1;
  if (ident.size() <= kLimit) return ident.size();
  std::size_t len = 0;
  while (len < ident.size()) {
    std::size_t n = utf8_char_length(static_cast<unsigned char>(ident[len]));
    if (len + n > kLimit) break;
    len += n;
  }
  return len;
}

Lexer::Lexer(std::string_view input) : input_(input.substr(0, input.find('\0'))) {}

void Lexer::truncate_with_notice(std::string& ident) {
  if (ident.size() < kNameDataLen) return;
  std::size_t len = identifier_clip_length(ident);
  std::string clipped = ident.substr(0, len);
  notices_.push_back(
      Notice{kNameTooLongSqlstate,
             "identifier \"" + ident + "\" will be truncated to \"" + clipped + "\""});
  ident = std::move(clipped);
}

Result<Token> Lexer::next() {
  while (pos_ < input_.size() && is_space(input_[pos_])) ++pos_;
  std::size_t start = pos_;
  if (start >= input_.size()) {
    Token end;
    end.offset = start;
    return end;
  }
  char c = input_[start];
  if (c == '\'' || c == '"') return lex_quoted(c, start);

  // Flex takes the longest match; a RECPTR (hex/hex) always outruns the identifier or number that
  // starts with the same bytes, because neither of those can contain '/'.
  std::size_t hex_end = start;
  while (hex_end < input_.size() && is_hex_digit(input_[hex_end])) ++hex_end;
  if (hex_end > start && hex_end + 1 < input_.size() && input_[hex_end] == '/' &&
      is_hex_digit(input_[hex_end + 1])) {
    return lex_number(start);
  }
  if (is_digit(c)) return lex_number(start);
  if (is_ident_start(c)) return lex_word(start);

  Token t;
  t.kind = Token::Kind::kChar;
  t.text = std::string(1, c);
  t.offset = start;
  t.raw = input_.substr(start, 1);
  pos_ = start + 1;
  return t;
}

Result<Token> Lexer::lex_number(std::size_t start) {
  Token t;
  t.offset = start;
  std::size_t end = start;
  while (end < input_.size() && is_hex_digit(input_[end])) ++end;
  if (end + 1 < input_.size() && input_[end] == '/' && is_hex_digit(input_[end + 1])) {
    std::size_t hi_end = end;
    end += 1;
    while (end < input_.size() && is_hex_digit(input_[end])) ++end;
    t.raw = input_.substr(start, end - start);
    pos_ = end;
    auto hi = parse_lsn_half(input_.substr(start, hi_end - start));
    auto lo = parse_lsn_half(input_.substr(hi_end + 1, end - hi_end - 1));
    if (!hi || !lo) {
      return syntax_error("invalid streaming start location",
                          "Write the location as two hexadecimal numbers of at most 32 bits "
                          "each, such as 0/16B3748.");
    }
    t.kind = Token::Kind::kLsn;
    t.lsn = wire::Lsn((static_cast<std::uint64_t>(*hi) << 32) | *lo);
    return t;
  }
  end = start;
  while (end < input_.size() && is_digit(input_[end])) ++end;
  t.kind = Token::Kind::kUInt;
  t.raw = input_.substr(start, end - start);
  t.uint_value = parse_uconst(t.raw);
  pos_ = end;
  return t;
}

Token Lexer::lex_word(std::size_t start) {
  std::size_t end = start;
  while (end < input_.size() && is_ident_cont(input_[end])) ++end;
  Token t;
  t.offset = start;
  t.raw = input_.substr(start, end - start);
  pos_ = end;
  if (auto keyword = find_keyword(t.raw)) {
    t.kind = Token::Kind::kKeyword;
    t.keyword = *keyword;
    t.text = std::string(t.raw);
    return t;
  }
  t.kind = Token::Kind::kIdent;
  t.text = downcase_identifier(t.raw);
  truncate_with_notice(t.text);
  return t;
}

// Postgres's replication scanner collapses '' inside string literals but has no "" escape in
// delimited identifiers: "a""b" is two identifiers there, and "" is an empty one. We keep that.
Result<Token> Lexer::lex_quoted(char quote, std::size_t start) {
  Token t;
  t.offset = start;
  t.kind = quote == '\'' ? Token::Kind::kString : Token::Kind::kIdent;
  std::size_t p = start + 1;
  for (;;) {
    std::size_t close = input_.find(quote, p);
    if (close == std::string_view::npos) {
      pos_ = input_.size();
      return syntax_error("unterminated quoted string",
                          quote == '\''
                              ? "Close the string literal with a single quote; write a literal "
                                "quote as two single quotes ('')."
                              : "Close the quoted identifier with a double quote.");
    }
    t.text.append(input_.substr(p, close - p));
    if (quote == '\'' && close + 1 < input_.size() && input_[close + 1] == '\'') {
      t.text.push_back('\'');
      p = close + 2;
      continue;
    }
    pos_ = close + 1;
    break;
  }
  t.raw = input_.substr(start, pos_ - start);
  if (t.kind == Token::Kind::kIdent) truncate_with_notice(t.text);
  return t;
}

}  // namespace pgrelay::pgoutput
