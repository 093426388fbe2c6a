// Trigger capture's poller: moves committed transactions from the change table into the log.
#include "capture/trigger/poller.h"

#include <charconv>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "capture/trigger/relation_info.h"

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
  std::uint32_t rel = 0;
  char op = 0;
  char old_kind = 0;  // 0 when the row has no old values
  std::optional<std::vector<std::optional<std::string>>> old_values;
  std::optional<std::vector<std::optional<std::string>>> new_values;
  std::optional<std::int64_t> commit_time;
};

// A one-dimensional text[] in array_send's binary form.
Result<std::vector<std::optional<std::string>>> parse_text_array(std::string_view bytes) {
  ByteReader r(ByteView(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
  const std::int32_t ndim = r.i32();
  r.i32();  // has-nulls flag
  r.u32();  // element type
  std::vector<std::optional<std::string>> out;
  if (!r.ok() || ndim < 0 || ndim > 1) return bad("unexpected text[] value in the change table");
  if (ndim == 0) return out;
  const std::int32_t n = r.i32();
  r.i32();  // lower bound
  if (!r.ok() || n < 0 || static_cast<std::size_t>(n) > r.remaining() / 4) {
    return bad("malformed text[] value in the change table");
  }
  out.reserve(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t len = r.i32();
    if (len < 0) {
      out.emplace_back(std::nullopt);
    } else {
      out.emplace_back(r.string(static_cast<std::size_t>(len)));
    }
  }
  if (!r.ok() || !r.at_end()) return bad("malformed text[] value in the change table");
  return out;
}

pgoutput::Tuple to_tuple(const std::vector<std::optional<std::string>>& values) {
  pgoutput::Tuple t;
  t.columns.reserve(values.size());
  for (const auto& v : values) {
    t.columns.push_back(v ? pgoutput::TupleValue::text(*v) : pgoutput::TupleValue::null());
  }
  return t;
}

// The pgoutput message for a row, or nullopt when pgoutput would send nothing.
Result<std::optional<log::ChangeMessage>> to_message(const ChangeRow& row,
                                                     const pgoutput::Relation& rel) {
  auto width_ok = [&](const auto& values) {
    return !values || values->size() == rel.columns.size();
  };
  if (!width_ok(row.new_values) || !width_ok(row.old_values)) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "captured row of \"" + rel.name + "\" does not match its current columns",
                       "Run the trigger capture install again after changing a table's columns.");
  }
  using Out = std::optional<log::ChangeMessage>;
  switch (row.op) {
    case 'I':
      if (!row.new_values) break;
      return Out(pgoutput::Insert{std::nullopt, row.rel, to_tuple(*row.new_values)});
    case 'U': {
      if (!row.new_values) break;
      pgoutput::Update u{std::nullopt, row.rel, std::nullopt, to_tuple(*row.new_values)};
      if (row.old_values) {
        u.old = pgoutput::OldTuple{
            row.old_kind == 'O' ? pgoutput::OldKind::kFull : pgoutput::OldKind::kKey,
            to_tuple(*row.old_values)};
      }
      return Out(std::move(u));
    }
    case 'D':
      if (!row.old_values) return Out();
      return Out(pgoutput::Delete{std::nullopt, row.rel,
                                  pgoutput::OldTuple{row.old_kind == 'O' ? pgoutput::OldKind::kFull
                                                                         : pgoutput::OldKind::kKey,
                                                     to_tuple(*row.old_values)}});
    case 'T':
      return Out(pgoutput::Truncate{std::nullopt, false, false, {row.rel}});
    default:
      break;
  }
  return bad(std::string("malformed change row (op '") + row.op + "')");
}

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

Result<PollStats> TriggerPoller::poll() {
  auto stats = capture();
  if (!stats.ok()) return stats;
  PGRELAY_TRY(release());
  return stats;
}

Result<PollStats> TriggerPoller::capture() {
  PgSession& s = *session_;
  PollStats stats;
  PGRELAY_TRY(s.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"));
  struct Rollback {
    PgSession& s;
    bool active = true;
    ~Rollback() {
      if (active) (void)s.run("ROLLBACK");
    }
  } rollback{s};

  // The first statement fixes the transaction snapshot, so S_k is exactly what the reads see.
  auto head = s.exec(
      "SELECT pg_catalog.pg_current_snapshot()::text, pg_catalog.pg_current_wal_lsn()::text, "
      "((extract(epoch FROM pg_catalog.now()) - 946684800) * 1000000)::int8::text");
  if (!head.ok()) return head.error();
  stats.snapshot = std::string(head->value(0, 0));
  auto wal = Lsn::parse(head->value(0, 1));
  auto poll_time = parse_int<std::int64_t>(head->value(0, 2));
  if (!wal || !poll_time) return bad("unexpected snapshot or WAL position from upstream");
  stats.upstream_lsn = *wal;

  const std::string commit_ts =
      commit_timestamps_
          ? "((extract(epoch FROM pg_catalog.pg_xact_commit_timestamp(pg_catalog.xid(c.xid)))"
            " - 946684800) * 1000000)::int8::text"
          : "NULL::text";
  std::string sql =
      "SELECT c.xid::text, c.rel::pg_catalog.int8::text, c.op::text, c.old_kind::text, "
      "c.old_values, c.new_values, " +
      commit_ts + " FROM " + changes_table_ +
      " c WHERE pg_catalog.pg_visible_in_snapshot(c.xid, $1::pg_catalog.pg_snapshot)";
  Params params{stats.snapshot};
  if (!prev_snapshot_.empty()) {
    sql +=
        " AND c.xid >= pg_catalog.pg_snapshot_xmin($2::pg_catalog.pg_snapshot)"
        " AND NOT pg_catalog.pg_visible_in_snapshot(c.xid, $2::pg_catalog.pg_snapshot)";
    params.push_back(prev_snapshot_);
  }
  sql += " ORDER BY max(c.seq) OVER (PARTITION BY c.xid), c.seq";
  auto rows = s.exec(sql, params, /*binary_result=*/true);
  if (!rows.ok()) return rows.error();

  // Group consecutive rows of one xid (the ORDER BY keeps a transaction's rows together).
  std::vector<std::vector<ChangeRow>> txns;
  std::uint64_t last_xid = 0;
  for (int i = 0; i < rows->rows(); ++i) {
    ChangeRow row;
    auto xid = parse_int<std::uint64_t>(rows->value(i, 0));
    auto rel = parse_int<std::uint32_t>(rows->value(i, 1));
    std::string_view op = rows->value(i, 2);
    if (!xid || !rel || op.size() != 1) return bad("malformed row in the change table");
    row.xid = *xid;
    row.rel = *rel;
    row.op = op[0];
    if (!rows->is_null(i, 3) && !rows->value(i, 3).empty()) row.old_kind = rows->value(i, 3)[0];
    if (!rows->is_null(i, 4)) {
      auto v = parse_text_array(rows->value(i, 4));
      if (!v.ok()) return v.error();
      row.old_values = std::move(*v);
    }
    if (!rows->is_null(i, 5)) {
      auto v = parse_text_array(rows->value(i, 5));
      if (!v.ok()) return v.error();
      row.new_values = std::move(*v);
    }
    if (!rows->is_null(i, 6)) row.commit_time = parse_int<std::int64_t>(rows->value(i, 6));
    if (txns.empty() || row.xid != last_xid) txns.emplace_back();
    last_xid = row.xid;
    txns.back().push_back(std::move(row));
  }
  stats.rows = static_cast<std::size_t>(rows->rows());

  // The tables' Relations as the catalog has them now.
  std::map<std::uint32_t, bool> known;
  for (const auto& t : txns) {
    for (const auto& row : t) {
      if (known.count(row.rel) != 0) continue;
      auto rel = load_relation(s, row.rel);
      if (!rel.ok()) return rel.error();
      known[row.rel] = rel->has_value();
      if (!rel->has_value()) continue;
      auto types = load_types(s, **rel);
      if (!types.ok()) return types.error();
      for (auto& type : *types) catalog_.put(std::move(type));
      catalog_.put(std::move(**rel));
    }
  }

  // LSNs are offsets from the base the log picks: begin, one per change, commit, end.
  std::vector<log::BuiltEntry> built;
  std::uint64_t offset = 0;
  log::TransactionBuilder builder(catalog_, log::BuilderOptions{options_.spill_dir});
  for (const auto& t : txns) {
    std::vector<log::ChangeMessage> messages;
    for (const auto& row : t) {
      if (!known[row.rel]) {
        ++stats.skipped_rows;
        continue;
      }
      auto m = to_message(row, *catalog_.relation(row.rel));
      if (!m.ok()) return m.error();
      if (!m->has_value()) {
        ++stats.skipped_rows;
        continue;
      }
      // Triggers see one TRUNCATE per table; pgoutput sends one message for the tables a
      // statement truncated (cascaded ones included), which fire one after the other.
      auto* trunc = std::get_if<pgoutput::Truncate>(&**m);
      auto* last = messages.empty() ? nullptr : std::get_if<pgoutput::Truncate>(&messages.back());
      if (trunc != nullptr && last != nullptr) {
        last->relation_oids.push_back(row.rel);
        continue;
      }
      messages.push_back(std::move(**m));
    }
    if (messages.empty()) continue;
    log::TransactionHeader h;
    h.begin_lsn = Lsn(offset);
    h.commit_lsn = Lsn(offset + messages.size());
    h.end_lsn = Lsn(offset + messages.size() + 1);
    h.commit_time = t.back().commit_time.value_or(*poll_time);
    h.xid = static_cast<std::uint32_t>(t.front().xid & 0xFFFFFFFFu);
    PGRELAY_TRY(builder.begin(h));
    for (std::size_t j = 0; j < messages.size(); ++j) {
      PGRELAY_TRY(builder.add(Lsn(offset + j), std::move(messages[j])));
    }
    auto entry = builder.finish();
    if (!entry.ok()) return entry.error();
    built.push_back(std::move(*entry));
    offset = h.end_lsn.value();
  }
  stats.transactions = built.size();
  rollback.active = false;
  PGRELAY_TRY(s.run("COMMIT"));

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
  auto base = log_.append_assigning(batch, stats.upstream_lsn);
  if (!base.ok()) return base.error();
  stats.base = *base;
  prev_snapshot_ = stats.snapshot;
  persisted_snapshot_ = stats.snapshot;
  release_pending_ = true;
  return stats;
}

Status TriggerPoller::release() {
  if (!release_pending_) return {};
  PGRELAY_TRY(session_->run("DELETE FROM " + changes_table_ +
                                " WHERE pg_catalog.pg_visible_in_snapshot(xid, "
                                "$1::pg_catalog.pg_snapshot)",
                            {persisted_snapshot_}));
  release_pending_ = false;
  return {};
}

}  // namespace pgrelay::capture
