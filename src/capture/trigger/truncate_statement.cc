// Reads TRUNCATE's CASCADE and RESTART IDENTITY options from the statement text a trigger saw.
#include "capture/trigger/truncate_statement.h"

#include <algorithm>
#include <cctype>

namespace pgrelay::capture {
namespace {

struct Token {
  enum Kind { kWord, kQuotedIdent, kOther, kSemicolon } kind;
  std::string text;  // words lower-cased, quoted identifiers unquoted
};

bool ident_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool ident_char(char c) {
  return ident_start(c) || std::isdigit(static_cast<unsigned char>(c)) != 0 || c == '$';
}

// Enough of the Postgres lexer to find statement boundaries and words outside literals.
std::vector<Token> tokenize(std::string_view q) {
  std::vector<Token> out;
  std::size_t i = 0;
  const std::size_t n = q.size();
  while (i < n) {
    const char c = q[i];
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      ++i;
    } else if (c == '-' && i + 1 < n && q[i + 1] == '-') {
      while (i < n && q[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < n && q[i + 1] == '*') {
      int depth = 1;
      i += 2;
      while (i < n && depth > 0) {
        if (q[i] == '/' && i + 1 < n && q[i + 1] == '*') {
          ++depth;
          i += 2;
        } else if (q[i] == '*' && i + 1 < n && q[i + 1] == '/') {
          --depth;
          i += 2;
        } else {
          ++i;
        }
      }
    } else if (c == '\'' || ((c == 'e' || c == 'E') && i + 1 < n && q[i + 1] == '\'')) {
      const bool escapes = c != '\'';
      i += escapes ? 2 : 1;
      while (i < n) {
        if (escapes && q[i] == '\\') {
          i += 2;
        } else if (q[i] == '\'') {
          if (i + 1 < n && q[i + 1] == '\'') {
            i += 2;
          } else {
            ++i;
            break;
          }
        } else {
          ++i;
        }
      }
      out.push_back({Token::kOther, "'"});
    } else if (c == '"') {
      std::string id;
      ++i;
      while (i < n) {
        if (q[i] == '"') {
          if (i + 1 < n && q[i + 1] == '"') {
            id += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        id += q[i++];
      }
      out.push_back({Token::kQuotedIdent, std::move(id)});
    } else if (c == '$') {
      // $tag$ ... $tag$ (a parameter $1 is just punctuation and digits).
      std::size_t j = i + 1;
      while (j < n && ident_char(q[j]) && q[j] != '$') ++j;
      if (j < n && q[j] == '$' && (j == i + 1 || ident_start(q[i + 1]))) {
        const std::string_view tag = q.substr(i, j - i + 1);
        const std::size_t end = q.find(tag, j + 1);
        i = end == std::string_view::npos ? n : end + tag.size();
        out.push_back({Token::kOther, "$"});
      } else {
        ++i;
        out.push_back({Token::kOther, "$"});
      }
    } else if (ident_start(c)) {
      std::string w;
      while (i < n && ident_char(q[i])) {
        w += static_cast<char>(std::tolower(static_cast<unsigned char>(q[i])));
        ++i;
      }
      out.push_back({Token::kWord, std::move(w)});
    } else if (c == ';') {
      out.push_back({Token::kSemicolon, ";"});
      ++i;
    } else {
      out.push_back({Token::kOther, std::string(1, c)});
      ++i;
    }
  }
  return out;
}

struct Statement {
  TruncateOptions options;
  std::vector<std::string> names;  // every identifier of the table list
};

}  // namespace

TruncateOptions truncate_options(std::string_view query, const std::vector<std::string>& tables) {
  const std::vector<Token> tokens = tokenize(query);
  std::vector<Statement> truncates;
  std::size_t i = 0;
  while (i < tokens.size()) {
    std::size_t end = i;
    while (end < tokens.size() && tokens[end].kind != Token::kSemicolon) ++end;
    if (end > i && tokens[i].kind == Token::kWord && tokens[i].text == "truncate") {
      Statement st;
      for (std::size_t k = i + 1; k < end; ++k) {
        const Token& t = tokens[k];
        const bool word = t.kind == Token::kWord;
        if (word && t.text == "cascade") {
          st.options.cascade = true;
        } else if (word && t.text == "restart" && k + 1 < end &&
                   tokens[k + 1].kind == Token::kWord && tokens[k + 1].text == "identity") {
          st.options.restart_identity = true;
        } else if (t.kind == Token::kQuotedIdent || word) {
          st.names.push_back(t.text);
        }
      }
      truncates.push_back(std::move(st));
    }
    i = end + 1;
  }
  // The statement naming most of the tables and least else (a cascaded table is not named).
  const Statement* best = nullptr;
  std::pair<std::size_t, std::size_t> best_score{0, 0};  // (named tables, -other names)
  for (const auto& st : truncates) {
    std::size_t matches = 0;
    for (const auto& name : st.names) {
      matches += std::find(tables.begin(), tables.end(), name) != tables.end() ? 1 : 0;
    }
    const std::pair<std::size_t, std::size_t> score{matches, st.names.size() - matches};
    if (matches > 0 && (best == nullptr || score.first > best_score.first ||
                        (score.first == best_score.first && score.second < best_score.second))) {
      best = &st;
      best_score = score;
    }
  }
  if (best != nullptr) return best->options;
  if (truncates.size() == 1) return truncates.front().options;
  return {};
}

}  // namespace pgrelay::capture
