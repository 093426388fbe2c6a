// Tests reader-side views: table and operation filters, empty transactions, delta updates.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "log/change_log.h"
#include "log/change_view.h"
#include "log/manifest.h"
#include "log/transaction.h"
#include "log_test_util.h"

namespace pgrelay::log {
namespace {

using pgoutput::Column;
using pgoutput::OldKind;
using pgoutput::OldTuple;
using pgoutput::Relation;
using pgoutput::Tuple;
using pgoutput::TupleValue;

constexpr pgoutput::Oid kUsers = 16384;
constexpr pgoutput::Oid kOrders = 16390;
constexpr pgoutput::Oid kSettings = 1259;
constexpr pgoutput::Oid kMoodType = 16400;

Relation users() {
  Relation r;
  r.oid = kUsers;
  r.namespace_name = "public";
  r.name = "users";
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1}, Column{0, "name", 25, -1},
               Column{0, "bio", 25, -1}, Column{0, "mood", kMoodType, -1}};
  return r;
}

Relation orders() {
  Relation r;
  r.oid = kOrders;
  r.namespace_name = "Shop";
  r.name = "Order.s";
  r.replica_identity = pgoutput::kReplicaIdentityFull;
  // pgoutput flags every column of a REPLICA IDENTITY FULL table as key.
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 20, -1},
               Column{pgoutput::kColumnIsKey, "note", 25, -1},
               Column{pgoutput::kColumnIsKey, "total", 1700, -1}};
  return r;
}

Relation settings() {
  Relation r;
  r.oid = kSettings;
  r.namespace_name = "";  // pgoutput's spelling of pg_catalog
  r.name = "settings";
  r.columns = {Column{pgoutput::kColumnIsKey, "k", 25, -1}};
  return r;
}

Tuple row(std::vector<TupleValue> v) {
  return Tuple{std::move(v)};
}
TupleValue t(std::string s) {
  return TupleValue::text(std::move(s));
}
TupleValue null() {
  return TupleValue::null();
}

pgoutput::Insert user_insert(const std::string& id) {
  return {std::nullopt, kUsers, row({t(id), t("n" + id), null(), t("ok")})};
}
pgoutput::Insert order_insert(const std::string& id) {
  return {std::nullopt, kOrders, row({t(id), t("x"), t("1.00")})};
}
pgoutput::Update user_update(const std::string& id) {
  return {std::nullopt, kUsers, std::nullopt, row({t(id), t("renamed"), null(), t("ok")})};
}
pgoutput::Delete user_delete(const std::string& id) {
  return {std::nullopt, kUsers, OldTuple{OldKind::kKey, row({t(id), null(), null(), null()})}};
}

TransactionHeader header(std::uint32_t xid) {
  TransactionHeader h;
  h.begin_lsn = Lsn(0);  // change LSNs are small offsets in these tests
  h.commit_lsn = Lsn(xid * 1000ull + 500);
  h.end_lsn = Lsn(xid * 1000ull + 501);
  h.xid = xid;
  return h;
}

// A stored-form transaction: `changes` get LSNs 1, 2, 3...
Transaction txn(std::vector<ChangeMessage> changes, std::uint32_t xid = 7) {
  Transaction out;
  out.header = header(xid);
  std::uint64_t lsn = 0;
  for (auto& m : changes) out.changes.push_back(Change{Lsn(++lsn), std::move(m)});
  return out;
}

pgoutput::Type mood() {
  return pgoutput::Type{std::nullopt, kMoodType, "public", "mood"};
}

// Everything: users (with its type), orders, a truncate of both, a message.
Transaction mixed() {
  return txn({mood(), users(), user_insert("1"), orders(), order_insert("9"), user_update("1"),
              user_delete("1"), pgoutput::Truncate{std::nullopt, true, false, {kUsers, kOrders}},
              pgoutput::LogicalMessage{std::nullopt, true, Lsn(10), "app", "m"}});
}

std::optional<Transaction> view_of(const ViewOptions& o, const Transaction& in) {
  auto r = apply_view(o, in);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? *r : std::nullopt;
}

std::vector<std::string> kinds(const Transaction& tx) {
  std::vector<std::string> out;
  for (const Change& c : tx.changes) {
    out.push_back(pgoutput::tag_name(static_cast<char>(pgoutput::tag_of(to_message(c.message)))));
  }
  return out;
}

using Kinds = std::vector<std::string>;

TEST(TableFilter, ParsesNamesAsPostgres) {
  TableFilter f;
  ASSERT_TRUE(f.add_name("Public.USERS").ok());
  EXPECT_TRUE(f.matches(users()));
  EXPECT_FALSE(f.matches(orders()));
  ASSERT_TRUE(f.add_name("\"Shop\".\"Order.s\"").ok());
  EXPECT_TRUE(f.matches(orders()));

  TableFilter unqualified;
  ASSERT_TRUE(unqualified.add_name("users").ok());
  EXPECT_TRUE(unqualified.matches(users()));
  TableFilter quoted_quote;
  ASSERT_TRUE(quoted_quote.add_name("public.\"a\"\"b\"").ok());
  Relation odd = users();
  odd.name = "a\"b";
  EXPECT_TRUE(quoted_quote.matches(odd));
  TableFilter catalog;
  ASSERT_TRUE(catalog.add_name("pg_catalog.settings").ok());
  EXPECT_TRUE(catalog.matches(settings()));
  // Unquoted upper case folds, so this is not the "Shop" schema.
  TableFilter folded;
  ASSERT_TRUE(folded.add_name("Shop.\"Order.s\"").ok());
  EXPECT_FALSE(folded.matches(orders()));

  for (const char* bad : {"a.b.c", "\"open", ".x", "x.", "", "\"\".x", "\"a\"b", "a\"b\""}) {
    TableFilter g;
    Status st = g.add_name(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.error().sqlstate, sqlstate::kInvalidName);
  }
}

TEST(ChangeView, NoOptionsPassEverything) {
  Transaction in = mixed();
  auto out = view_of(ViewOptions{}, in);
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, in);
}

TEST(ChangeView, FiltersByTableName) {
  ViewOptions o;
  o.tables.emplace();
  o.tables->add_table("public", "users");
  auto out = view_of(o, mixed());
  ASSERT_TRUE(out);
  EXPECT_EQ(kinds(*out),
            (Kinds{"TYPE", "RELATION", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "MESSAGE"}));
  const auto& trunc = std::get<pgoutput::Truncate>(out->changes[5].message);
  EXPECT_EQ(trunc.relation_oids, std::vector<pgoutput::Oid>{kUsers});
  EXPECT_TRUE(trunc.cascade);
  EXPECT_FALSE(trunc.restart_identity);
  EXPECT_EQ(out->changes[5].lsn, Lsn(8));
}

TEST(ChangeView, FiltersByOidAndDropsTheTypesOfFilteredTables) {
  ViewOptions o;
  o.tables.emplace();
  o.tables->add_oid(kOrders);
  auto out = view_of(o, mixed());
  ASSERT_TRUE(out);
  EXPECT_EQ(kinds(*out), (Kinds{"RELATION", "INSERT", "TRUNCATE", "MESSAGE"}));
  EXPECT_EQ(out->changes[0], (Change{Lsn(4), orders()}));
  EXPECT_EQ(std::get<pgoutput::Truncate>(out->changes[2].message).relation_oids,
            std::vector<pgoutput::Oid>{kOrders});
}

// The log stores a Type once per transaction, before the first Relation that needs it. A later
// Relation with a column of that type is sent with it even when the first table is filtered
// out (found by differential fuzzing: trigger capture, seed 8 of generator 3).
TEST(ChangeView, ARelationTakesATypeStoredBeforeAnEarlierFilteredOneOfTheTransaction) {
  Relation moody = orders();
  moody.columns.push_back(Column{0, "mood", kMoodType, -1});
  pgoutput::Insert insert = order_insert("9");
  insert.new_tuple.columns.push_back(t("ok"));
  ViewOptions o;
  o.tables.emplace();
  o.tables->add_oid(kOrders);
  auto out = view_of(o, txn({mood(), users(), user_insert("1"), moody, insert}));
  ASSERT_TRUE(out);
  EXPECT_EQ(kinds(*out), (Kinds{"TYPE", "RELATION", "INSERT"}));
  EXPECT_EQ(out->changes[0].message, ChangeMessage(mood()));
  // Unfiltered, each Relation is sent with its Types: pgoutput sends them with every Relation.
  auto all = view_of(ViewOptions{}, txn({mood(), users(), user_insert("1"), moody, insert}));
  ASSERT_TRUE(all);
  EXPECT_EQ(kinds(*all), (Kinds{"TYPE", "RELATION", "INSERT", "TYPE", "RELATION", "INSERT"}));
}

TEST(ChangeView, TruncateOfNoAllowedTableIsDropped) {
  ViewOptions o;
  o.tables.emplace();
  o.tables->add_table("pg_catalog", "settings");
  Transaction in = txn({settings(), users(), orders(),
                        pgoutput::Truncate{std::nullopt, false, true, {kUsers, kOrders}},
                        pgoutput::Insert{std::nullopt, kSettings, row({t("k")})}});
  auto out = view_of(o, in);
  ASSERT_TRUE(out);
  EXPECT_EQ(kinds(*out), (Kinds{"RELATION", "INSERT"}));
}

TEST(ChangeView, RelationIsSentOnlyBeforeTheFirstChangeThatIsSent) {
  ViewOptions o;
  o.operations = kOpInsert | kOpDelete;
  Transaction in = txn({mood(), users(), user_update("1"), orders(), order_insert("2"),
                        user_insert("3"), user_update("3"), user_delete("3")});
  auto out = view_of(o, in);
  ASSERT_TRUE(out);
  EXPECT_EQ(kinds(*out), (Kinds{"RELATION", "INSERT", "TYPE", "RELATION", "INSERT", "DELETE"}));
  // The schema records keep their own LSNs.
  EXPECT_EQ(out->changes[2].lsn, Lsn(1));
  EXPECT_EQ(out->changes[3].lsn, Lsn(2));
  EXPECT_EQ(out->changes[4].lsn, Lsn(6));
}

TEST(ChangeView, TableWithOnlyFilteredOperationsSendsNoRelation) {
  ViewOptions o;
  o.operations = kOpInsert;
  auto out = view_of(o, txn({users(), user_update("1"), orders(), order_insert("1")}));
  ASSERT_TRUE(out);
  EXPECT_EQ(kinds(*out), (Kinds{"RELATION", "INSERT"}));
  EXPECT_EQ(std::get<Relation>(out->changes[0].message).oid, kOrders);
}

TEST(ChangeView, EachOperationCanBeFilteredOut) {
  const std::vector<std::pair<OperationSet, std::string>> ops = {{kOpInsert, "INSERT"},
                                                                 {kOpUpdate, "UPDATE"},
                                                                 {kOpDelete, "DELETE"},
                                                                 {kOpTruncate, "TRUNCATE"},
                                                                 {kOpMessage, "MESSAGE"}};
  for (const auto& [op, name] : ops) {
    ViewOptions o;
    o.operations = kAllOperations & ~op;
    auto out = view_of(o, mixed());
    ASSERT_TRUE(out);
    Kinds k = kinds(*out);
    EXPECT_EQ(std::count(k.begin(), k.end(), name), 0) << name;
    // Nine records; the inserts are two changes, every other operation one.
    EXPECT_EQ(k.size(), op == kOpInsert ? 7u : 8u) << name;
  }
}

TEST(ChangeView, RelationResentWithinTransactionIsSentAgain) {
  Relation altered = users();
  altered.columns.push_back(Column{0, "email", 25, -1});
  ViewOptions o;
  o.operations = kOpInsert;
  Transaction in =
      txn({users(), user_insert("1"), altered,
           pgoutput::Update{std::nullopt, kUsers, std::nullopt,
                            row({t("1"), t("b"), null(), null(), t("e")})},
           pgoutput::Insert{std::nullopt, kUsers, row({t("2"), t("b"), null(), null(), t("e")})}});
  auto out = view_of(o, in);
  ASSERT_TRUE(out);
  EXPECT_EQ(kinds(*out), (Kinds{"RELATION", "INSERT", "RELATION", "INSERT"}));
  EXPECT_EQ(out->changes[2], (Change{Lsn(3), altered}));
}

TEST(ChangeView, EmptyTransactionsAreSkippedByDefault) {
  ViewOptions o;
  EXPECT_EQ(o.empty_transactions, EmptyTransactions::kSkip);  // PostgreSQL 15 behaviour
  o.tables.emplace();
  o.tables->add_oid(99);
  Transaction in = txn({users(), user_insert("1"), orders(), order_insert("1")});
  auto skipped = apply_view(o, in);
  ASSERT_TRUE(skipped.ok());
  EXPECT_FALSE(*skipped);

  o.empty_transactions = EmptyTransactions::kKeep;
  auto kept = view_of(o, in);
  ASSERT_TRUE(kept);
  EXPECT_TRUE(kept->changes.empty());
  EXPECT_EQ(kept->header, in.header);

  // A transaction that was empty to begin with follows the same rule.
  Transaction none = txn({});
  EXPECT_TRUE(view_of(o, none));
  auto dropped = apply_view(ViewOptions{}, none);
  ASSERT_TRUE(dropped.ok());
  EXPECT_FALSE(*dropped);
}

TEST(ChangeView, MessageEntriesFollowTheMessageOperation) {
  Transaction m;
  m.kind = EntryKind::kMessage;
  m.header = header(3);
  m.changes = {
      Change{Lsn(3500), pgoutput::LogicalMessage{std::nullopt, false, Lsn(3500), "p", "c"}}};
  ViewOptions o;
  o.tables.emplace();  // table filters do not apply to messages
  auto sent = view_of(o, m);
  ASSERT_TRUE(sent);
  EXPECT_EQ(*sent, m);
  o.operations = kOpInsert;
  o.empty_transactions = EmptyTransactions::kKeep;  // no Begin/Commit to keep for a message
  auto dropped = apply_view(o, m);
  ASSERT_TRUE(dropped.ok());
  EXPECT_FALSE(*dropped);
}

TEST(ChangeView, PublicationsChangedMarkerIsReportedAndNeverSent) {
  const pgoutput::LogicalMessage marker{std::nullopt, true, Lsn(2),
                                        std::string(kPublicationsChangedPrefix), ""};
  Transaction in = txn({users(), user_insert("1"), marker}, 4);
  ViewOptions o;  // every operation, messages included
  ChangeView view(o);
  view.start(entry_meta(in.kind, in.header, static_cast<std::uint32_t>(in.changes.size())));
  std::vector<Change> out;
  for (const Change& c : in.changes) ASSERT_TRUE(view.push(c, out).ok());
  EXPECT_TRUE(view.finish());
  EXPECT_TRUE(view.publications_changed());
  EXPECT_EQ(kinds(Transaction{in.kind, in.header, out}), (Kinds{"RELATION", "INSERT"}));

  // The next entry starts unmarked; a transaction holding only the marker is skipped.
  Transaction only = txn({marker}, 5);
  view.start(entry_meta(only.kind, only.header, 1));
  EXPECT_FALSE(view.publications_changed());
  out.clear();
  ASSERT_TRUE(view.push(only.changes[0], out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(view.finish());
  EXPECT_TRUE(view.publications_changed());

  // Another prefix is an ordinary message.
  Transaction other =
      txn({pgoutput::LogicalMessage{std::nullopt, true, Lsn(2), "pgrelay.publications", ""}}, 6);
  view.start(entry_meta(other.kind, other.header, 1));
  out.clear();
  ASSERT_TRUE(view.push(other.changes[0], out).ok());
  EXPECT_EQ(out.size(), 1u);
  EXPECT_FALSE(view.publications_changed());
}

TEST(ChangeView, PublicationsChangedMarkerNamesItsTransactionAndCatalogs) {
  auto marker = [](std::string content) {
    return pgoutput::LogicalMessage{std::nullopt, true, Lsn(2),
                                    std::string(kPublicationsChangedPrefix), std::move(content)};
  };
  ViewOptions o;
  ChangeView view(o);
  auto change_of = [&](std::string content) {
    Transaction t = txn({marker(std::move(content))}, 5);
    view.start(entry_meta(t.kind, t.header, 1));
    std::vector<Change> out;
    EXPECT_TRUE(view.push(t.changes[0], out).ok());
    EXPECT_TRUE(out.empty());
    EXPECT_TRUE(view.publications_changed());
    return view.publications_change();
  };
  auto text = [](const std::shared_ptr<const std::string>& p) {
    return p ? std::optional<std::string>(*p) : std::nullopt;
  };
  EXPECT_EQ(change_of("4294967303").xid, std::optional<std::uint64_t>(4294967303u));  // epoch 1
  EXPECT_EQ(change_of("4294967303").after, nullptr);
  EXPECT_EQ(change_of("18446744073709551615").xid, std::optional<std::uint64_t>(UINT64_MAX));
  // Catalogs before and after; an empty one is not known.
  PublicationsChange both = change_of("7\n{\"b\":1}\n{\"a\":2}");
  EXPECT_EQ(both.xid, std::optional<std::uint64_t>(7));
  EXPECT_EQ(text(both.before), std::optional<std::string>("{\"b\":1}"));
  EXPECT_EQ(text(both.after), std::optional<std::string>("{\"a\":2}"));
  PublicationsChange after_only = change_of("8\n\n{}");
  EXPECT_EQ(after_only.before, nullptr);
  EXPECT_EQ(text(after_only.after), std::optional<std::string>("{}"));
  // Older markers name none, and anything else is not a transaction.
  for (const char* content :
       {"", "12x", "-3", " 7", "18446744073709551616", "9\n{}", "\n\n{}", "9\n{}\n{}\n{}"}) {
    PublicationsChange none = change_of(content);
    EXPECT_EQ(none.xid, std::nullopt) << content;
    EXPECT_EQ(none.before, nullptr) << content;
    EXPECT_EQ(none.after, nullptr) << content;
  }
  Transaction plain = txn({user_insert("1")}, 6);
  view.start(entry_meta(plain.kind, plain.header, 1));
  EXPECT_EQ(view.publications_change().xid, std::nullopt);  // each entry starts unmarked
  EXPECT_EQ(view.publications_change().after, nullptr);
}

TEST(ChangeView, ARefusingViewFailsAtTheFirstChangeAndLetsMessagesPass) {
  ViewOptions o;
  o.refused = Error::make(sqlstate::kUndefinedObject, "publication \"p\" does not exist");
  ChangeView view(o);
  const pgoutput::LogicalMessage message{std::nullopt, true, Lsn(2), "app", "hello"};
  Transaction in = txn({users(), message, user_insert("1")}, 4);
  view.start(entry_meta(in.kind, in.header, static_cast<std::uint32_t>(in.changes.size())));
  std::vector<Change> out;
  ASSERT_TRUE(view.push(in.changes[0], out).ok());  // a Relation alone sends nothing yet
  ASSERT_TRUE(view.push(in.changes[1], out).ok());
  EXPECT_EQ(kinds(Transaction{in.kind, in.header, out}), (Kinds{"MESSAGE"}));
  Status refused = view.push(in.changes[2], out);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().sqlstate, sqlstate::kUndefinedObject);
  EXPECT_EQ(out.size(), 1u);
}

TEST(FirstPublicationsChange, FindsTheFirstMarkerFromAStartPastValuesThatOnlyHoldItsPrefix) {
  testing::TempDir dir;
  LogOptions lo;
  lo.dir = dir.path();
  lo.sync = SyncPolicy::kNone;
  auto log = ChangeLog::open(lo);
  ASSERT_TRUE(log.ok()) << log.error().to_string();
  const std::string prefix(kPublicationsChangedPrefix);
  auto marker = [&](std::string content) {
    return pgoutput::LogicalMessage{std::nullopt, true, Lsn(3), prefix, std::move(content)};
  };
  // Values larger than a record, so that entries span several: one holding the prefix's text.
  auto insert_of = [](const std::string& id, std::string bio) {
    return pgoutput::Insert{std::nullopt, kUsers, row({t(id), t("n"), t(std::move(bio)), null()})};
  };
  const std::string filler(300000, 'a');
  auto append = [&](const Transaction& in) {
    auto encoded = encode_transaction(in);
    ASSERT_TRUE(encoded.ok()) << encoded.error().to_string();
    const PendingEntry entry = encoded->pending();
    ASSERT_TRUE((*log)->append({&entry, 1}).ok());
  };
  append(txn({users(), user_insert("1")}, 1));
  append(txn({users(), insert_of("2", filler + prefix + filler)}, 2));
  auto none = first_publications_change(**log, Lsn(0));
  ASSERT_TRUE(none.ok()) << none.error().to_string();
  EXPECT_FALSE(none->has_value());  // a value holding the prefix is no marker

  append(txn({users(), insert_of("3", filler + filler), marker("3\n{\"b\":3}\n{\"a\":3}")}, 3));
  append(txn({marker("4\n{\"b\":4}\n{\"a\":4}")}, 4));
  auto first = first_publications_change(**log, Lsn(0));
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->xid, std::optional<std::uint64_t>(3));
  ASSERT_NE((*first)->before, nullptr);
  EXPECT_EQ(*(*first)->before, "{\"b\":3}");
  // From after the third transaction's commit: the fourth's; after that, none.
  auto next = first_publications_change(**log, Lsn(3501));
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->xid, std::optional<std::uint64_t>(4));
  auto after = first_publications_change(**log, Lsn(4501));
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value());
}

// A log of marker transactions, each appended as marked or not as the test says.
class MarkerLog {
 public:
  MarkerLog() { reopen(); }
  void close() { log_.reset(); }
  void reopen() {
    log_.reset();
    LogOptions lo;
    lo.dir = dir_.path();
    lo.sync = SyncPolicy::kNone;
    auto log = ChangeLog::open(lo);
    ASSERT_TRUE(log.ok()) << log.error().to_string();
    log_ = std::move(*log);
  }
  // Reopens the log without its marks file, as one written before the log kept marks: it can no
  // longer vouch for its entries, which are then searched.
  void reopen_without_marks() {
    log_.reset();
    ASSERT_EQ(::unlink((dir_.path() + "/" + kMarksName).c_str()), 0);
    reopen();
  }
  // Transaction `xid` holding a marker (or only a row) at commit LSN xid*1000+500.
  void append(std::uint32_t xid, bool with_marker, bool marked) {
    const pgoutput::LogicalMessage marker{
        std::nullopt, true, Lsn(3), std::string(kPublicationsChangedPrefix),
        std::to_string(xid) + "\n{\"b\":" + std::to_string(xid) + "}\n{}"};
    auto encoded = with_marker ? encode_transaction(txn({users(), user_insert("1"), marker}, xid))
                               : encode_transaction(txn({users(), user_insert("1")}, xid));
    ASSERT_TRUE(encoded.ok()) << encoded.error().to_string();
    EXPECT_EQ(encoded->marked, with_marker);
    PendingEntry entry = encoded->pending();
    entry.marked = marked;
    ASSERT_TRUE(log_->append({&entry, 1}).ok());
  }
  // The xid of the first marker from `start`, 0 for none.
  std::uint64_t first_from(Lsn start) {
    auto first = first_publications_change(*log_, start);
    EXPECT_TRUE(first.ok()) << first.error().to_string();
    return first.ok() && first->has_value() ? (*first)->xid.value_or(0) : 0;
  }
  // The xid of the last marker from `start`, 0 for none.
  std::uint64_t last_from(Lsn start) {
    auto last = last_publications_change(*log_, start);
    EXPECT_TRUE(last.ok()) << last.error().to_string();
    return last.ok() && last->has_value() ? (*last)->xid.value_or(0) : 0;
  }
  const testing::TempDir& dir() const { return dir_; }
  // Where the active segment's data ends (its file is allocated further).
  std::uint64_t data_end() const { return log_->segments().back().bytes; }

 private:
  testing::TempDir dir_;
  std::unique_ptr<ChangeLog> log_;
};

TEST(FirstPublicationsChange, ReadsOnlyTheEntriesTheLogListsAsMarked) {
  MarkerLog log;
  // An entry holding a marker that was appended unmarked is not read: only listed entries are.
  log.append(1, /*with_marker=*/true, /*marked=*/false);
  EXPECT_EQ(log.first_from(Lsn(0)), 0u);
  log.append(2, true, true);
  EXPECT_EQ(log.first_from(Lsn(0)), 2u);
  EXPECT_EQ(log.first_from(Lsn(2501)), 0u);
}

TEST(FirstPublicationsChange, SearchesTheDataOfEntriesFromBeforeTheLogKeptMarks) {
  MarkerLog log;
  log.append(1, /*with_marker=*/true, /*marked=*/false);
  log.append(2, false, false);
  log.append(3, true, false);
  log.reopen_without_marks();
  EXPECT_EQ(log.first_from(Lsn(0)), 1u);
  EXPECT_EQ(log.first_from(Lsn(1501)), 3u);
  EXPECT_EQ(log.first_from(Lsn(3501)), 0u);
  // Entries appended since are listed.
  log.append(4, false, false);
  log.append(5, true, true);
  EXPECT_EQ(log.first_from(Lsn(3501)), 5u);
  EXPECT_EQ(log.first_from(Lsn(1501)), 3u);
}

TEST(FirstPublicationsChange, PassesOverAListedEntryThatACrashTook) {
  MarkerLog log;
  log.append(1, false, false);
  const std::string segment = log.dir().path() + "/" + segment_file_name(1);
  const auto before = log.data_end();
  log.append(2, true, true);
  // The crash came after the marks file listed transaction 2 and before its batch was whole.
  log.close();
  std::filesystem::resize_file(segment, before + 7);
  log.reopen();
  EXPECT_EQ(log.first_from(Lsn(0)), 0u);
  // Its source sends transaction 2 again, now without a marker (or a later one instead).
  log.append(2, false, false);
  EXPECT_EQ(log.first_from(Lsn(0)), 0u);
  log.append(3, true, true);
  EXPECT_EQ(log.first_from(Lsn(0)), 3u);
}

TEST(LastPublicationsChange, FindsTheNewestMarkerListedOrSearched) {
  MarkerLog log;
  log.append(1, /*with_marker=*/true, /*marked=*/false);
  log.append(2, true, false);
  log.append(3, false, false);
  log.reopen_without_marks();
  // Only entries from before the log kept marks: their data is searched, the newest wins.
  EXPECT_EQ(log.last_from(Lsn(0)), 2u);
  EXPECT_EQ(log.last_from(Lsn(2501)), 0u);
  log.append(4, true, true);
  log.append(5, false, false);
  // A listed one after them is newer.
  EXPECT_EQ(log.last_from(Lsn(0)), 4u);
  EXPECT_EQ(log.last_from(Lsn(4501)), 0u);
  // An entry holding a marker appended unmarked is not read, as for the first marker.
  log.append(6, true, false);
  EXPECT_EQ(log.last_from(Lsn(0)), 4u);
}

TEST(ChangeView, ChangeForUndescribedRelationIsCorruption) {
  ViewOptions o;
  for (ChangeMessage m :
       {ChangeMessage(user_insert("1")),
        ChangeMessage(pgoutput::Truncate{std::nullopt, false, false, {kUsers}})}) {
    auto r = apply_view(o, txn({orders(), m}));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().sqlstate, sqlstate::kDataCorrupted);
    EXPECT_NE(r.error().message.find("16384"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("0/2"), std::string::npos) << r.error().message;
  }
}

// --- delta updates ---

// users as data with a full old row would come: key flagged on id only.
pgoutput::Update full_user_update() {
  return {std::nullopt, kUsers,
          OldTuple{OldKind::kFull,
                   row({t("1"), t("ann"), TupleValue::binary(std::string("\0a", 2)), null()})},
          row({t("1"), t("anne"), TupleValue::binary(std::string("\0a", 2)), null()})};
}

TEST(DeltaUpdate, KeepsChangedColumnsAndTheKey) {
  std::vector<bool> key = key_columns(users(), {});
  EXPECT_EQ(key, (std::vector<bool>{true, false, false, false}));
  pgoutput::Update d = delta_update(key, full_user_update());
  ASSERT_TRUE(d.old);
  EXPECT_EQ(d.old->kind, OldKind::kKey);
  EXPECT_EQ(d.old->tuple, row({t("1"), null(), null(), null()}));
  EXPECT_EQ(d.new_tuple,
            row({t("1"), t("anne"), TupleValue::unchanged(), TupleValue::unchanged()}));
  EXPECT_EQ(d.relation_oid, kUsers);
}

TEST(DeltaUpdate, KeyColumnsStayEvenWhenUnchangedAndChangedKeysShow) {
  std::vector<bool> key = key_columns(users(), {});
  pgoutput::Update u = full_user_update();
  u.new_tuple.columns[0] = t("2");                   // the key changed
  u.new_tuple.columns[2] = TupleValue::unchanged();  // TOASTed and untouched
  u.old->tuple.columns[3] = t("sad");
  u.new_tuple.columns[3] = null();  // set to null: a change
  pgoutput::Update d = delta_update(key, u);
  EXPECT_EQ(d.old->tuple, row({t("1"), null(), null(), null()}));
  EXPECT_EQ(d.new_tuple, row({t("2"), t("anne"), TupleValue::unchanged(), null()}));
}

TEST(DeltaUpdate, PassesUpdatesItCannotCompare) {
  std::vector<bool> key = key_columns(users(), {});
  // No old tuple, or only the key: without old values nothing can be compared.
  pgoutput::Update none = user_update("1");
  EXPECT_EQ(delta_update(key, none), none);
  pgoutput::Update key_only = full_user_update();
  key_only.old->kind = OldKind::kKey;
  EXPECT_EQ(delta_update(key, key_only), key_only);
  // Every column is key (REPLICA IDENTITY FULL as pgoutput flags it), or none is.
  pgoutput::Update u = full_user_update();
  EXPECT_EQ(delta_update(std::vector<bool>(4, true), u), u);
  EXPECT_EQ(delta_update(std::vector<bool>(4, false), u), u);
  // Tuples that do not fit the relation.
  EXPECT_EQ(delta_update(std::vector<bool>{true, false}, u), u);
}

TEST(DeltaUpdate, ViewAppliesItOnlyWhenAsked) {
  Transaction in = txn({users(), full_user_update(), user_insert("5")});
  auto plain = view_of(ViewOptions{}, in);
  ASSERT_TRUE(plain);
  EXPECT_EQ(*plain, in);
  ViewOptions o;
  o.delta_updates = true;
  auto delta = view_of(o, in);
  ASSERT_TRUE(delta);
  ASSERT_EQ(delta->changes.size(), 3u);
  EXPECT_EQ(std::get<pgoutput::Update>(delta->changes[1].message),
            delta_update(key_columns(users(), {}), full_user_update()));
  EXPECT_EQ(delta->changes[2], in.changes[2]);
}

TEST(DeltaUpdate, KeyHookGivesFullIdentityTablesAKey) {
  pgoutput::Update u{std::nullopt, kOrders,
                     OldTuple{OldKind::kFull, row({t("9"), t("x"), t("1.00")})},
                     row({t("9"), t("x"), t("2.00")})};
  Transaction in = txn({orders(), u});
  ViewOptions o;
  o.delta_updates = true;
  auto without = view_of(o, in);
  ASSERT_TRUE(without);
  EXPECT_EQ(*without, in);  // every column is flagged key: nothing to reduce
  o.delta_keys = [](const Relation& rel) {
    return rel.oid == kOrders ? std::vector<std::string>{"id"} : std::vector<std::string>{};
  };
  auto with = view_of(o, in);
  ASSERT_TRUE(with);
  const auto& d = std::get<pgoutput::Update>(with->changes[1].message);
  EXPECT_EQ(d.old->kind, OldKind::kKey);
  EXPECT_EQ(d.old->tuple, row({t("9"), null(), null()}));
  EXPECT_EQ(d.new_tuple, row({t("9"), TupleValue::unchanged(), t("2.00")}));
  // The Relation goes out as stored.
  EXPECT_EQ(with->changes[0], in.changes[0]);
}

// --- through the log ---

// ---- partitions published via an ancestor (publish_via_partition_root) ----

constexpr pgoutput::Oid kRoot = 16500;
constexpr pgoutput::Oid kLeafUs = 16510;
constexpr pgoutput::Oid kLeafEu = 16520;
constexpr pgoutput::Oid kPlain = 16530;

// m (id, region, v, mood), keyed by (id, region), as the catalog describes it.
Relation root_m() {
  Relation r;
  r.oid = kRoot;
  r.namespace_name = "public";
  r.name = "m";
  r.columns = {Column{pgoutput::kColumnIsKey, "id", 23, -1},
               Column{pgoutput::kColumnIsKey, "region", 25, -1}, Column{0, "v", 25, -1},
               Column{0, "mood", kMoodType, -1}};
  return r;
}

// m_us, attached with its own column order: (mood, v, region, id).
Relation leaf_us() {
  Relation r;
  r.oid = kLeafUs;
  r.namespace_name = "public";
  r.name = "m_us";
  r.columns = {Column{0, "mood", kMoodType, -1}, Column{0, "v", 25, -1},
               Column{pgoutput::kColumnIsKey, "region", 25, -1},
               Column{pgoutput::kColumnIsKey, "id", 23, -1}};
  return r;
}

Relation leaf_eu() {
  Relation r = root_m();
  r.oid = kLeafEu;
  r.name = "m_eu";
  return r;
}

Relation plain() {
  Relation r = settings();
  r.oid = kPlain;
  r.namespace_name = "public";
  r.name = "plain";
  return r;
}

// A view publishing m_us and m_eu as m (2 leaves), and plain as itself.
ViewOptions via_root(OperationSet ops, bool truncate,
                     std::optional<std::vector<std::string>> columns = std::nullopt,
                     char identity = pgoutput::kReplicaIdentityDefault) {
  auto as = std::make_shared<PublishedAs>();
  as->relation = root_m();
  as->relation.replica_identity = identity;
  as->leaves = 2;
  as->truncate = truncate;
  PublicationTables pubs;
  for (const Relation& leaf : {leaf_us(), leaf_eu()}) {
    TableRule rule;
    rule.operations = ops;
    rule.columns = columns;
    rule.publish_as = as;
    pubs.tables[leaf.oid] = rule;
    pubs.names[{leaf.namespace_name, leaf.name}] = leaf.oid;
  }
  TableRule rule;
  rule.operations = kAllOperations;
  pubs.tables[kPlain] = rule;
  pubs.names[{"public", "plain"}] = kPlain;
  ViewOptions o;
  o.publications = std::move(pubs);
  return o;
}

TEST(PublishedViaRoot, ChangesGoOutAsTheAncestorsAfterItsRelationAndThePartitions) {
  const Tuple us = row({t("calm"), t("hello"), t("us"), t("7")});
  auto out = view_of(
      via_root(kAllOperations, true),
      txn({mood(), leaf_us(), pgoutput::Insert{std::nullopt, kLeafUs, us},
           pgoutput::Update{std::nullopt, kLeafUs,
                            OldTuple{OldKind::kKey, row({null(), null(), t("us"), t("7")})},
                            row({t("calm"), t("moved"), t("us"), t("8")})},
           pgoutput::Delete{std::nullopt, kLeafUs,
                            OldTuple{OldKind::kKey, row({null(), null(), t("us"), t("8")})}}}));
  ASSERT_TRUE(out);
  // maybe_send_schema: the ancestor's Types and Relation, then the partition's own.
  EXPECT_EQ(kinds(*out),
            (Kinds{"TYPE", "RELATION", "TYPE", "RELATION", "INSERT", "UPDATE", "DELETE"}));
  EXPECT_EQ(std::get<Relation>(out->changes[1].message), root_m());
  EXPECT_EQ(std::get<Relation>(out->changes[3].message), leaf_us());
  const auto& insert = std::get<pgoutput::Insert>(out->changes[4].message);
  EXPECT_EQ(insert.relation_oid, kRoot);
  EXPECT_EQ(insert.new_tuple, row({t("7"), t("us"), t("hello"), t("calm")}));
  const auto& update = std::get<pgoutput::Update>(out->changes[5].message);
  EXPECT_EQ(update.relation_oid, kRoot);
  ASSERT_TRUE(update.old);
  EXPECT_EQ(update.old->kind, OldKind::kKey);
  EXPECT_EQ(update.old->tuple, row({t("7"), t("us"), null(), null()}));
  EXPECT_EQ(update.new_tuple, row({t("8"), t("us"), t("moved"), t("calm")}));
  const auto& del = std::get<pgoutput::Delete>(out->changes[6].message);
  EXPECT_EQ(del.relation_oid, kRoot);
  EXPECT_EQ(del.old.tuple, row({t("8"), t("us"), null(), null()}));
}

TEST(PublishedViaRoot, TheOldTupleIsFlaggedByTheAncestorsReplicaIdentity) {
  // The partition is REPLICA IDENTITY FULL (its old rows are whole), m is not: pgoutput writes
  // 'K' with the whole row; and the other way round 'O' with only the key.
  const Tuple whole = row({t("calm"), t("v"), t("us"), t("7")});
  auto key =
      view_of(via_root(kAllOperations, true),
              txn({mood(), leaf_us(),
                   pgoutput::Delete{std::nullopt, kLeafUs, OldTuple{OldKind::kFull, whole}}}));
  ASSERT_TRUE(key);
  EXPECT_EQ(std::get<pgoutput::Delete>(key->changes.back().message).old.kind, OldKind::kKey);
  auto full = view_of(
      via_root(kAllOperations, true, std::nullopt, pgoutput::kReplicaIdentityFull),
      txn({mood(), leaf_us(),
           pgoutput::Delete{std::nullopt, kLeafUs,
                            OldTuple{OldKind::kKey, row({null(), null(), t("us"), t("7")})}}}));
  ASSERT_TRUE(full);
  EXPECT_EQ(std::get<pgoutput::Delete>(full->changes.back().message).old.kind, OldKind::kFull);
}

TEST(PublishedViaRoot, TheAncestorsColumnListProjectsBothRelationsAndTheTuples) {
  auto out = view_of(via_root(kAllOperations, true, std::vector<std::string>{"id", "region"}),
                     txn({mood(), leaf_us(),
                          pgoutput::Insert{std::nullopt, kLeafUs,
                                           row({t("calm"), t("hello"), t("us"), t("7")})}}));
  ASSERT_TRUE(out);
  // The mood column is not in the list: no Type for either Relation.
  EXPECT_EQ(kinds(*out), (Kinds{"RELATION", "RELATION", "INSERT"}));
  const auto& root = std::get<Relation>(out->changes[0].message);
  ASSERT_EQ(root.columns.size(), 2u);
  EXPECT_EQ(root.columns[0].name, "id");
  EXPECT_EQ(root.columns[1].name, "region");
  const auto& leaf = std::get<Relation>(out->changes[1].message);
  ASSERT_EQ(leaf.columns.size(), 2u);
  EXPECT_EQ(leaf.columns[0].name, "region");
  EXPECT_EQ(std::get<pgoutput::Insert>(out->changes[2].message).new_tuple, row({t("7"), t("us")}));
}

TEST(PublishedViaRoot, ATruncateOfEveryPartitionIsTheAncestorsAndOfFewerIsNotSent) {
  const pgoutput::Truncate all{std::nullopt, false, true, {kLeafEu, kLeafUs, kPlain}};
  auto out = view_of(via_root(kAllOperations, true),
                     txn({mood(), leaf_eu(), mood(), leaf_us(), plain(), all}));
  ASSERT_TRUE(out);
  EXPECT_EQ(kinds(*out), (Kinds{"TYPE", "RELATION", "RELATION", "TRUNCATE"}));
  EXPECT_EQ(std::get<Relation>(out->changes[1].message).oid, kRoot);
  const auto& truncate = std::get<pgoutput::Truncate>(out->changes.back().message);
  EXPECT_EQ(truncate.relation_oids, (std::vector<pgoutput::Oid>{kRoot, kPlain}));
  EXPECT_TRUE(truncate.restart_identity);

  // One partition alone: pgoutput sends neither it nor the ancestor.
  auto one = view_of(via_root(kAllOperations, true),
                     txn({leaf_eu(), pgoutput::Truncate{std::nullopt, false, false, {kLeafEu}}}));
  EXPECT_FALSE(one);
  // The ancestor's publications do not publish TRUNCATE: only plain is left.
  auto without =
      view_of(via_root(kAllOperations, false), txn({leaf_eu(), mood(), leaf_us(), plain(), all}));
  ASSERT_TRUE(without);
  EXPECT_EQ(std::get<pgoutput::Truncate>(without->changes.back().message).relation_oids,
            (std::vector<pgoutput::Oid>{kPlain}));
}

TEST(PublishedViaRoot, AStoredLayoutNewerThanTheViewKeepsItsValues) {
  // The view read m before ADD COLUMN note; the stored Relation of m_eu already has it. The
  // value goes out, after the ancestor's columns, and no value is made up.
  Relation eu = leaf_eu();
  eu.columns.push_back(Column{0, "note", 25, -1});
  auto out = view_of(via_root(kAllOperations, true),
                     txn({mood(), eu,
                          pgoutput::Insert{std::nullopt, kLeafEu,
                                           row({t("1"), t("eu"), t("v"), t("calm"), t("n")})}}));
  ASSERT_TRUE(out);
  const auto& root = std::get<Relation>(out->changes[1].message);
  ASSERT_EQ(root.columns.size(), 5u);
  EXPECT_EQ(root.columns[4].name, "note");
  EXPECT_EQ(std::get<pgoutput::Insert>(out->changes.back().message).new_tuple,
            row({t("1"), t("eu"), t("v"), t("calm"), t("n")}));
}

TEST(PublishedViaRoot, TheAncestorIsPartOfTheViewKey) {
  ViewOptions a = via_root(kAllOperations, true);
  ViewOptions b = via_root(kAllOperations, true, std::nullopt, pgoutput::kReplicaIdentityFull);
  EXPECT_NE(a.publications->key(), b.publications->key());
  EXPECT_EQ(a.publications->key(), via_root(kAllOperations, true).publications->key());
}

// A log in `dir` holding `txns`, one entry each; null (after a failure) when that fails.
std::unique_ptr<ChangeLog> log_of(const testing::TempDir& dir,
                                  const std::vector<Transaction>& txns) {
  LogOptions lo;
  lo.dir = dir.path();
  lo.sync = SyncPolicy::kNone;
  auto log = ChangeLog::open(lo);
  if (!log.ok()) {
    ADD_FAILURE() << log.error().to_string();
    return nullptr;
  }
  for (const Transaction& tx : txns) {
    auto e = encode_transaction(tx);
    if (!e.ok()) {
      ADD_FAILURE() << e.error().to_string();
      return nullptr;
    }
    PendingEntry p = e->pending();
    if (auto st = (*log)->append(std::span<const PendingEntry>(&p, 1)); !st.ok()) {
      ADD_FAILURE() << st.error().to_string();
      return nullptr;
    }
  }
  return std::move(*log);
}

TEST(ViewReader, ReadsFilteredEntriesFromACursor) {
  testing::TempDir tmp;
  auto log =
      log_of(tmp, {txn({users(), user_insert("1"), orders(), order_insert("2")}, 1),
                   txn({orders(), order_insert("3")}, 2), txn({users(), user_delete("1")}, 3)});
  ASSERT_TRUE(log);
  ViewOptions o;
  o.tables.emplace();
  o.tables->add_table("public", "users");
  ChangeView view(o);
  auto cursor = log->open_cursor(Lsn(0));
  ASSERT_TRUE(cursor.ok());
  std::vector<std::pair<std::uint32_t, Kinds>> sent;
  std::vector<std::uint32_t> skipped;
  while (true) {
    auto meta = (*cursor)->next_entry();
    ASSERT_TRUE(meta.ok());
    if (!*meta) break;
    ViewReader reader(view, **cursor, **meta);
    Transaction got;
    while (true) {
      auto c = reader.next();
      ASSERT_TRUE(c.ok()) << c.error().to_string();
      if (!*c) break;
      got.changes.push_back(std::move(**c));
    }
    if (reader.send_entry()) {
      sent.emplace_back((*meta)->xid, kinds(got));
    } else {
      EXPECT_TRUE(got.changes.empty());
      skipped.push_back((*meta)->xid);
    }
  }
  EXPECT_EQ(sent, (std::vector<std::pair<std::uint32_t, Kinds>>{{1, {"RELATION", "INSERT"}},
                                                                {3, {"RELATION", "DELETE"}}}));
  EXPECT_EQ(skipped, std::vector<std::uint32_t>{2});
}

TEST(ViewReader, PausesAtPublicationMarkersAndGoesOnWithReplacedOptions) {
  testing::TempDir tmp;
  const pgoutput::LogicalMessage marker{std::nullopt, true, Lsn(3),
                                        std::string(kPublicationsChangedPrefix), ""};
  auto log = log_of(tmp, {txn({users(), orders(), user_insert("1"), order_insert("2"), marker,
                               user_insert("3"), order_insert("4")},
                              1)});
  ASSERT_TRUE(log);

  ViewOptions only_orders;
  only_orders.tables.emplace();
  only_orders.tables->add_table("Shop", "Order.s");
  ViewOptions both = only_orders;
  both.tables->add_table("public", "users");
  ChangeView view(only_orders);
  view.pause_at_publication_changes(true);
  auto cursor = log->open_cursor(Lsn(0));
  ASSERT_TRUE(cursor.ok());
  auto meta = (*cursor)->next_entry();
  ASSERT_TRUE(meta.ok() && meta->has_value());
  ViewReader reader(view, **cursor, **meta);
  auto read_all = [&] {
    Transaction got;
    while (true) {
      auto c = reader.next();
      EXPECT_TRUE(c.ok()) << c.error().to_string();
      if (!c.ok() || !*c) break;
      got.changes.push_back(std::move(**c));
    }
    return kinds(got);
  };
  // Up to the marker through the first options; the Relation sent already is sent again.
  EXPECT_EQ(read_all(), (Kinds{"RELATION", "INSERT"}));
  EXPECT_TRUE(reader.paused());
  EXPECT_TRUE(view.publications_changed());
  view.replace_options(both);
  EXPECT_EQ(read_all(), (Kinds{"RELATION", "INSERT", "RELATION", "INSERT"}));
  EXPECT_FALSE(reader.paused());
  EXPECT_TRUE(reader.send_entry());
}

// pgoutput_truncate sends Begin and the schema of each table it keeps before it gets to a table
// whose publications it cannot combine, and fails there: the reader gives those Relations, then
// the error (the walsender sends Begin before the first of them).
TEST(ViewReader, TruncateRefusedAtATableComesAfterTheRelationsOfThoseBeforeIt) {
  PublicationTables pubs;
  TableRule fine;
  fine.operations = kAllOperations;
  TableRule refused = fine;
  refused.error = Error::make("0A000", "cannot use different column lists for table");
  pubs.tables[kUsers] = fine;
  pubs.tables[kOrders] = refused;
  ViewOptions o;
  o.publications = std::move(pubs);
  auto read = [&](std::vector<pgoutput::Oid> truncated) {
    testing::TempDir tmp;
    auto log = log_of(
        tmp, {txn({users(), orders(), pgoutput::Truncate{std::nullopt, false, false, truncated}})});
    EXPECT_TRUE(log);
    ChangeView view(o);
    auto cursor = log->open_cursor(Lsn(0));
    EXPECT_TRUE(cursor.ok());
    auto meta = (*cursor)->next_entry();
    EXPECT_TRUE(meta.ok() && meta->has_value());
    ViewReader reader(view, **cursor, **meta);
    Kinds got;
    for (;;) {
      auto c = reader.next();
      if (!c.ok()) {
        got.push_back("error " + c.error().sqlstate);
        break;
      }
      if (!*c) break;
      got.push_back(
          pgoutput::tag_name(static_cast<char>(pgoutput::tag_of(to_message((*c)->message)))));
    }
    return got;
  };
  EXPECT_EQ(read({kUsers, kOrders}), (Kinds{"RELATION", "error 0A000"}));
  EXPECT_EQ(read({kOrders, kUsers}), (Kinds{"error 0A000"}));
  EXPECT_EQ(read({kUsers}), (Kinds{"RELATION", "TRUNCATE"}));
}

}  // namespace
}  // namespace pgrelay::log
