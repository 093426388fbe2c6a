// What `pgrelay dump` leaves out of an archive and `pgrelay restore` skips in one: pgrelay's
// and zero-cache's own objects, found in the database and in pg_restore's table of contents.
#include "cli/dump_archive.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <set>
#include <utility>

namespace pgrelay::cli::dump {
namespace {

// The descs this code reads, the longer before their prefixes.
constexpr std::array<std::string_view, 10> kKnownDescs = {"PUBLICATION TABLES IN SCHEMA",
                                                          "PUBLICATION TABLE",
                                                          "PUBLICATION",
                                                          "EVENT TRIGGER",
                                                          "TRIGGER",
                                                          "TABLE DATA",
                                                          "TABLE",
                                                          "FUNCTION",
                                                          "PROCEDURE",
                                                          "SCHEMA"};

bool is_digits(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::string_view next_token(std::string_view& s) {
  const auto start = s.find_first_not_of(' ');
  if (start == std::string_view::npos) {
    s = {};
    return {};
  }
  s.remove_prefix(start);
  const auto end = std::min(s.find(' '), s.size());
  std::string_view token = s.substr(0, end);
  s.remove_prefix(end);
  return token;
}

// An SQL identifier at the start of `s` as pg_dump writes one (bare, or double-quoted with ""
// for a quote); advances past it. nullopt when there is none.
std::optional<std::string> read_identifier(std::string_view& s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  std::string out;
  if (s.front() == '"') {
    for (std::size_t i = 1; i < s.size(); ++i) {
      if (s[i] != '"') {
        out += s[i];
      } else if (i + 1 < s.size() && s[i + 1] == '"') {
        out += '"';
        ++i;
      } else {
        s.remove_prefix(i + 1);
        return out;
      }
    }
    return std::nullopt;  // unterminated
  }
  std::size_t i = 0;
  while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) != 0 || s[i] == '_' ||
                          s[i] == '$' || static_cast<unsigned char>(s[i]) >= 0x80)) {
    ++i;
  }
  if (i == 0) return std::nullopt;
  out.assign(s.substr(0, i));
  s.remove_prefix(i);
  return out;
}

// The publication a "PUBLICATION TABLE" or "PUBLICATION TABLES IN SCHEMA" entry's tag ("PUB
// TABLE", "PUB SCHEMA") names.
std::string_view publication_of_member_entry(std::string_view tag) {
  return tag.substr(0, tag.find(' '));
}

// A possibly schema-qualified name at the start of `s`: (schema, name), schema empty when
// unqualified. Advances past it.
std::optional<std::pair<std::string, std::string>> read_qualified(std::string_view& s) {
  auto first = read_identifier(s);
  if (!first) return std::nullopt;
  if (s.empty() || s.front() != '.') return std::make_pair(std::string(), *first);
  s.remove_prefix(1);
  auto second = read_identifier(s);
  if (!second) return std::nullopt;
  return std::make_pair(*first, *second);
}

// The statement text after `keyword` in `statement`, or nullopt.
std::optional<std::string_view> after(std::string_view statement, std::string_view keyword) {
  const auto at = statement.find(keyword);
  if (at == std::string_view::npos) return std::nullopt;
  return statement.substr(at + keyword.size());
}

// NAME ends in _N (digits) after PREFIX (_metadata, _public) and starts with _APP.
bool is_zero_publication(std::string_view name) {
  if (name.size() < 2 || name.front() != '_') return false;
  const auto last = name.rfind('_');
  if (last == std::string_view::npos || !is_digits(name.substr(last + 1))) return false;
  const std::string_view head = name.substr(0, last);
  for (std::string_view kind : {std::string_view("_metadata"), std::string_view("_public")}) {
    if (head.size() > kind.size() + 1 && head.ends_with(kind)) return true;
  }
  return false;
}

}  // namespace

std::string_view internal_schemas_query() {
  return R"sql(
SELECT n.nspname,
       CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_proc p
                         WHERE p.pronamespace = n.oid AND p.proname = 'note_publications')
            THEN 'pgrelay' ELSE 'zero' END
FROM pg_catalog.pg_namespace n
WHERE EXISTS (SELECT FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = n.oid AND p.proname = 'note_publications')
   OR EXISTS (SELECT FROM pg_catalog.pg_class c
              WHERE c.relnamespace = n.oid AND c.relname = 'shardConfig')
   OR (EXISTS (SELECT FROM pg_catalog.pg_class c
               WHERE c.relnamespace = n.oid AND c.relname IN ('permissions', 'schemaVersions'))
       AND EXISTS (SELECT FROM pg_catalog.pg_namespace s
                   JOIN pg_catalog.pg_class c ON c.relnamespace = s.oid
                   WHERE c.relname = 'shardConfig'
                     AND pg_catalog.left(s.nspname, pg_catalog.length(n.nspname) + 1)
                         = n.nspname || '_'
                     AND pg_catalog.substr(s.nspname, pg_catalog.length(n.nspname) + 2)
                         OPERATOR(pg_catalog.~) '^[0-9]+$'))
ORDER BY 1)sql";
}

std::optional<TocEntry> parse_toc_line(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  std::string_view rest = line;
  std::string_view id = next_token(rest);
  if (id.size() < 2 || id.back() != ';' || !is_digits(id.substr(0, id.size() - 1))) {
    return std::nullopt;
  }
  if (!is_digits(next_token(rest)) || !is_digits(next_token(rest))) return std::nullopt;
  rest.remove_prefix(std::min(rest.find_first_not_of(' '), rest.size()));
  TocEntry entry;
  for (std::string_view desc : kKnownDescs) {
    if (rest.starts_with(desc) && rest.size() > desc.size() && rest[desc.size()] == ' ') {
      entry.desc = desc;
      rest.remove_prefix(desc.size());
      break;
    }
  }
  if (entry.desc.empty()) return std::nullopt;
  entry.schema = next_token(rest);
  rest.remove_prefix(std::min(rest.find_first_not_of(' '), rest.size()));
  while (!rest.empty() && rest.back() == ' ') rest.remove_suffix(1);
  const auto owner = rest.rfind(' ');  // the tag may hold spaces; the owner is the last word
  entry.tag = owner == std::string_view::npos ? rest : rest.substr(0, owner);
  if (entry.schema.empty() || entry.tag.empty()) return std::nullopt;
  entry.line = line;
  return entry;
}

bool is_internal_publication(std::string_view name,
                             const std::vector<std::string>& pgrelay_schemas) {
  for (const auto& schema : pgrelay_schemas) {
    if (name == schema + "_capture" || name == schema + "_capture_keyless") return true;
  }
  return is_zero_publication(name);
}

std::vector<TriggerCall> parse_trigger_calls(std::string_view sql) {
  std::vector<TriggerCall> out;
  constexpr std::string_view kCreate = "CREATE ";
  for (auto at = sql.find(kCreate); at != std::string_view::npos; at = sql.find(kCreate)) {
    sql.remove_prefix(at + kCreate.size());
    std::string_view s = sql;
    bool event = false;
    if (s.starts_with("EVENT TRIGGER ")) {
      event = true;
      s.remove_prefix(14);
    } else if (s.starts_with("TRIGGER ")) {
      s.remove_prefix(8);
    } else if (s.starts_with("CONSTRAINT TRIGGER ")) {
      s.remove_prefix(19);
    } else {
      continue;
    }
    auto trigger = read_identifier(s);
    if (!trigger) continue;
    const std::string_view statement = s.substr(0, s.find(';'));
    TriggerCall c;
    c.trigger = *trigger;
    if (!event) {
      auto on = after(statement, " ON ");
      if (!on) continue;
      auto table = read_qualified(*on);
      if (!table) continue;
      c.table_schema = table->first.empty() ? "public" : table->first;
      c.table = table->second;
    }
    auto call = after(statement, "EXECUTE FUNCTION ");
    if (!call) call = after(statement, "EXECUTE PROCEDURE ");
    if (!call) continue;
    auto function = read_qualified(*call);
    if (!function) continue;
    // Unqualified: found on the search path, which pg_restore sets to the archive's schemas.
    c.schema = function->first.empty() ? "public" : function->first;
    c.function = function->second;
    out.push_back(std::move(c));
  }
  return out;
}

RestoreList plan_restore(std::string_view listing, const std::vector<TriggerCall>& triggers,
                         const std::vector<std::string>& pgrelay_schemas) {
  // The functions the archive holds, as (schema, name).
  std::set<std::pair<std::string, std::string>> functions;
  std::vector<std::pair<std::string_view, std::optional<TocEntry>>> lines;
  for (std::string_view rest = listing; !rest.empty();) {
    const auto nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    auto entry = parse_toc_line(line);
    if (entry && (entry->desc == "FUNCTION" || entry->desc == "PROCEDURE")) {
      functions.emplace(entry->schema, entry->tag.substr(0, entry->tag.find('(')));
    }
    lines.emplace_back(line, std::move(entry));
  }
  // The call of the trigger `entry` is, when its statement was read.
  auto call_of = [&](const TocEntry& entry) -> const TriggerCall* {
    for (const auto& c : triggers) {
      const bool same = entry.desc == "EVENT TRIGGER"
                            ? c.table.empty() && c.trigger == entry.tag
                            : !c.table.empty() && c.table_schema == entry.schema &&
                                  entry.tag == c.table + " " + c.trigger;
      if (same) return &c;
    }
    return nullptr;
  };
  RestoreList plan;
  for (const auto& [line, entry] : lines) {
    bool skip = false;
    if (entry && (entry->desc == "EVENT TRIGGER" || entry->desc == "TRIGGER")) {
      const TriggerCall* call = call_of(*entry);
      skip = call != nullptr && !functions.contains({call->schema, call->function});
      if (skip && entry->desc == "EVENT TRIGGER") {
        plan.skipped.push_back("EVENT TRIGGER " + entry->tag + " (its function " + call->schema +
                               "." + call->function + " is not in the archive)");
      } else if (skip) {
        ++plan.skipped_table_triggers;
      }
    } else if (entry && entry->desc == "PUBLICATION") {
      skip = is_internal_publication(entry->tag, pgrelay_schemas);
      if (skip) plan.skipped.push_back("PUBLICATION " + entry->tag);
    } else if (entry && (entry->desc == "PUBLICATION TABLE" ||
                         entry->desc == "PUBLICATION TABLES IN SCHEMA")) {
      skip = is_internal_publication(publication_of_member_entry(entry->tag), pgrelay_schemas);
    } else if (entry && entry->desc == "TABLE") {
      plan.tables.emplace_back(entry->schema, entry->tag);
    }
    if (skip) plan.listing.push_back(';');
    plan.listing.append(line).push_back('\n');
  }
  return plan;
}

std::string trigger_listing(std::string_view listing) {
  std::string out;
  for (std::string_view rest = listing; !rest.empty();) {
    const auto nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    auto entry = parse_toc_line(line);
    if (entry && (entry->desc == "EVENT TRIGGER" || entry->desc == "TRIGGER")) {
      out.append(line).push_back('\n');
    }
  }
  return out;
}

}  // namespace pgrelay::cli::dump
