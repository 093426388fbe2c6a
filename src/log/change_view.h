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
//  - With PublicationTables (PostgreSQL 15 publications), each table has its own publish
//    actions, column list and per-action row filters, applied as pgoutput applies them (see
//    PublicationTables below).
//  - A logical message with the prefix kPublicationsChangedPrefix is never sent: capture logs
//    it where the upstream's publications changed. The view reports it (publications_changed())
//    and can pause there (pause_at_publication_changes()) so that its owner re-reads them and
//    goes on with replace_options(), as pgoutput does on the publication invalidations it
//    decodes, in the middle of the transaction that made them included.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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

// A row filter bound to one layout of a table: whether a tuple passes (SQL NULL counts as
// false). An error ends the stream (say, a value the filter needs is an unchanged TOAST value).
using TupleFilter = std::function<Result<bool>(const pgoutput::Tuple&)>;

// A publication row filter (WHERE) of one table, for one action; implemented above this layer.
class RowFilter {
 public:
  virtual ~RowFilter() = default;
  // Prepares evaluation over tuples laid out as `relation` says (columns by name, typed by
  // type OID). An error (a column the filter names is gone) ends the stream when a change
  // needs the filter.
  virtual Result<TupleFilter> bind(const pgoutput::Relation& relation) const = 0;
  // Identifies the filter in view keys (its expression text).
  virtual std::string key() const = 0;
};

enum RowFilterAction { kFilterInsert = 0, kFilterUpdate = 1, kFilterDelete = 2 };

// The partitioned table whose changes a partition's are sent as (publish_via_partition_root),
// as the catalog described it when the view was made.
struct PublishedAs {
  // The ancestor's OID, names, replica identity and columns with their key flags.
  pgoutput::Relation relation;
  // Its leaf partitions then. The log holds a TRUNCATE of the ancestor as one of all its leaves
  // (capture receives partitions' changes), so a Truncate naming every one of them is sent as
  // the ancestor's, and one naming fewer is not sent for them, as pgoutput sends neither a
  // partition of it nor the ancestor then.
  std::size_t leaves = 0;
  // The ancestor's own publications publish TRUNCATE.
  bool truncate = false;
};

// What the requested publications say about one table, as pgoutput's RelationSyncEntry has it.
struct TableRule {
  OperationSet operations = 0;  // union of the publish actions of the publications publishing it
  // The column list by column name; nullopt: every column. Projects Relation (and the Types
  // before it) and every tuple (new, old 'O', key 'K'), as logicalrep_write_attrs and
  // logicalrep_write_tuple do.
  std::optional<std::vector<std::string>> columns;
  // Per action (RowFilterAction): the OR of the filters of the publications publishing that
  // action; null when there is none (or one such publication has no filter).
  std::shared_ptr<const RowFilter> filters[3];
  // Raised at the table's first data change instead of sending anything (Postgres raises
  // "cannot use different column lists..." there, not at START_REPLICATION).
  std::optional<Error> error;
  // Set for a partition published via an ancestor: its changes go out as the ancestor's, as
  // pgoutput_change sends them. The ancestor's Relation, then the partition's own, before its
  // first change; tuples mapped to the ancestor's columns by name, the old one flagged by the
  // ancestor's replica identity. `columns` and `filters` are then the ancestor's, over its
  // columns; `operations` are those of every publication publishing the partition.
  std::shared_ptr<const PublishedAs> publish_as;
};

// The tables a set of PG15 publications publishes, with per-table rules.
struct PublicationTables {
  OperationSet all_tables = 0;  // actions of FOR ALL TABLES publications
  // Actions of FOR TABLES IN SCHEMA publications, by schema name ("pg_catalog" for "").
  std::map<std::string, OperationSet> schemas;
  // Tables published when the view was made, by relation OID, with their complete rules, and
  // their OIDs by (schema, name): a Relation is matched by name first, as TableFilter matches
  // (a log's OIDs need not be the upstream's), then by OID (see rule_for). A walsender makes a
  // new view where capture marked a change of the publications, renames included.
  std::map<pgoutput::Oid, TableRule> tables;
  std::map<std::pair<std::string, std::string>, pgoutput::Oid> names;

  // The rule for `relation`: its entry by name, else by OID (a name the table had before a
  // rename), else (a table created later) the actions of the FOR ALL TABLES and IN SCHEMA
  // publications; nullopt when nothing publishes it.
  std::optional<TableRule> rule_for(const pgoutput::Relation& relation) const;
  // A canonical text of everything above, for view keys: equal keys, equal output.
  std::string key() const;
};

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
  // PG15 publications: when set, decides per table what is sent (in addition to `tables` and
  // `operations`, which still apply; kOpMessage still comes from `operations`).
  std::optional<PublicationTables> publications;
  // Set: every Insert, Update, Delete and Truncate is refused with this error, whatever its
  // table (logical messages still pass). A requested publication missing from the catalog in
  // force, as PostgreSQL 15's pgoutput fails at the next change it decodes then, and goes on
  // if the publication is made again before one comes.
  std::optional<Error> refused;
};

// What capture's publications-changed marker says (capture/publication_marker.h).
struct PublicationsChange {
  // The upstream transaction (full xid) that changed them: a walsender that reads them from
  // the upstream reads them once it is visible there. None in markers older than the xid.
  std::optional<std::uint64_t> xid;
  // The catalog the views are made from (pgoutput/publication_catalog.h) before and after the
  // change; null when the marker does not carry it (older markers; before PostgreSQL 15; an
  // installation that did not know the catalog before).
  std::shared_ptr<const std::string> before, after;
};
// The marker's content: the xid in decimal, optionally followed by a newline, the catalog
// before, a newline and the catalog after (either may be empty; JSON text, on one line).
// Anything else names nothing.
PublicationsChange parse_publications_change(std::string_view content);

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
  // an XX001 error: stored data is self-describing. With an error, `out` may hold what goes
  // before it (a Truncate refused at one of its tables: the Relations of those before it, as
  // pgoutput_truncate sends their schema before it fails).
  Status push(Change change, std::vector<Change>& out);
  bool finish();
  // Whether the entry started last carried a publications-changed marker (so far).
  bool publications_changed() const { return publications_changed_; }
  // What the last marker of the entry says (nothing when it had none).
  const PublicationsChange& publications_change() const { return change_; }
  // With `pause` set, ViewReader stops right after each marker (paused()) and resumes when
  // called again, so that the rest of the entry can go through replace_options()' view.
  void pause_at_publication_changes(bool pause) { pause_at_markers_ = pause; }
  // True once after each marker pushed while pausing is on.
  bool take_pause() { return std::exchange(pause_pending_, false); }
  // Goes on with other options from the next change, within the current entry: every table
  // the entry described is judged again and its Relation sent again before its next change
  // (pgoutput rebuilds its whole relation cache and resends schemas after an invalidation).
  void replace_options(ViewOptions options);

  const ViewOptions& options() const { return options_; }

 private:
  struct RelationState {
    pgoutput::Relation relation;  // as stored; the column list applies when it is sent
    Lsn lsn;
    std::vector<Change> types;  // Type records stored just before the Relation
    bool allowed = false;
    bool sent = false;
    std::vector<bool> key;  // for delta updates
    // Publications (options_.publications set): the table's actions, the columns kept (empty:
    // all), row filters bound to this layout (empty function: none), a deferred error.
    OperationSet table_operations = kAllOperations;
    std::vector<bool> keep;  // over `target` when publish_as is set
    // Published via an ancestor: the ancestor's Relation for this layout (its columns that the
    // partition has, in its order; then any the view did not know of), and per column of it,
    // where in the partition's tuples its value is; leaf_keep projects the partition's own.
    std::shared_ptr<const PublishedAs> publish_as;
    pgoutput::Relation target;
    std::vector<Change> target_types;
    std::vector<std::size_t> source;
    std::vector<bool> leaf_keep;
    std::optional<TupleFilter> filters[3];
    std::optional<Error> filter_errors[3];
    std::optional<Error> error;
  };
  Result<RelationState*> state_for(pgoutput::Oid oid, Lsn lsn);
  void send_relation(RelationState& state, std::vector<Change>& out);
  // The ancestor's Relation, with its Types, as a Truncate of it needs (once per entry).
  void send_target(const RelationState& state, std::vector<Change>& out);
  // For a partition published via an ancestor: the ancestor's Relation for its layout.
  void describe_target(RelationState& state);
  // The change as the ancestor's: tuples in its column order, its OID, its identity's flag.
  void map_to_target(const RelationState& state, ChangeMessage& message) const;
  // What to send of a Truncate when the view publishes partitions via ancestors.
  Status push_truncate(Change change, std::vector<Change>& out);
  // Judges state.relation by the options: allowed, actions, filters, column list, key.
  void describe_relation(RelationState& state);
  // Applies the row filter of the change's action; false: send nothing. May turn an Update
  // into an Insert or a Delete, as pgoutput_row_filter does.
  Result<bool> apply_row_filter(RelationState& state, ChangeMessage& message);
  void project(const RelationState& state, ChangeMessage& message) const;

  ViewOptions options_;
  EntryMeta meta_;
  std::unordered_map<pgoutput::Oid, RelationState> relations_;
  std::vector<Change> pending_types_;
  // Every Type of the transaction so far, by type OID. The log stores a Type once per
  // transaction, before the first Relation that needs it; a later Relation with a column of
  // that type takes it from here, so that it is sent with that Relation even when the first
  // one is not (its table unpublished), as send_relation_and_attrs sends a Relation's Types.
  std::unordered_map<pgoutput::Oid, Change> transaction_types_;
  std::set<pgoutput::Oid> targets_sent_;  // ancestors whose Relation a Truncate sent
  bool sent_any_ = false;
  bool publications_changed_ = false;
  PublicationsChange change_;
  bool pause_at_markers_ = false;
  bool pause_pending_ = false;
};

// Reads one entry from a Cursor through a view: the changes to send, one at a time.
class ViewReader {
 public:
  ViewReader(ChangeView& view, Cursor& cursor, const EntryMeta& meta);

  // The next change to send, or nullopt at the end of the entry; an error the view raised at
  // a change comes after whatever the view sent before raising it.
  Result<std::optional<Change>> next();
  // After next() returned nullopt: whether the entry is sent (ChangeView::finish()).
  bool send_entry() const { return send_entry_; }
  // After next() returned nullopt: the view paused at a publications-changed marker, and the
  // entry goes on at the next call.
  bool paused() const { return paused_; }

 private:
  ChangeView& view_;
  EntryReader reader_;
  std::vector<Change> queue_;
  std::size_t queue_pos_ = 0;
  bool done_ = false;
  bool send_entry_ = false;
  bool paused_ = false;
  std::optional<Error> refused_;
};

// The first publications-changed marker in the entries of `log` from `start` on (a cursor's
// start rule), as far as the log holds them now; nullopt when there is none. Reads only the
// entries the log lists as marked (and the data of any appended before it kept that list):
// blocking I/O, for a stream that starts behind the log's end and needs the publications as
// they stood where it starts (the marker's catalog before).
Result<std::optional<PublicationsChange>> first_publications_change(ChangeLog& log, Lsn start);

// The last such marker from `start` on, as far as the log holds them now: the publications as
// they stand at its end (a follower's, whose primary read them at `start`). Reads the marked
// entries from the newest back; entries appended before the log kept that list are read
// through from `start`.
Result<std::optional<PublicationsChange>> last_publications_change(ChangeLog& log, Lsn start);

// The view of a whole in-memory transaction; nullopt when the view skips it.
Result<std::optional<Transaction>> apply_view(const ViewOptions& options, const Transaction& txn);

}  // namespace pgrelay::log
