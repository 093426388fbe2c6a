// Sample pgoutput messages shared by the codec tests: a stream that exercises every message type.
#pragma once

#include <ostream>
#include <vector>

#include "pgoutput/messages.h"

namespace pgrelay::pgoutput::testing {

inline constexpr Oid kUsersOid = 16384;   // public.users, replica identity default (key: id)
inline constexpr Oid kAuditOid = 16400;   // public.audit, replica identity full
inline constexpr Oid kCatalogOid = 2615;  // pg_catalog.pg_namespace: sent with namespace ""
inline constexpr Timestamp kTime = 779000000123456;  // 2024-09-08 in µs since 2000-01-01

inline Relation users_relation(std::optional<Xid> xid = std::nullopt) {
  return Relation{xid,
                  kUsersOid,
                  "public",
                  "users",
                  kReplicaIdentityDefault,
                  {{kColumnIsKey, "id", 23, -1}, {0, "name", 1043, 68}, {0, "avatar", 17, -1}}};
}

inline Relation audit_relation(std::optional<Xid> xid = std::nullopt) {
  return Relation{xid,
                  kAuditOid,
                  "public",
                  "audit",
                  kReplicaIdentityFull,
                  {{kColumnIsKey, "at", 1184, -1}, {kColumnIsKey, "what", 25, -1}}};
}

inline Relation catalog_relation() {
  return Relation{std::nullopt,
                  kCatalogOid,
                  "",
                  "pg_namespace",
                  kReplicaIdentityNothing,
                  {{0, "oid", 26, -1}, {0, "nspname", 19, -1}}};
}

inline Tuple users_row(std::string id, std::string name) {
  return Tuple{{TupleValue::text(std::move(id)), TupleValue::text(std::move(name)),
                TupleValue::binary(std::string("\x89PNG\0\x01", 6))}};
}

inline Tuple users_key(std::string id) {
  return Tuple{{TupleValue::text(std::move(id)), TupleValue::null(), TupleValue::null()}};
}

inline Tuple audit_row(std::string what) {
  return Tuple{{TupleValue::text("2024-09-08 12:00:00+00"), TupleValue::text(std::move(what))}};
}

// Changes of one transaction, streamed (with xid) or not.
inline std::vector<Message> changes(std::optional<Xid> xid) {
  return {
      Type{xid, 16500, "public", "mood"},
      Insert{xid, kUsersOid, users_row("1", "ann")},
      Insert{xid, kUsersOid,
             Tuple{{TupleValue::text("2"), TupleValue::null(), TupleValue::binary("")}}},
      Update{xid, kUsersOid, std::nullopt,
             Tuple{{TupleValue::text("1"), TupleValue::text("anne"), TupleValue::unchanged()}}},
      Update{xid, kUsersOid, OldTuple{OldKind::kKey, users_key("2")}, users_row("3", "")},
      Update{xid, kAuditOid, OldTuple{OldKind::kFull, audit_row("a")}, audit_row("b")},
      Delete{xid, kUsersOid, OldTuple{OldKind::kKey, users_key("3")}},
      Delete{xid, kAuditOid, OldTuple{OldKind::kFull, audit_row("b")}},
      Insert{xid, kCatalogOid, Tuple{{TupleValue::text("2200"), TupleValue::text("public")}}},
      Truncate{xid, false, false, {kUsersOid}},
      Truncate{xid, true, true, {kUsersOid, kAuditOid}},
      Truncate{xid, false, true, {}},
      LogicalMessage{xid, true, Lsn(0x1000A28), "zero/0/ddl", std::string("{\"a\":1}\0x", 9)},
  };
}

// A whole stream as Postgres could send it for `version` (1-4) and streaming = parallel.
inline std::vector<Message> sample_stream(int version, bool parallel) {
  std::vector<Message> out;
  auto add = [&out](std::vector<Message> more) {
    for (Message& m : more) out.push_back(std::move(m));
  };
  add({users_relation(), audit_relation(), catalog_relation()});
  add({Begin{Lsn(0x1000B00), kTime, 734}, Origin{Lsn(0x5000), "pg_16999"}});
  add(changes(std::nullopt));
  add({LogicalMessage{std::nullopt, false, Lsn(0x1000AF0), "", ""},
       Commit{Lsn(0x1000B00), Lsn(0x1000B30), kTime}});
  // A non-transactional message between transactions.
  add({LogicalMessage{std::nullopt, false, Lsn(0x1000C00), "zero/lag", "{\"t\":1}"}});
  if (version >= 2) {
    std::optional<AbortInfo> info;
    if (parallel) info = AbortInfo{Lsn(0x2000100), kTime + 5};
    add({StreamStart{900, true}, Origin{Lsn(0), "pg_16999"}, audit_relation(900)});
    add(changes(900));
    add({StreamStop{}, StreamStart{900, false}, Insert{900, kAuditOid, audit_row("late")},
         StreamStop{}});
    add({StreamAbort{900, 901, info}, StreamCommit{900, Lsn(0x2000200), Lsn(0x2000230), kTime}});
    add({StreamStart{910, true}, Insert{910, kUsersOid, users_row("9", "x")}, StreamStop{}});
    add({StreamAbort{910, 910, info}});
  }
  if (version >= 3) {
    add({BeginPrepare{Lsn(0x3000000), Lsn(0x3000040), kTime, 950, "gid-1"}});
    add({Insert{std::nullopt, kUsersOid, users_row("5", "p")}});
    add({Prepare{Lsn(0x3000000), Lsn(0x3000040), kTime, 950, "gid-1"},
         CommitPrepared{Lsn(0x3000100), Lsn(0x3000140), kTime + 1, 950, "gid-1"},
         BeginPrepare{Lsn(0x3000200), Lsn(0x3000240), kTime, 951, ""},
         Prepare{Lsn(0x3000200), Lsn(0x3000240), kTime, 951, ""},
         RollbackPrepared{Lsn(0x3000240), Lsn(0x3000300), kTime, kTime + 2, 951, ""}});
    add({StreamStart{960, true}, Delete{960, kUsersOid, OldTuple{OldKind::kKey, users_key("5")}},
         StreamStop{}, StreamPrepare{Lsn(0x3000400), Lsn(0x3000440), kTime, 960, "gid-s"},
         CommitPrepared{Lsn(0x3000500), Lsn(0x3000540), kTime + 3, 960, "gid-s"}});
  }
  return out;
}

}  // namespace pgrelay::pgoutput::testing

namespace pgrelay::pgoutput {
// Lets GoogleTest print messages in failures.
inline void PrintTo(const Message& m, std::ostream* os) {
  *os << describe(m);
}
}  // namespace pgrelay::pgoutput
