// The NATS subjects pgrelay publishes a database's changes on, with names escaped into tokens.
//
// A subject is tokens separated by '.', and a token may not hold '.', '*', '>' or whitespace.
// Schema, table and database names may hold any of these, so each name is escaped: every byte
// outside [A-Za-z0-9_-] becomes '~' and two upper-case hex digits ("my table" -> "my~20table",
// "a.b" -> "a~2Eb", "~" -> "~7E"). The escaping is reversible and leaves ordinary names as they
// are. An empty name becomes "~" alone, which no escaped name can otherwise be.
//
//   PREFIX.DATABASE.SCHEMA.TABLE   one message per row change (and per truncated table)
//   PREFIX.DATABASE._message       logical messages (pg_logical_emit_message)
//   PREFIX.DATABASE._tx            each transaction's log entry, for followers
//   PREFIX.~server.DATABASE        the primary's server facts, for followers (server_facts.h)
//
// "_message" and "_tx" cannot be a schema's token: a schema's subject always has a table token
// after it, so the two are told apart by their number of tokens. "~server" is no escaped name
// ('~' is followed by two hex digits in those), so the facts lie outside every database's
// subjects: a stream's last message of a database is always one of its entries'.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pgrelay::nats {

std::string escape_token(std::string_view name);
// The name an escaped token stands for; nullopt when it is not one escape_token() makes.
std::optional<std::string> unescape_token(std::string_view token);

// Whether `prefix` can lead pgrelay's subjects: one or more tokens of [A-Za-z0-9_-], joined by
// '.' (it is the user's choice, so it is checked, not escaped).
bool valid_subject_prefix(std::string_view prefix);

class Subjects {
 public:
  Subjects(std::string prefix, std::string_view database);

  std::string table(std::string_view schema, std::string_view table) const;
  const std::string& messages() const { return messages_; }
  const std::string& transactions() const { return transactions_; }
  const std::string& server_facts() const { return server_facts_; }
  // What a stream must hold for pgrelay to publish into it: every subject under the prefix.
  std::string all() const { return prefix_ + ".>"; }
  // Every subject of this database.
  std::string database_subjects() const { return database_ + ".>"; }

 private:
  std::string prefix_;
  std::string database_;  // prefix and escaped database name
  std::string messages_;
  std::string transactions_;
  std::string server_facts_;
};

}  // namespace pgrelay::nats
