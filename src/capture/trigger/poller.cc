// Trigger capture's poller: moves committed transactions from the change table into the log.
#include "capture/trigger/poller.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "capture/trigger/installer.h"
#include "capture/trigger/record_text.h"
#include "capture/trigger/relation_info.h"
#include "capture/trigger/truncate_statement.h"

namespace pgrelay::capture {
namespace {

constexpr std::string_view kCheckpointMagic = "pgrelay-trigger-checkpoint 1\n";

Error bad(std::string msg) {
  return Error::make(sqlstate::kInternalError, std::move(msg));
}

template <typename T>
std::optional<T> parse_int(std::string_view s) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// One row of the change table.
struct ChangeRow {
  std::uint64_t xid = 0;
  std::int64_t seq = 0;
  std::uint32_t rel = 0;
  char op = 0;
  std::int32_t layout = 0;
  char old_kind = 0;  // 0 when the row has no old values
  std::optional<std::string> old_row;
  std::optional<std::string> new_row;
  std::vector<std::size_t> unchanged;  // 1-based field positions
  std::optional<std::string> info;
  std::string content;
  std::optional<std::int64_t> commit_time;
};

}  // namespace

// A table's columns as one layout version recorded them.
struct Layout {
  pgoutput::Relation relation;  // generated columns left out, as pgoutput does
  std::vector<bool> generated;  // per field of the row text
  std::vector<bool> key;        // per field
  std::size_t fields() const { return generated.size(); }
};

using Layouts = std::map<std::pair<std::uint32_t, std::int32_t>, Layout>;

// Layouts by (relid, version), all versions of a table as one load found them. A recorded
// version never changes and is never reused (they come from a sequence), so an entry stays
// right; a version missing from it means the table was altered since, and reloads the table.
struct TriggerPoller::LayoutCache {
  Layouts layouts;
};

namespace {

// All recorded versions of the tables `rels`.
Result<Layouts> load_layouts(PgSession& s, const std::string& table,
                             const std::vector<std::uint32_t>& rels) {
  Layouts out;
  if (rels.empty()) return out;
  std::string array = "{";
  for (std::size_t i = 0; i < rels.size(); ++i) {
    array += (i > 0 ? "," : "") + std::to_string(rels[i]);
  }
  array += "}";
  auto r = s.exec(
      "SELECT l.relid::pg_catalog.int8::text, l.version::text, l.nspname, l.relname, "
      "l.replident::text, u.name, u.type::pg_catalog.int8::text, u.typmod::text, u.key::text, "
      "u.gen::text FROM " +
          table +
          " l LEFT JOIN LATERAL ROWS FROM (pg_catalog.unnest(l.names), pg_catalog.unnest(l.types), "
          "pg_catalog.unnest(l.typmods), pg_catalog.unnest(l.keys), "
          "pg_catalog.unnest(l.generated)) WITH ORDINALITY AS u(name, type, typmod, key, gen, ord) "
          "ON true "
          "WHERE l.relid = ANY ($1::pg_catalog.oid[]) ORDER BY l.relid, l.version, u.ord",
      {array});
  if (!r.ok()) return r.error();
  for (int i = 0; i < r->rows(); ++i) {
    auto rel = parse_int<std::uint32_t>(r->value(i, 0));
    auto version = parse_int<std::int32_t>(r->value(i, 1));
    if (!rel || !version) return bad("malformed row in the layouts table");
    Layout& l = out[{*rel, *version}];
    if (l.relation.oid == 0) {
      l.relation.oid = *rel;
      l.relation.namespace_name =
          r->value(i, 2) == "pg_catalog" ? std::string() : std::string(r->value(i, 2));
      l.relation.name = std::string(r->value(i, 3));
      const std::string_view ident = r->value(i, 4);
      l.relation.replica_identity = ident.empty() ? pgoutput::kReplicaIdentityDefault : ident[0];
    }
    if (r->is_null(i, 5)) continue;  // no columns
    auto type = parse_int<std::uint32_t>(r->value(i, 6));
    auto typmod = parse_int<std::int32_t>(r->value(i, 7));
    if (!type || !typmod) return bad("malformed column in the layouts table");
    const bool key = r->value(i, 8) == "true";
    const bool gen = r->value(i, 9) == "true";
    l.generated.push_back(gen);
    l.key.push_back(key);
    if (gen) continue;
    pgoutput::Column col;
    col.name = std::string(r->value(i, 5));
    col.type_oid = *type;
    col.type_modifier = *typmod;
    col.flags = key ? pgoutput::kColumnIsKey : 0;
    l.relation.columns.push_back(std::move(col));
  }
  return out;
}

// The layout a row fits: its stamped version, or (when DDL ran before the version was recorded)
// the first later version with as many fields as the row has.
const Layout* fitting_layout(const Layouts& layouts, const ChangeRow& row, std::size_t fields,
                             std::int32_t* version) {
  auto it = layouts.find({row.rel, row.layout});
  if (it != layouts.end() && it->second.fields() == fields) {
    *version = row.layout;
    return &it->second;
  }
  for (auto jt = layouts.upper_bound({row.rel, row.layout});
       jt != layouts.end() && jt->first.first == row.rel; ++jt) {
    if (jt->second.fields() == fields) {
      *version = jt->first.second;
      return &jt->second;
    }
  }
  return nullptr;
}

pgoutput::Tuple to_tuple(const Fields& fields, const Layout& layout,
                         const std::vector<std::size_t>& unchanged, bool keys_only) {
  pgoutput::Tuple t;
  t.columns.reserve(layout.relation.columns.size());
  std::size_t u = 0;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (layout.generated[i]) continue;
    while (u < unchanged.size() && unchanged[u] < i + 1) ++u;
    if (u < unchanged.size() && unchanged[u] == i + 1) {
      t.columns.push_back(pgoutput::TupleValue::unchanged());
    } else if (keys_only && !layout.key[i]) {
      t.columns.push_back(pgoutput::TupleValue::null());
    } else {
      t.columns.push_back(fields[i] ? pgoutput::TupleValue::text(*fields[i])
                                    : pgoutput::TupleValue::null());
    }
  }
  return t;
}

std::vector<std::size_t> parse_positions(std::string_view text) {
  std::vector<std::size_t> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    if (auto v = parse_int<std::size_t>(text.substr(0, comma))) out.push_back(*v);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A decoded data change and the layout its table's Relation must have before it.
struct Decoded {
  log::ChangeMessage message;
  std::vector<std::pair<std::uint32_t, std::int32_t>> layouts;
  std::string truncate_statement;  // for merging the tables of one TRUNCATE
  std::string truncate_query;
};

enum class Outcome { kMessage, kSkip, kMismatch };

// The pgoutput message for a row; kSkip when pgoutput would send nothing or the layout is gone,
// kMismatch when the row fits no recorded layout.
Result<Outcome> decode_row(const ChangeRow& row, const Layouts& layouts, Decoded* out) {
  switch (row.op) {
    case 'M':
      out->message = pgoutput::LogicalMessage{std::nullopt, true, Lsn(),
                                              row.info.value_or(std::string()), row.content};
      return Outcome::kMessage;
    case 'T': {
      auto it = layouts.find({row.rel, row.layout});
      if (it == layouts.end()) return Outcome::kSkip;
      out->message = pgoutput::Truncate{std::nullopt, false, false, {row.rel}};
      out->layouts.push_back({row.rel, row.layout});
      const std::string info = row.info.value_or(std::string());
      const auto colon = info.find(':');
      out->truncate_statement = info.substr(0, colon);
      out->truncate_query = colon == std::string::npos ? std::string() : info.substr(colon + 1);
      return Outcome::kMessage;
    }
    case 'I':
    case 'U':
    case 'D':
      break;
    default:
      return bad(std::string("malformed change row (op '") + row.op + "')");
  }
  const std::optional<std::string>& main = row.op == 'D' ? row.old_row : row.new_row;
  if (!main) return Outcome::kSkip;
  if (layouts.lower_bound({row.rel, 0}) == layouts.end() ||
      layouts.lower_bound({row.rel, 0})->first.first != row.rel) {
    return Outcome::kSkip;  // a table dropped and forgotten since
  }
  auto stamped = layouts.find({row.rel, row.layout});
  const std::size_t expected = stamped != layouts.end() ? stamped->second.fields() : 0;
  auto fields = parse_record_text(*main, expected);
  if (!fields.ok()) return fields.error();
  std::int32_t version = 0;
  const Layout* layout = fitting_layout(layouts, row, fields->size(), &version);
  if (layout == nullptr) return Outcome::kMismatch;
  std::optional<Fields> old;
  if (row.op == 'U' && row.old_row) {
    auto o = parse_record_text(*row.old_row, layout->fields());
    if (!o.ok()) return o.error();
    if (o->size() != layout->fields()) return Outcome::kMismatch;
    old = std::move(*o);
  }
  out->layouts.push_back({row.rel, version});
  static const std::vector<std::size_t> kNone;
  switch (row.op) {
    case 'I':
      out->message =
          pgoutput::Insert{std::nullopt, row.rel, to_tuple(*fields, *layout, kNone, false)};
      return Outcome::kMessage;
    case 'U': {
      pgoutput::Update u{std::nullopt, row.rel, std::nullopt,
                         to_tuple(*fields, *layout, row.unchanged, false)};
      if (old && row.old_kind == 'O') {
        u.old = pgoutput::OldTuple{pgoutput::OldKind::kFull, to_tuple(*old, *layout, kNone, false)};
      } else if (old && row.old_kind == 'K') {
        // pgoutput sends the old key only when the key changed; the printed values tell.
        bool changed = false;
        for (std::size_t i = 0; i < layout->fields(); ++i) {
          if (layout->key[i] && !layout->generated[i] && (*old)[i] != (*fields)[i]) changed = true;
        }
        if (changed) {
          u.old = pgoutput::OldTuple{pgoutput::OldKind::kKey, to_tuple(*old, *layout, kNone, true)};
        }
      }
      out->message = std::move(u);
      return Outcome::kMessage;
    }
    default: {
      const bool full = row.old_kind == 'O';
      out->message = pgoutput::Delete{
          std::nullopt, row.rel,
          pgoutput::OldTuple{full ? pgoutput::OldKind::kFull : pgoutput::OldKind::kKey,
                             to_tuple(*fields, *layout, kNone, !full)}};
      return Outcome::kMessage;
    }
  }
}

// What one log entry is made of: a transaction's rows, or one non-transactional message.
struct Unit {
  bool message = false;
  std::vector<ChangeRow> rows;
};

}  // namespace

Bytes encode_checkpoint(const CheckpointState& state) {
  std::string s(kCheckpointMagic);
  s += state.snapshot + "\n" + state.upstream_lsn.to_string() + "\n";
  return Bytes(s.begin(), s.end());
}

Result<CheckpointState> decode_checkpoint(ByteView data) {
  std::string_view s(reinterpret_cast<const char*>(data.data()), data.size());
  const Error corrupt = Error::make(sqlstate::kDataCorrupted,
                                    "the log's capture checkpoint is not a trigger checkpoint");
  if (s.substr(0, kCheckpointMagic.size()) != kCheckpointMagic) return corrupt;
  s.remove_prefix(kCheckpointMagic.size());
  const auto nl = s.find('\n');
  if (nl == std::string_view::npos || nl == 0) return corrupt;
  CheckpointState state;
  state.snapshot = std::string(s.substr(0, nl));
  s.remove_prefix(nl + 1);
  if (s.empty() || s.back() != '\n') return corrupt;
  auto lsn = Lsn::parse(s.substr(0, s.size() - 1));
  if (!lsn) return corrupt;
  state.upstream_lsn = *lsn;
  return state;
}

Result<std::unique_ptr<TriggerPoller>> TriggerPoller::open(PollerOptions options,
                                                           log::ChangeLog& log) {
  auto session = PgSession::connect(options.conninfo);
  if (!session.ok()) return session.error();
  std::unique_ptr<TriggerPoller> p(new TriggerPoller(std::move(options), log, std::move(*session)));
  auto schema = p->session_->ident(p->options_.schema);
  if (!schema.ok()) return schema.error();
  p->changes_table_ = *schema + ".changes";
  p->layouts_table_ = *schema + ".layouts";
  auto installed = p->session_->exec(
      "SELECT pg_catalog.to_regclass($1) IS NOT NULL, "
      "pg_catalog.current_setting('track_commit_timestamp')::bool",
      {p->changes_table_});
  if (!installed.ok()) return installed.error();
  if (installed->value(0, 0) != "t") {
    return Error::make(sqlstate::kUndefinedObject,
                       "trigger capture is not installed in schema \"" + p->options_.schema + "\"");
  }
  p->commit_timestamps_ = installed->value(0, 1) == "t";
  // A poll is one statement outside a transaction block; under a serializable default it could
  // fail on a conflict with writers, which gains nothing for a single snapshot read.
  PGRELAY_TRY(p->session_->run("SET default_transaction_isolation TO 'read committed'"));
  // Released rows stay in the change table as dead tuples until vacuumed (autovacuum wakes
  // once a minute: some 60,000 of them at 1000 commits/s), and the planner, counting them as
  // live, would scan them all on every poll. The xid index bounds a poll's read to the recent
  // transactions: measured 0.3 ms instead of 0.9-2.4 ms at 1000 commits/s.
  PGRELAY_TRY(p->session_->run("SET enable_seqscan TO off"));
  if (auto cp = log.last_checkpoint()) {
    auto state = decode_checkpoint(*cp);
    if (!state.ok()) return state.error();
    p->prev_snapshot_ = state->snapshot;
    p->persisted_snapshot_ = state->snapshot;
    // Rows appended before a crash may still be upstream.
    p->release_pending_ = true;
  }
  return p;
}

TriggerPoller::TriggerPoller(PollerOptions options, log::ChangeLog& log,
                             std::unique_ptr<PgSession> session)
    : options_(std::move(options)),
      log_(log),
      session_(std::move(session)),
      layout_cache_(std::make_unique<LayoutCache>()) {}

TriggerPoller::~TriggerPoller() = default;

Result<PollStats> TriggerPoller::poll() {
  auto stats = capture();
  if (!stats.ok()) return stats;
  PGRELAY_TRY(release());
  return stats;
}

Result<PollStats> TriggerPoller::capture() {
  return capture_with_sync(std::string());
}

Result<PollStats> TriggerPoller::capture_in_snapshot(const std::string& snapshot_name) {
  return capture_with_sync(snapshot_name);
}

Result<PollStats> TriggerPoller::capture_with_sync(const std::string& snapshot_name) {
  bool mismatch = false;
  auto stats = capture_once(snapshot_name, &mismatch);
  if (!stats.ok() || !mismatch) return stats;
  // DDL ran without an event trigger and its layout is not recorded yet: record it and retry.
  auto synced = sync_tables(*session_, options_.schema);
  if (!synced.ok()) return synced.error();
  layout_cache_->layouts.clear();
  // Rows that still fit nothing were written with a layout that existed only between two
  // syncs; their column names and types are gone from the catalog.
  stats = capture_once(snapshot_name, &mismatch, /*skip_unfit=*/true);
  if (!stats.ok()) return stats;
  stats->synced_layouts = true;
  return stats;
}

std::string TriggerPoller::released_rows(Params& params) const {
  params.push_back(persisted_snapshot_);
  std::string where = "pg_catalog.pg_visible_in_snapshot(xid, $" + std::to_string(params.size()) +
                      "::pg_catalog.pg_snapshot)";
  // Deleted rows stay in the xid index until vacuumed, and at 1000 commits/s that is tens of
  // thousands of them: without a lower bound every release would scan them all.
  if (!released_floor_.empty()) {
    params.push_back(released_floor_);
    where += " AND xid >= pg_catalog.pg_snapshot_xmin($" + std::to_string(params.size()) +
             "::pg_catalog.pg_snapshot)";
  }
  return where;
}

void TriggerPoller::released() {
  release_pending_ = false;
  // Every row of a transaction visible in it is gone; those left are of later transactions,
  // none below its xmin (such a transaction is visible in it or aborted).
  released_floor_ = persisted_snapshot_;
}

Result<QueryResult> TriggerPoller::read_changes(bool releasing) {
  // The head (S_k, the WAL insert position read after it was taken, the poll's time) comes
  // first, materialized, so every row is read in S_k and the position is at or past every
  // commit visible in it. It is repeated on each row, or alone on a row of NULLs when there
  // are no changes.
  Params params;
  std::string sql = "WITH ";
  if (releasing) {
    // Rows of transactions visible in the persisted snapshot are in the log. The scan below
    // runs in the same snapshot, so it still sees them, and leaves them out as old.
    sql += "released AS (DELETE FROM " + changes_table_ + " WHERE " + released_rows(params) + "), ";
  }
  const std::string commit_ts =
      commit_timestamps_
          ? "((extract(epoch FROM pg_catalog.pg_xact_commit_timestamp(pg_catalog.xid(c.xid)))"
            " - 946684800) * 1000000)::int8::text"
          : "NULL::text";
  sql +=
      "head AS MATERIALIZED (SELECT pg_catalog.pg_current_snapshot() AS snap, "
      "pg_catalog.pg_current_wal_insert_lsn() AS wal, "
      "((extract(epoch FROM pg_catalog.now()) - 946684800) * 1000000)::int8 AS t) "
      "SELECT h.snap::text, h.wal::text, h.t::text, c.xid::text, c.seq::text, "
      "c.rel::pg_catalog.int8::text, c.op::text, c.layout::text, c.old_kind::text, c.old_row, "
      "c.new_row, pg_catalog.array_to_string(c.unchanged, ','), c.info, c.content, c.commit_ts "
      "FROM head h LEFT JOIN LATERAL (SELECT c.*, " +
      commit_ts +
      " AS commit_ts, "
      // A transaction sorts by its last sequence value; a non-transactional message by its
      // own, and before its own transaction, whose commit came after it.
      "CASE WHEN c.op = 'm' THEN least(c.seq, max(c.seq) FILTER (WHERE c.op <> 'm') "
      "OVER (PARTITION BY c.xid)) ELSE max(c.seq) FILTER (WHERE c.op <> 'm') "
      "OVER (PARTITION BY c.xid) END AS unit_order FROM " +
      changes_table_ + " c WHERE pg_catalog.pg_visible_in_snapshot(c.xid, h.snap)";
  if (!prev_snapshot_.empty()) {
    params.push_back(prev_snapshot_);
    const std::string prev = "$" + std::to_string(params.size()) + "::pg_catalog.pg_snapshot";
    sql += " AND c.xid >= pg_catalog.pg_snapshot_xmin(" + prev +
           ") AND NOT pg_catalog.pg_visible_in_snapshot(c.xid, " + prev + ")";
  }
  sql += ") c ON true ORDER BY c.unit_order, c.op <> 'm', c.seq";
  // Each shape (releasing, bounded below, after a previous snapshot) is planned once.
  const std::string name = std::string("pgrelay_poll_") + (releasing ? "r" : "") +
                           (released_floor_.empty() || !releasing ? "" : "f") +
                           (prev_snapshot_.empty() ? "" : "p");
  return session_->exec_prepared(name, sql, params, /*binary_result=*/true);
}

Result<PollStats> TriggerPoller::capture_once(const std::string& snapshot_name,
                                              bool* layout_mismatch, bool skip_unfit) {
  *layout_mismatch = false;
  PgSession& s = *session_;
  PollStats stats;
  struct Rollback {
    PgSession& s;
    bool active = true;
    ~Rollback() {
      if (active) (void)s.run("ROLLBACK");
    }
  } rollback{s};
  // With a snapshot to import the read runs in a transaction that imports it. Otherwise it is
  // one statement on its own, whose snapshot is S_k: no BEGIN or COMMIT round trips, as polls
  // set capture's latency.
  const bool in_transaction = !snapshot_name.empty();
  rollback.active = in_transaction;
  if (in_transaction) {
    auto name = s.literal(snapshot_name);
    if (!name.ok()) return name.error();
    PGRELAY_TRY(s.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"));
    PGRELAY_TRY(s.run("SET TRANSACTION SNAPSHOT " + *name));
  }
  const bool releasing = release_pending_ && !in_transaction;
  auto rows = read_changes(releasing);
  if (!rows.ok()) return rows.error();
  if (releasing) released();
  // Columns 0-2 repeat the head on every row; one row of NULL changes when there are none.
  stats.snapshot = std::string(rows->value(0, 0));
  auto wal = Lsn::parse(rows->value(0, 1));
  auto poll_time = parse_int<std::int64_t>(rows->value(0, 2));
  if (!wal || !poll_time) return bad("unexpected snapshot or WAL position from upstream");
  stats.upstream_lsn = *wal;
  const int row_count = rows->is_null(0, 3) ? 0 : rows->rows();

  std::vector<Unit> units;
  std::vector<std::uint32_t> rels;
  for (int i = 0; i < row_count; ++i) {
    ChangeRow row;
    auto xid = parse_int<std::uint64_t>(rows->value(i, 3));
    auto seq = parse_int<std::int64_t>(rows->value(i, 4));
    auto rel = parse_int<std::uint32_t>(rows->value(i, 5));
    std::string_view op = rows->value(i, 6);
    if (!xid || !seq || !rel || op.size() != 1) return bad("malformed row in the change table");
    row.xid = *xid;
    row.seq = *seq;
    row.rel = *rel;
    row.op = op[0];
    if (!rows->is_null(i, 7)) {
      auto layout = parse_int<std::int32_t>(rows->value(i, 7));
      if (!layout) return bad("malformed layout in the change table");
      row.layout = *layout;
    }
    if (!rows->is_null(i, 8) && !rows->value(i, 8).empty()) row.old_kind = rows->value(i, 8)[0];
    row.old_row = rows->get(i, 9);
    row.new_row = rows->get(i, 10);
    if (!rows->is_null(i, 11)) row.unchanged = parse_positions(rows->value(i, 11));
    row.info = rows->get(i, 12);
    if (!rows->is_null(i, 13)) row.content = std::string(rows->value(i, 13));
    if (!rows->is_null(i, 14)) row.commit_time = parse_int<std::int64_t>(rows->value(i, 14));
    if (row.rel != 0 && !layout_cache_->layouts.contains({row.rel, row.layout})) {
      rels.push_back(row.rel);
    }
    if (row.op == 'm') {
      units.push_back(Unit{true, {}});
    } else if (units.empty() || units.back().message || units.back().rows.front().xid != row.xid) {
      units.push_back(Unit{false, {}});
    }
    units.back().rows.push_back(std::move(row));
  }
  stats.rows = static_cast<std::size_t>(row_count);
  // Tables whose stamped version is not cached were altered (or are new): reload all their
  // versions, since a row may fit a later one.
  std::sort(rels.begin(), rels.end());
  rels.erase(std::unique(rels.begin(), rels.end()), rels.end());
  Layouts& cached = layout_cache_->layouts;
  if (!rels.empty()) {
    auto loaded = load_layouts(s, layouts_table_, rels);
    if (!loaded.ok()) return loaded.error();
    for (std::uint32_t rel : rels) {
      cached.erase(cached.lower_bound({rel, std::numeric_limits<std::int32_t>::min()}),
                   cached.upper_bound({rel, std::numeric_limits<std::int32_t>::max()}));
    }
    cached.merge(*loaded);
  }
  const Layouts* layouts = &cached;

  // Puts the Relation (and its Types) of a layout version into the catalog when another one is
  // there: the builder then sends it before the table's next change.
  std::map<pgoutput::Oid, bool> types_loaded;
  auto use_layout = [&](std::uint32_t rel, std::int32_t version) -> Status {
    auto it = catalog_layouts_.find(rel);
    if (it != catalog_layouts_.end() && it->second == version) return {};
    const Layout& layout = layouts->at({rel, version});
    auto types = load_types(s, layout.relation);
    if (!types.ok()) return types.error();
    for (auto& type : *types) {
      if (!types_loaded[type.oid]) catalog_.put(std::move(type));
      types_loaded[type.oid] = true;
    }
    catalog_.put(layout.relation);
    catalog_layouts_[rel] = version;
    return {};
  };

  // LSNs are offsets from the base the log picks: begin, one per change, commit, end. The base
  // is predictable (the poller is the log's only appender), which gives messages their LSN.
  const Lsn predicted = std::max(stats.upstream_lsn, log_.last_end_lsn() + 1);
  std::vector<log::BuiltEntry> built;
  std::uint64_t offset = 0;
  log::TransactionBuilder builder(catalog_, log::BuilderOptions{options_.spill_dir});
  for (const auto& unit : units) {
    const ChangeRow& last = unit.rows.back();
    log::TransactionHeader h;
    h.commit_time = last.commit_time.value_or(*poll_time);
    h.xid = static_cast<std::uint32_t>(last.xid & 0xFFFFFFFFu);
    if (unit.message) {
      h.begin_lsn = h.commit_lsn = Lsn(offset);
      h.end_lsn = Lsn(offset + 1);
      pgoutput::LogicalMessage m{std::nullopt, false, predicted + offset,
                                 last.info.value_or(std::string()), last.content};
      auto entry = log::build_message_entry(h, Lsn(offset), std::move(m));
      if (!entry.ok()) return entry.error();
      built.push_back(std::move(*entry));
      offset = h.end_lsn.value();
      ++stats.messages;
      continue;
    }
    std::vector<Decoded> changes;
    for (const auto& row : unit.rows) {
      Decoded d;
      auto outcome = decode_row(row, *layouts, &d);
      if (!outcome.ok()) return outcome.error();
      if (*outcome == Outcome::kMismatch) {
        if (skip_unfit) {
          ++stats.undecodable_rows;
          continue;
        }
        *layout_mismatch = true;
        return stats;
      }
      if (*outcome == Outcome::kSkip) {
        ++stats.skipped_rows;
        continue;
      }
      // Triggers see one TRUNCATE per table; pgoutput sends one message for the tables a
      // statement truncated (cascaded ones included), which fire one after the other.
      auto* trunc = std::get_if<pgoutput::Truncate>(&d.message);
      auto* prev =
          changes.empty() ? nullptr : std::get_if<pgoutput::Truncate>(&changes.back().message);
      if (trunc != nullptr && prev != nullptr &&
          changes.back().truncate_statement == d.truncate_statement) {
        prev->relation_oids.push_back(row.rel);
        changes.back().layouts.push_back(d.layouts.front());
        continue;
      }
      changes.push_back(std::move(d));
    }
    if (changes.empty()) continue;
    h.begin_lsn = Lsn(offset);
    h.commit_lsn = Lsn(offset + changes.size());
    h.end_lsn = Lsn(offset + changes.size() + 1);
    PGRELAY_TRY(builder.begin(h));
    for (std::size_t j = 0; j < changes.size(); ++j) {
      Decoded& d = changes[j];
      for (const auto& [rel, version] : d.layouts) PGRELAY_TRY(use_layout(rel, version));
      if (auto* trunc = std::get_if<pgoutput::Truncate>(&d.message)) {
        std::vector<std::string> names;
        for (const auto& [rel, version] : d.layouts) {
          names.push_back(layouts->at({rel, version}).relation.name);
        }
        const TruncateOptions options = truncate_options(d.truncate_query, names);
        trunc->cascade = options.cascade;
        trunc->restart_identity = options.restart_identity;
      } else if (auto* msg = std::get_if<pgoutput::LogicalMessage>(&d.message)) {
        msg->lsn = predicted + (offset + j);
      }
      PGRELAY_TRY(builder.add(Lsn(offset + j), std::move(d.message)));
    }
    auto entry = builder.finish();
    if (!entry.ok()) return entry.error();
    built.push_back(std::move(*entry));
    offset = h.end_lsn.value();
  }
  stats.transactions = built.size() - stats.messages;
  if (in_transaction) {
    rollback.active = false;
    PGRELAY_TRY(s.run("COMMIT"));
  }

  if (built.empty()) {
    // Nothing to persist: the transactions new in S_k wrote no rows, so resuming from the older
    // checkpoint would find nothing more either.
    prev_snapshot_ = stats.snapshot;
    return stats;
  }
  const Bytes checkpoint = encode_checkpoint({stats.snapshot, stats.upstream_lsn});
  std::vector<log::PendingEntry> batch;
  batch.reserve(built.size() + 1);
  for (const auto& e : built) batch.push_back(e.pending());
  log::EntryMeta cp_meta;
  cp_meta.kind = log::EntryKind::kCheckpoint;
  cp_meta.begin_lsn = cp_meta.commit_lsn = cp_meta.end_lsn = Lsn(offset);
  cp_meta.commit_time = *poll_time;
  batch.push_back(log::PendingEntry{cp_meta, checkpoint, nullptr});
  auto base = log_.append_assigning(batch, predicted);
  if (!base.ok()) return base.error();
  stats.base = *base;
  stats.last_lsn = *base + built.back().meta.commit_lsn.value();
  prev_snapshot_ = stats.snapshot;
  persisted_snapshot_ = stats.snapshot;
  release_pending_ = true;
  return stats;
}

Status TriggerPoller::release() {
  if (!release_pending_) return {};
  Params params;
  PGRELAY_TRY(
      session_->run("DELETE FROM " + changes_table_ + " WHERE " + released_rows(params), params));
  released();
  return {};
}

}  // namespace pgrelay::capture
