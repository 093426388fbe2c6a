// Reads a .env file: the NAME=VALUE lines an app keeps beside its code for its tools.
#include "zero/dotenv.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace pgrelay::zero {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

bool is_name_char(char c, bool first) {
  const auto u = static_cast<unsigned char>(c);
  return std::isalpha(u) || c == '_' || (!first && (std::isdigit(u) || c == '.' || c == '-'));
}

// Reads one line's worth of .env at `pos` (a double-quoted value may take more lines).
class DotenvReader {
 public:
  DotenvReader(std::string_view text, const std::string& origin) : text_(text), origin_(origin) {}

  Result<std::map<std::string, std::string>> read() {
    std::map<std::string, std::string> out;
    while (pos_ < text_.size()) {
      skip_spaces();
      if (at_end_of_line()) {
        next_line();
        continue;
      }
      if (text_[pos_] == '#') {
        skip_to_end_of_line();
        next_line();
        continue;
      }
      auto entry = read_entry();
      if (!entry.ok()) return entry.error();
      out[entry->first] = std::move(entry->second);
      next_line();
    }
    return out;
  }

 private:
  Error bad(const std::string& what) const {
    return Error::make(sqlstate::kInvalidParameterValue,
                       origin_ + ", line " + std::to_string(line_) + ": " + what,
                       "Write each variable as NAME=value, NAME='value' or NAME=\"value\", one "
                       "per line; # starts a comment.");
  }

  Result<std::pair<std::string, std::string>> read_entry() {
    if (text_.substr(pos_).starts_with("export ")) {
      pos_ += 7;
      skip_spaces();
    }
    const std::size_t name_start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_], pos_ == name_start)) ++pos_;
    std::string name(text_.substr(name_start, pos_ - name_start));
    if (name.empty()) return bad("a variable's name was expected");
    skip_spaces();
    if (pos_ >= text_.size() || text_[pos_] != '=') {
      return bad("\"=\" was expected after " + name);
    }
    ++pos_;
    skip_spaces();
    auto value = read_value();
    if (!value.ok()) return value.error();
    return std::pair{std::move(name), std::move(*value)};
  }

  Result<std::string> read_value() {
    if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) {
      const char quote = text_[pos_++];
      const std::size_t first_line = line_;
      std::string value;
      for (;;) {
        if (pos_ >= text_.size()) {
          line_ = first_line;
          return bad(std::string("the value's closing ") + quote + " is missing");
        }
        const char c = text_[pos_++];
        if (c == quote) break;
        if (c == '\n') ++line_;
        if (c == '\\' && quote == '"' && pos_ < text_.size()) {
          const char e = text_[pos_++];
          value += e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
          if (e != 'n' && e != 'r' && e != 't' && e != '"' && e != '\\') {
            value.insert(value.size() - 1, 1, '\\');  // not an escape: kept as written
          }
          continue;
        }
        value += c;
      }
      skip_spaces();
      if (!at_end_of_line() && text_[pos_] != '#') {
        return bad("nothing but a comment may follow a quoted value");
      }
      skip_to_end_of_line();
      return value;
    }
    const std::size_t start = pos_;
    std::size_t end = start;
    while (pos_ < text_.size() && text_[pos_] != '\n') {
      if (text_[pos_] == '#' && pos_ > start && is_space(text_[pos_ - 1])) break;
      ++pos_;
      end = pos_;
    }
    skip_to_end_of_line();
    while (end > start && is_space(text_[end - 1])) --end;
    return std::string(text_.substr(start, end - start));
  }

  void skip_spaces() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  }
  bool at_end_of_line() const { return pos_ >= text_.size() || text_[pos_] == '\n'; }
  void skip_to_end_of_line() {
    while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
  }
  void next_line() {
    if (pos_ < text_.size()) ++pos_;  // the newline
    ++line_;
  }

  std::string_view text_;
  const std::string& origin_;
  std::size_t pos_ = 0;
  std::size_t line_ = 1;
};

}  // namespace

Result<std::map<std::string, std::string>> parse_dotenv(std::string_view text,
                                                        const std::string& origin) {
  return DotenvReader(text, origin).read();
}

Result<std::map<std::string, std::string>> read_dotenv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::map<std::string, std::string>{};
    return Error::make(sqlstate::kIoError, "could not read " + path + ": " + std::strerror(errno),
                       "Make the file readable, or remove it.");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_dotenv(text.str(), path);
}

}  // namespace pgrelay::zero
