// Shared by the capture load tests: the pgbench workload, replaying the log, comparing states.
#include "load_support.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "log/change_view.h"
#include "log/transaction.h"

namespace pgrelay::capture::load {
namespace {

constexpr const char* kPgbench = "/usr/lib/postgresql/15/bin/pgbench";

// Conflicting transfers (deadlocks are retried by pgbench), upserts, deletes and key changes,
// long transactions that take sequence values early and commit late, rolled-back savepoints,
// whole rollbacks, and updates that leave an out-of-line TOAST value unchanged or replace it.
const std::map<std::string, std::string> kScripts = {
    {"transfer.sql@10",
     "\\set a random(1, 50)\n\\set b random(1, 50)\n\\set amt random(1, 100)\nBEGIN;\n"
     "INSERT INTO txlog DEFAULT VALUES;\n"
     "UPDATE accounts SET balance = balance - :amt WHERE id = :a;\n"
     "UPDATE accounts SET balance = balance + :amt WHERE id = :b;\n"
     "INSERT INTO events (account, amount, payload) VALUES (:a, :amt, md5(:amt::text));\n"
     "END;\n"},
    {"items.sql@10",
     "\\set k random(1, 500)\n\\set k2 random(1, 500)\nBEGIN;\n"
     "INSERT INTO txlog DEFAULT VALUES;\n"
     "INSERT INTO items (k, v) VALUES (:k, md5(random()::text)) "
     "ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v, n = items.n + 1;\n"
     "DELETE FROM items WHERE k = :k2;\n"
     "UPDATE items SET k = nextval('flip') WHERE k = :k2 + 1;\n"
     "END;\n"},
    {"long.sql@1",
     "\\set a random(1, 50)\nBEGIN;\nINSERT INTO txlog DEFAULT VALUES;\n"
     "INSERT INTO events (account, amount, payload) VALUES (:a, 0, 'long, early sequence');\n"
     "SELECT pg_sleep(random() * 1.5);\n"
     "UPDATE docs SET n = n + 1 WHERE id = :a % 20 + 1;\n"
     "END;\n"},
    {"savepoint.sql@5",
     "\\set k random(1, 500)\n\\set a random(1, 50)\nBEGIN;\n"
     "INSERT INTO txlog DEFAULT VALUES;\nSAVEPOINT s1;\n"
     "INSERT INTO events (account, amount, payload) VALUES (:a, -1, 'rolled back');\n"
     "UPDATE items SET v = 'rolled back' WHERE k = :k;\n"
     "ROLLBACK TO SAVEPOINT s1;\n"
     "UPDATE docs SET n = n + 1 WHERE id = :k % 20 + 1;\n"
     "SAVEPOINT s2;\nUPDATE items SET n = n + 1 WHERE k = :k;\nRELEASE SAVEPOINT s2;\n"
     "END;\n"},
    {"rollback.sql@2",
     "\\set a random(1, 50)\nBEGIN;\nINSERT INTO txlog DEFAULT VALUES;\n"
     "UPDATE accounts SET balance = balance + 1000000 WHERE id = :a;\nROLLBACK;\n"},
    {"docs.sql@2",
     "\\set d random(1, 20)\nBEGIN;\nINSERT INTO txlog DEFAULT VALUES;\n"
     "UPDATE docs SET body = md5(random()::text) || substr(body, 33) WHERE id = :d;\n"
     "END;\n"},
};

std::string literal(const std::optional<std::string>& v) {
  return v ? test::sql_literal(*v) : "NULL";
}

std::string qualified(const pgoutput::Relation& r) {
  return (r.namespace_name.empty() ? std::string() : test::sql_identifier(r.namespace_name) + ".") +
         test::sql_identifier(r.name);
}

std::optional<std::string> value_of(const pgoutput::TupleValue& v) {
  if (v.kind == pgoutput::ValueKind::kNull) return std::nullopt;
  return v.bytes;
}

std::string where_key(const pgoutput::Relation& rel, const pgoutput::Tuple& tuple) {
  std::string w;
  for (std::size_t i = 0; i < rel.columns.size(); ++i) {
    if (!rel.columns[i].is_key()) continue;
    if (!w.empty()) w += " AND ";
    auto v = value_of(tuple.columns[i]);
    w += test::sql_identifier(rel.columns[i].name) + (v ? " = " + literal(v) : " IS NULL");
  }
  return w;
}

}  // namespace

const char* const kSchema = R"sql(
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, note text);
CREATE TABLE items (k bigint PRIMARY KEY, v text, n int NOT NULL DEFAULT 0);
CREATE TABLE events (id bigserial PRIMARY KEY, account int, amount int, payload text);
CREATE TABLE docs (id int PRIMARY KEY, body text, n int NOT NULL DEFAULT 0);
ALTER TABLE docs ALTER body SET STORAGE EXTERNAL;
CREATE TABLE txlog (xid xid8 PRIMARY KEY DEFAULT pg_current_xact_id());
CREATE SEQUENCE flip START 1000000;
)sql";

const char* const kSeed = R"sql(
INSERT INTO accounts SELECT g, 1000, '' FROM generate_series(1, 50) g;
INSERT INTO items (k, v) SELECT g, md5(g::text) FROM generate_series(1, 500) g;
INSERT INTO docs (id, body) SELECT g, repeat(md5(g::text), 100) FROM generate_series(1, 20) g;
)sql";

const char* const kTables[5] = {"accounts", "items", "events", "docs", "txlog"};

std::string run_pgbench(const test::PgServer& server, const std::string& db,
                        const std::string& user, const std::string& dir, int seconds, int clients) {
  std::string cmd = std::string(kPgbench) + " -n -h " + server.host() + " -p " +
                    std::to_string(server.port()) + " -U " + user + " -c " +
                    std::to_string(clients) + " -j " + std::to_string(clients) + " -T " +
                    std::to_string(seconds) + " --max-tries=100";
  for (const auto& [name, body] : kScripts) {
    const std::string file = name.substr(0, name.find('@'));
    std::ofstream(dir + "/" + file) << body;
    cmd += " -f " + dir + "/" + name;
  }
  cmd += " " + db + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) throw test::PgError("could not run pgbench");
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw test::PgError("pgbench failed:\n" + out);
  }
  return out;
}

Replayed replay(log::ChangeLog& log, test::PgConnection& replica) {
  Replayed out;
  auto cursor = log.open_cursor(wire::Lsn(0));
  if (!cursor.ok()) throw test::PgError("open_cursor: " + cursor.error().to_string());
  std::string batch;
  std::size_t in_batch = 0;
  std::map<pgoutput::Oid, pgoutput::Relation> relations;
  while (true) {
    auto e = (*cursor)->next_entry();
    if (!e.ok()) throw test::PgError("next_entry: " + e.error().to_string());
    if (!e->has_value()) break;
    auto t = log::read_transaction(**cursor, **e);
    if (!t.ok()) throw test::PgError("read_transaction: " + t.error().to_string());
    if (t->kind != log::EntryKind::kTransaction) continue;
    if (marker_only(*t)) {
      out.marker_xids.push_back(t->header.xid);
      continue;
    }
    ++out.transactions;
    out.xids.push_back(t->header.xid);
    batch += "BEGIN;\n";
    for (const auto& c : t->changes) {
      const auto& m = c.message;
      if (auto* r = std::get_if<pgoutput::Relation>(&m)) {
        relations[r->oid] = *r;
        continue;
      }
      ++out.changes;
      if (auto* ins = std::get_if<pgoutput::Insert>(&m)) {
        const auto& rel = relations.at(ins->relation_oid);
        std::string cols, vals;
        for (std::size_t i = 0; i < rel.columns.size(); ++i) {
          cols += (i ? ", " : "") + test::sql_identifier(rel.columns[i].name);
          vals += (i ? ", " : "") + literal(value_of(ins->new_tuple.columns[i]));
        }
        batch += "INSERT INTO " + qualified(rel) + " (" + cols + ") VALUES (" + vals + ");\n";
      } else if (auto* up = std::get_if<pgoutput::Update>(&m)) {
        const auto& rel = relations.at(up->relation_oid);
        std::string set;
        for (std::size_t i = 0; i < rel.columns.size(); ++i) {
          if (up->new_tuple.columns[i].kind == pgoutput::ValueKind::kUnchanged) {
            ++out.unchanged_values;
            continue;
          }
          set += (set.empty() ? "" : ", ") + test::sql_identifier(rel.columns[i].name) + " = " +
                 literal(value_of(up->new_tuple.columns[i]));
        }
        const pgoutput::Tuple& key = up->old ? up->old->tuple : up->new_tuple;
        batch +=
            "UPDATE " + qualified(rel) + " SET " + set + " WHERE " + where_key(rel, key) + ";\n";
      } else if (auto* del = std::get_if<pgoutput::Delete>(&m)) {
        const auto& rel = relations.at(del->relation_oid);
        batch +=
            "DELETE FROM " + qualified(rel) + " WHERE " + where_key(rel, del->old.tuple) + ";\n";
      } else if (auto* tr = std::get_if<pgoutput::Truncate>(&m)) {
        std::string list;
        for (auto oid : tr->relation_oids) {
          list += (list.empty() ? "" : ", ") + qualified(relations.at(oid));
        }
        batch += "TRUNCATE " + list + ";\n";
      }
    }
    batch += "COMMIT;\n";
    if (++in_batch == 200) {
      replica.exec(batch);
      batch.clear();
      in_batch = 0;
    }
  }
  if (!batch.empty()) replica.exec(batch);
  return out;
}

std::string table_digest(test::PgConnection& conn, const std::string& table) {
  return conn.scalar(
      "SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, '|' ORDER BY "
      "t::text)), '') FROM " +
      table + " t");
}

std::vector<std::uint32_t> committed_xids(test::PgConnection& upstream) {
  std::vector<std::uint32_t> out;
  for (const auto& row :
       upstream.exec("SELECT (xid::text::numeric % 4294967296)::text FROM txlog ORDER BY 1")) {
    out.push_back(static_cast<std::uint32_t>(std::stoul(*row[0])));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool marker_only(const log::Transaction& txn) {
  return !txn.changes.empty() &&
         std::all_of(txn.changes.begin(), txn.changes.end(), [](const log::Change& c) {
           auto* m = std::get_if<pgoutput::LogicalMessage>(&c.message);
           return m != nullptr && m->prefix == log::kPublicationsChangedPrefix;
         });
}

std::size_t expect_publication_markers(const Replayed& replayed, test::PgConnection& upstream,
                                       std::size_t minimum) {
  std::vector<std::uint32_t> markers = replayed.marker_xids;
  std::sort(markers.begin(), markers.end());
  EXPECT_EQ(std::adjacent_find(markers.begin(), markers.end()), markers.end())
      << "duplicate marker";
  EXPECT_GE(markers.size(), minimum);
  const auto last_marker = static_cast<std::uint32_t>(
      std::stoul(upstream.scalar("SELECT xmin::text FROM _pgrelay.publication_state")));
  EXPECT_TRUE(std::binary_search(markers.begin(), markers.end(), last_marker));
  EXPECT_EQ(upstream.scalar("SELECT fingerprint = _pgrelay.publications_fingerprint() FROM "
                            "_pgrelay.publication_state"),
            "t");
  return markers.size();
}

}  // namespace pgrelay::capture::load
