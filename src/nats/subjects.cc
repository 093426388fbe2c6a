// The NATS subjects pgrelay publishes a database's changes on, with names escaped into tokens.
#include "nats/subjects.h"

namespace pgrelay::nats {

namespace {

bool plain(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;  // lower case is never written, so it is not read either: one spelling per name
}

}  // namespace

std::string escape_token(std::string_view name) {
  if (name.empty()) return "~";
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(name.size());
  for (unsigned char c : name) {
    if (plain(c)) {
      out += static_cast<char>(c);
    } else {
      out += '~';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

std::optional<std::string> unescape_token(std::string_view token) {
  if (token == "~") return std::string();
  if (token.empty()) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < token.size(); ++i) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (plain(c)) {
      out += static_cast<char>(c);
      continue;
    }
    if (c != '~' || i + 2 >= token.size()) return std::nullopt;
    const int hi = hex_value(token[i + 1]);
    const int lo = hex_value(token[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    const auto byte = static_cast<unsigned char>(hi * 16 + lo);
    if (plain(byte)) return std::nullopt;  // a plain byte is never escaped
    out += static_cast<char>(byte);
    i += 2;
  }
  return out;
}

bool valid_subject_prefix(std::string_view prefix) {
  if (prefix.empty()) return false;
  bool token_empty = true;
  for (unsigned char c : prefix) {
    if (c == '.') {
      if (token_empty) return false;
      token_empty = true;
    } else if (plain(c)) {
      token_empty = false;
    } else {
      return false;
    }
  }
  return !token_empty;
}

Subjects::Subjects(std::string prefix, std::string_view database)
    : prefix_(std::move(prefix)),
      database_(prefix_ + "." + escape_token(database)),
      messages_(database_ + "._message"),
      transactions_(database_ + "._tx"),
      server_facts_(prefix_ + ".~server." + escape_token(database)) {}

std::string Subjects::table(std::string_view schema, std::string_view table) const {
  return database_ + "." + escape_token(schema) + "." + escape_token(table);
}

}  // namespace pgrelay::nats
