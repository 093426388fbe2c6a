// Reader-side views of stored transactions: table and operation filters, and delta updates.
//
// A view decides, change by change, what a consumer is sent, the way pgoutput decides what a
// publication publishes:
//  - Changes of tables outside the table filter, and operations outside the operation set,
//    are dropped. A Relation (with the Type records before it) is sent only before the first
//    change of its table that is sent, never for a table nothing is sent for.
//  - A Truncate keeps the allowed tables it names and is dropped when none is left.
//  - Logical messages are not tied to a table: only the operation set (kMessage) decides.
//  - A transaction left without changes is skipped by default, as pgoutput does since
//    PostgreSQL 15 (it sends Begin lazily before the first published change and drops the
//    Commit of a transaction that sent none); EmptyTransactions::kKeep sends Begin/Commit
//    anyway, as PostgreSQL 14 and older did. Either way the consumer should count a skipped
//    transaction's end LSN as progress (pgoutput sends a keepalive for it).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/result.h"
#include "log/transaction.h"

namespace pgrelay::log {

// Operations a view lets through; combine with |.
enum Operation : std::uint8_t {
  kOpInsert = 1,
  kOpUpdate = 2,
  kOpDelete = 4,
  kOpTruncate = 8,
  kOpMessage = 16,
};
using OperationSet = std::uint8_t;
inline constexpr OperationSet kAllOperations =
    kOpInsert | kOpUpdate | kOpDelete | kOpTruncate | kOpMessage;

// A set of tables, by schema-qualified name and/or by relation OID.
class TableFilter {
 public:
  // Exact names, as Relation messages carry them ("pg_catalog" matches the empty namespace
  // pgoutput sends for it).
  void add_table(std::string schema, std::string table);
  // "schema.table" read as Postgres reads identifiers: unquoted parts are folded to lower
  // case, "double quoted" ones are kept as written (with "" for a quote). An unqualified name
  // means schema public.
  Status add_name(std::string_view qualified_name);
  void add_oid(pgoutput::Oid oid) { oids_.insert(oid); }
  // Every table of a schema, present or future (a publication's FOR TABLES IN SCHEMA).
  void add_schema(std::string schema) { schemas_.insert(std::move(schema)); }

  bool matches(const pgoutput::Relation& relation) const;

 private:
  std::set<std::pair<std::string, std::string>> names_;
  std::set<pgoutput::Oid> oids_;
  std::set<std::string> schemas_;
};

enum class EmptyTransactions {
  kSkip,  // PostgreSQL 15+ pgoutput: a transaction with nothing to send is not sent
  kKeep,  // send Begin/Commit even when every change was filtered out
};

// For the delta view: the key columns of a table by name; an empty result means "use the
// columns the Relation flags as key".
using KeyColumnsFn = std::function<std::vector<std::string>(const pgoutput::Relation&)>;

struct ViewOptions {
  std::optional<TableFilter> tables;  // nullopt: every table
  OperationSet operations = kAllOperations;
  EmptyTransactions empty_transactions = EmptyTransactions::kSkip;
  // Send updates as deltas (see delta_update()).
  bool delta_updates = false;
  // Where the key comes from when delta_updates is set. pgoutput flags every column of a
  // REPLICA IDENTITY FULL table as key, and only such tables' updates carry a full old row,
  // so without this hook deltas only apply to data whose Relation flags a narrower key.
  KeyColumnsFn delta_keys;
};

// Reduces an update to the changed columns plus the key, given which columns form the key
// (one flag per column): the new tuple marks unchanged non-key columns as unchanged ('u') and
// the old tuple becomes a key tuple ('K', non-key columns null). Only an update with the full
// old row ('O') is reduced: without the old values nothing can be compared, so one without an
// old tuple or with a key-only one is returned as it is; so is one whose tuples do not match
// `key` in size, or whose key is empty or every column.
pgoutput::Update delta_update(const std::vector<bool>& key, pgoutput::Update update);
// One flag per column of `relation`: the named columns, or the flagged ones if `names` is empty.
std::vector<bool> key_columns(const pgoutput::Relation& relation,
                              const std::vector<std::string>& names);

// Applies ViewOptions to the entries of a log, one entry at a time:
//   start(meta); for each change: push(change, out) and send what it appended to `out`
//   (send Begin, and Origin, before the first of them); finish() says whether to send the
//   entry at all: for a transaction, Begin (if not sent yet) and Commit; for a message entry,
//   whether its message was appended.
class ChangeView {
 public:
  explicit ChangeView(ViewOptions options) : options_(std::move(options)) {}

  void start(const EntryMeta& meta);
  // Appends what is to be sent for `change` (nothing, or the change, perhaps reduced, after
  // the Types and Relation it needs). A change for a relation the entry has not described is
  // an XX001 error: stored data is self-describing.
  Status push(Change change, std::vector<Change>& out);
  bool finish();

  const ViewOptions& options() const { return options_; }

 private:
  struct RelationState {
    pgoutput::Relation relation;
    Lsn lsn;
    std::vector<Change> types;  // Type records stored just before the Relation
    bool allowed = false;
    bool sent = false;
    std::vector<bool> key;  // for delta updates
  };
  Result<RelationState*> state_for(pgoutput::Oid oid, Lsn lsn);
  void send_relation(RelationState& state, std::vector<Change>& out);

  ViewOptions options_;
  EntryMeta meta_;
  std::unordered_map<pgoutput::Oid, RelationState> relations_;
  std::vector<Change> pending_types_;
  bool sent_any_ = false;
};

// Reads one entry from a Cursor through a view: the changes to send, one at a time.
class ViewReader {
 public:
  ViewReader(ChangeView& view, Cursor& cursor, const EntryMeta& meta);

  // The next change to send, or nullopt at the end of the entry.
  Result<std::optional<Change>> next();
  // After next() returned nullopt: whether the entry is sent (ChangeView::finish()).
  bool send_entry() const { return send_entry_; }

 private:
  ChangeView& view_;
  EntryReader reader_;
  std::vector<Change> queue_;
  std::size_t queue_pos_ = 0;
  bool done_ = false;
  bool send_entry_ = false;
};

// The view of a whole in-memory transaction; nullopt when the view skips it.
Result<std::optional<Transaction>> apply_view(const ViewOptions& options, const Transaction& txn);

}  // namespace pgrelay::log
