// Trigger capture's poller: moves committed transactions from the change table into the log.
#include "capture/trigger/poller.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "base/hop_trace.h"
#include "capture/trigger/installer.h"
#include "capture/trigger/record_text.h"
#include "capture/trigger/relation_info.h"
#include "capture/trigger/text_array.h"
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
  std::int64_t unit_order = 0;  // the log order of its transaction (or message)
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
// right; a version missing from it means a table was altered (or created) since, and every
// version is loaded again. With them, the Type records of every non-built-in column type they use,
// so that rows can be decoded while they stream in, when the session can run no other query.
struct TriggerPoller::LayoutCache {
  Layouts layouts;
  std::map<pgoutput::Oid, pgoutput::Type> types;
  bool loaded = false;
};

namespace {

// Every recorded version of every table.
Result<Layouts> load_layouts(PgSession& s, const std::string& table) {
  Layouts out;
  auto r = s.exec(
      "SELECT l.relid::pg_catalog.int8::text, l.version::text, l.nspname, l.relname, "
      "l.replident::text, u.name, u.type::pg_catalog.int8::text, u.typmod::text, u.key::text, "
      "u.gen::text FROM " +
      table +
      " l LEFT JOIN LATERAL ROWS FROM (pg_catalog.unnest(l.names), pg_catalog.unnest(l.types), "
      "pg_catalog.unnest(l.typmods), pg_catalog.unnest(l.keys), "
      "pg_catalog.unnest(l.generated)) WITH ORDINALITY AS u(name, type, typmod, key, gen, ord) "
      "ON true ORDER BY l.relid, l.version, u.ord");
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

// A row of the poll's result (columns 3 on; 0-2 are the head).
Result<ChangeRow> parse_change_row(const QueryResult& r) {
  ChangeRow row;
  auto xid = parse_int<std::uint64_t>(r.value(0, 3));
  auto seq = parse_int<std::int64_t>(r.value(0, 4));
  auto rel = parse_int<std::uint32_t>(r.value(0, 5));
  std::string_view op = r.value(0, 6);
  if (!xid || !seq || !rel || op.size() != 1) return bad("malformed row in the change table");
  row.xid = *xid;
  row.seq = *seq;
  row.rel = *rel;
  row.op = op[0];
  if (!r.is_null(0, 7)) {
    auto layout = parse_int<std::int32_t>(r.value(0, 7));
    if (!layout) return bad("malformed layout in the change table");
    row.layout = *layout;
  }
  if (!r.is_null(0, 8) && !r.value(0, 8).empty()) row.old_kind = r.value(0, 8)[0];
  row.old_row = r.get(0, 9);
  row.new_row = r.get(0, 10);
  if (!r.is_null(0, 11)) row.unchanged = parse_positions(r.value(0, 11));
  row.info = r.get(0, 12);
  if (!r.is_null(0, 13)) row.content = std::string(r.value(0, 13));
  if (!r.is_null(0, 14)) row.commit_time = parse_int<std::int64_t>(r.value(0, 14));
  auto order = parse_int<std::int64_t>(r.value(0, 15));
  if (!order) return bad("malformed log order in the change table");
  row.unit_order = *order;
  return row;
}

// The rows of a change row that holds a chunk of a statement's rows (columns 16-18): old
// texts, new texts and unchanged positions, paired by position. Empty for a row of one change
// (version 3's form, a truncate or a message).
class RowChunk {
 public:
  static Result<RowChunk> parse(const QueryResult& r) {
    RowChunk chunk;
    for (int column = 16; column <= 18; ++column) {
      if (r.is_null(0, column)) continue;
      auto elements = parse_text_array(r.value(0, column));
      if (!elements.ok()) return elements.error();
      if (chunk.size_ != 0 && elements->size() != chunk.size_) {
        return bad("the row arrays of a change row differ in length");
      }
      chunk.size_ = elements->size();
      chunk.columns_[column - 16] = std::move(*elements);
    }
    return chunk;
  }
  std::size_t size() const { return size_; }
  // Makes `row` the chunk's i-th row.
  void fill(std::size_t i, ChangeRow& row) const {
    auto text = [&](const TextElements& column) -> std::optional<std::string> {
      if (column.empty() || !column[i]) return std::nullopt;
      return std::string(*column[i]);
    };
    row.old_row = text(columns_[0]);
    row.new_row = text(columns_[1]);
    const auto kept = text(columns_[2]);
    row.unchanged = kept ? parse_positions(*kept) : std::vector<std::size_t>();
  }

 private:
  TextElements columns_[3];  // old_rows, new_rows, unchanged_rows
  std::size_t size_ = 0;
};

// Turns a poll's rows, in log order, into log entries as they arrive: a transaction's changes
// go into the builder one by one (which moves a large one to a spill file), so memory holds
// one row and one change, not the transaction. A non-transactional message is its own entry.
// LSNs are offsets from the base the log will pick: begin, one per change, commit, end.
class EntryAssembler {
 public:
  // Makes the catalog hold the Relation (and Types) of a layout version before a change of it.
  using UseLayout = std::function<Status(std::uint32_t rel, std::int32_t version)>;

  EntryAssembler(log::TransactionBuilder& builder, const Layouts& layouts, UseLayout use_layout,
                 Lsn predicted, std::int64_t poll_time)
      : builder_(builder),
        layouts_(layouts),
        use_layout_(std::move(use_layout)),
        predicted_(predicted),
        poll_time_(poll_time) {}

  // kMismatch when the row fits no recorded layout (left out instead with skip_unfit).
  Result<Outcome> add(const ChangeRow& row, bool skip_unfit, PollStats& stats) {
    if (row.op == 'm') {
      PGRELAY_TRY(end_transaction());
      log::TransactionHeader h = header_at_offset(row);
      h.commit_lsn = h.begin_lsn;
      h.end_lsn = Lsn(offset_ + 1);
      pgoutput::LogicalMessage m{std::nullopt, false, predicted_ + offset_,
                                 row.info.value_or(std::string()), row.content};
      auto entry = log::build_message_entry(h, Lsn(offset_), std::move(m));
      if (!entry.ok()) return entry.error();
      data_bytes_ += entry->data_size();
      built_.push_back(std::move(*entry));
      offset_ = h.end_lsn.value();
      ++stats.messages;
      return Outcome::kMessage;
    }
    if (!open_ || xid_ != row.xid) {
      PGRELAY_TRY(end_transaction());
      PGRELAY_TRY(builder_.begin(header_at_offset(row)));
      open_ = true;
      xid_ = row.xid;
      changes_ = 0;
    }
    Decoded d;
    auto outcome = decode_row(row, layouts_, &d);
    if (!outcome.ok()) return outcome.error();
    if (*outcome == Outcome::kMismatch) {
      if (!skip_unfit) return Outcome::kMismatch;
      ++stats.undecodable_rows;
      return Outcome::kSkip;
    }
    if (*outcome == Outcome::kSkip) {
      ++stats.skipped_rows;
      return Outcome::kSkip;
    }
    // Triggers see one TRUNCATE per table; pgoutput sends one message for the tables a
    // statement truncated (cascaded ones included), which fire one after the other.
    auto* trunc = std::get_if<pgoutput::Truncate>(&d.message);
    auto* prev = pending_ ? std::get_if<pgoutput::Truncate>(&pending_->message) : nullptr;
    if (trunc != nullptr && prev != nullptr &&
        pending_->truncate_statement == d.truncate_statement) {
      prev->relation_oids.push_back(row.rel);
      pending_->layouts.push_back(d.layouts.front());
      return Outcome::kMessage;
    }
    PGRELAY_TRY(write_pending());
    pending_ = std::move(d);
    return Outcome::kMessage;
  }

  // Ends the transaction being built, if any (after the last row).
  Status end_transaction() {
    if (!open_) return {};
    PGRELAY_TRY(write_pending());
    open_ = false;
    if (changes_ == 0) {  // every row was left out
      builder_.abort();
      return {};
    }
    const Lsn commit(offset_ + changes_);
    auto entry = builder_.finish(commit, commit + 1);
    if (!entry.ok()) return entry.error();
    data_bytes_ += entry->data_size();
    built_.push_back(std::move(*entry));
    offset_ = commit.value() + 1;
    return {};
  }

  std::vector<log::BuiltEntry>& built() { return built_; }
  // The offset past the last entry (where a checkpoint after them goes).
  std::uint64_t offset() const { return offset_; }
  // The data of the finished entries, in memory or spilled (each spilled one holds a file open).
  std::uint64_t data_bytes() const { return data_bytes_; }
  // Once the finished entries are appended (no transaction open): the next ones' LSNs are
  // offsets from `predicted` again.
  void rebase(Lsn predicted) {
    built_.clear();
    data_bytes_ = 0;
    offset_ = 0;
    predicted_ = predicted;
  }

 private:
  // The header of an entry that begins here, for the transaction (or message) of `row`.
  log::TransactionHeader header_at_offset(const ChangeRow& row) const {
    log::TransactionHeader h;
    h.commit_time = row.commit_time.value_or(poll_time_);
    h.xid = static_cast<std::uint32_t>(row.xid & 0xFFFFFFFFu);
    h.begin_lsn = Lsn(offset_);
    return h;
  }

  // The change held back in case the next row's TRUNCATE merges into it goes into the builder.
  Status write_pending() {
    if (!pending_) return {};
    Decoded d = std::move(*pending_);
    pending_.reset();
    for (const auto& [rel, version] : d.layouts) PGRELAY_TRY(use_layout_(rel, version));
    const Lsn lsn(offset_ + changes_);
    if (auto* trunc = std::get_if<pgoutput::Truncate>(&d.message)) {
      std::vector<std::string> names;
      for (const auto& [rel, version] : d.layouts) {
        names.push_back(layouts_.at({rel, version}).relation.name);
      }
      const TruncateOptions options = truncate_options(d.truncate_query, names);
      trunc->cascade = options.cascade;
      trunc->restart_identity = options.restart_identity;
    } else if (auto* msg = std::get_if<pgoutput::LogicalMessage>(&d.message)) {
      msg->lsn = predicted_ + lsn.value();
    }
    PGRELAY_TRY(builder_.add(lsn, std::move(d.message)));
    ++changes_;
    return {};
  }

  log::TransactionBuilder& builder_;
  const Layouts& layouts_;
  UseLayout use_layout_;
  Lsn predicted_;
  std::int64_t poll_time_;
  std::vector<log::BuiltEntry> built_;
  std::uint64_t data_bytes_ = 0;
  std::uint64_t offset_ = 0;
  bool open_ = false;
  std::uint64_t xid_ = 0;
  std::uint64_t changes_ = 0;
  std::optional<Decoded> pending_;
};

}  // namespace

Bytes encode_checkpoint(const CheckpointState& state) {
  std::string s(kCheckpointMagic);
  s += state.snapshot + "\n" + state.upstream_lsn.to_string() + "\n";
  if (state.through) {
    s += "partial " + std::to_string(*state.through) + "\n" + state.previous + "\n";
  }
  return Bytes(s.begin(), s.end());
}

Result<CheckpointState> decode_checkpoint(ByteView data) {
  std::string_view s(reinterpret_cast<const char*>(data.data()), data.size());
  const Error corrupt = Error::make(sqlstate::kDataCorrupted,
                                    "the log's capture checkpoint is not a trigger checkpoint");
  if (s.substr(0, kCheckpointMagic.size()) != kCheckpointMagic) return corrupt;
  s.remove_prefix(kCheckpointMagic.size());
  std::vector<std::string_view> lines;
  while (!s.empty()) {
    const auto nl = s.find('\n');
    if (nl == std::string_view::npos) return corrupt;
    lines.push_back(s.substr(0, nl));
    s.remove_prefix(nl + 1);
  }
  if ((lines.size() != 2 && lines.size() != 4) || lines[0].empty()) return corrupt;
  CheckpointState state;
  state.snapshot = std::string(lines[0]);
  auto lsn = Lsn::parse(lines[1]);
  if (!lsn) return corrupt;
  state.upstream_lsn = *lsn;
  if (lines.size() == 4) {
    constexpr std::string_view kPartial = "partial ";
    if (lines[2].substr(0, kPartial.size()) != kPartial) return corrupt;
    state.through = parse_int<std::int64_t>(lines[2].substr(kPartial.size()));
    if (!state.through) return corrupt;
    state.previous = std::string(lines[3]);
  }
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
    const std::string& complete = state->through ? state->previous : state->snapshot;
    p->prev_snapshot_ = complete;
    if (state->through) {
      p->partial_ = Partial{state->snapshot, state->upstream_lsn, *state->through};
    }
    // Rows appended before a crash may still be upstream. A poller before this one in this
    // process may have appended the checkpoint without waiting for its fdatasync.
    if (!complete.empty()) p->unsettled_ = Unsettled{complete, log.last_end_lsn()};
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
  // A snapshot partly in the log is finished first: a capture in an exported snapshot must
  // leave the log holding exactly what that snapshot sees.
  if (partial_ && !snapshot_name.empty()) {
    auto rest = capture_with_sync(std::string());
    if (!rest.ok()) return rest;
  }
  // Rows decode while they stream in, so the layouts must be known before the read. A row
  // stamped with a version not cached (DDL or a new table since the last load) ends the
  // attempt: the layouts are loaded again, and the next attempt knows every version recorded
  // before it began. Nothing is appended until an attempt has read every row.
  bool fresh = false;
  if (!layout_cache_->loaded) {
    PGRELAY_TRY(reload_layouts());
    fresh = true;
  }
  bool synced = false;
  bool skip_unfit = false;
  for (;;) {
    PollStats stats;
    auto attempt = capture_once(snapshot_name, /*stale_is_miss=*/!fresh, skip_unfit, &stats);
    if (!attempt.ok()) return attempt.error();
    switch (*attempt) {
      case Attempt::kDone:
        stats.synced_layouts = synced;
        return stats;
      case Attempt::kStaleLayouts:
        PGRELAY_TRY(reload_layouts());
        fresh = true;
        break;
      case Attempt::kMismatch:
        // DDL ran without an event trigger and its layout is not recorded yet: record it and
        // try again. Rows that still fit nothing were written with a layout that existed only
        // between two syncs; their column names and types are gone from the catalog.
        if (auto done = sync_tables(*session_, options_.schema); !done.ok()) return done.error();
        PGRELAY_TRY(reload_layouts());
        fresh = true;
        synced = true;
        skip_unfit = true;
        break;
    }
  }
}

Status TriggerPoller::reload_layouts() {
  auto loaded = load_layouts(*session_, layouts_table_);
  if (!loaded.ok()) return loaded.error();
  std::set<pgoutput::Oid> type_oids;
  for (const auto& [key, layout] : *loaded) {
    for (const auto& column : layout.relation.columns) type_oids.insert(column.type_oid);
  }
  auto types = load_types(*session_, type_oids);
  if (!types.ok()) return types.error();
  layout_cache_->layouts = std::move(*loaded);
  layout_cache_->types = std::move(*types);
  layout_cache_->loaded = true;
  return {};
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
  released_at_ = std::chrono::steady_clock::now();
}

Result<std::unique_ptr<RowStream>> TriggerPoller::read_changes(bool releasing) {
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
  // While a snapshot is partly in the log, the poll reads the rest of it: in that snapshot, at
  // its WAL position, past the log order the log got to.
  std::string snap = "pg_catalog.pg_current_snapshot()";
  std::string wal = "pg_catalog.pg_current_wal_insert_lsn()";
  if (partial_) {
    params.push_back(partial_->snapshot);
    snap = "$" + std::to_string(params.size()) + "::pg_catalog.pg_snapshot";
    params.push_back(partial_->upstream_lsn.to_string());
    wal = "$" + std::to_string(params.size()) + "::pg_catalog.pg_lsn";
  }
  sql += "head AS MATERIALIZED (SELECT " + snap + " AS snap, " + wal +
         " AS wal, "
         "((extract(epoch FROM pg_catalog.now()) - 946684800) * 1000000)::int8 AS t) "
         "SELECT h.snap::text, h.wal::text, h.t::text, c.xid::text, c.seq::text, "
         "c.rel::pg_catalog.int8::text, c.op::text, c.layout::text, c.old_kind::text, c.old_row, "
         "c.new_row, pg_catalog.array_to_string(c.unchanged, ','), c.info, c.content, c.commit_ts, "
         "c.unit_order::text, c.old_rows, c.new_rows, c.unchanged_rows "
         "FROM head h LEFT JOIN LATERAL (SELECT * FROM (SELECT c.*, " +
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
  sql += ") c";
  if (partial_) {
    params.push_back(std::to_string(partial_->through));
    sql += " WHERE c.unit_order > $" + std::to_string(params.size()) + "::int8";
  }
  sql += ") c ON true ORDER BY c.unit_order, c.op <> 'm', c.seq";
  // Each shape (releasing, bounded below, after a previous snapshot, the rest of a snapshot)
  // is planned once.
  const std::string name = std::string("pgrelay_poll_") + (releasing ? "r" : "") +
                           (released_floor_.empty() || !releasing ? "" : "f") +
                           (prev_snapshot_.empty() ? "" : "p") + (partial_ ? "c" : "");
  return session_->stream_prepared(name, sql, params, /*binary_result=*/true);
}

Result<TriggerPoller::Attempt> TriggerPoller::capture_once(const std::string& snapshot_name,
                                                           bool stale_is_miss, bool skip_unfit,
                                                           PollStats* out) {
  PgSession& s = *session_;
  PollStats& stats = *out;
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
  const bool release_due = !in_transaction && std::chrono::steady_clock::now() - released_at_ >=
                                                  options_.release_interval;
  // The fdatasync of the last poll's batch ran while this poll waited for its turn: settling
  // seldom waits.
  if (release_due) PGRELAY_TRY(settle());
  const bool releasing = release_due && release_pending_;
  // The builder (and its spill file) outlives the stream, which must end before the rollback.
  log::TransactionBuilder builder(catalog_, log::BuilderOptions{options_.spill_dir});
  HopTrace* trace = log_.options().hop_trace;
  const std::int64_t poll_sent = trace != nullptr ? unix_micros() : 0;
  auto rows = read_changes(releasing);
  if (!rows.ok()) return rows.error();
  RowStream& stream = **rows;
  // Columns 0-2 repeat the head on every row; one row of NULL changes when there are none.
  auto first = stream.next();
  if (!first.ok()) return first.error();
  if (!*first) return bad("the poll returned no head row");
  stats.snapshot = std::string(stream.row().value(0, 0));
  auto wal = Lsn::parse(stream.row().value(0, 1));
  auto poll_time = parse_int<std::int64_t>(stream.row().value(0, 2));
  if (!wal || !poll_time) return bad("unexpected snapshot or WAL position from upstream");
  stats.upstream_lsn = *wal;

  // Puts the Relation (and its Types) of a layout version into the catalog when another one is
  // there: the builder then sends it before the table's next change.
  const Layouts& layouts = layout_cache_->layouts;
  std::set<pgoutput::Oid> types_put;
  auto use_layout = [&](std::uint32_t rel, std::int32_t version) -> Status {
    auto it = catalog_layouts_.find(rel);
    if (it != catalog_layouts_.end() && it->second == version) return {};
    const Layout& layout = layouts.at({rel, version});
    for (const auto& column : layout.relation.columns) {
      auto type = layout_cache_->types.find(column.type_oid);
      if (type == layout_cache_->types.end() || !types_put.insert(type->first).second) continue;
      catalog_.put(type->second);
    }
    catalog_.put(layout.relation);
    catalog_layouts_[rel] = version;
    return {};
  };
  // The base is predictable (the poller is the log's only appender), which gives messages
  // their LSN.
  Lsn predicted = std::max(stats.upstream_lsn, log_.last_end_lsn() + 1);
  EntryAssembler assembler(builder, layouts, use_layout, predicted, *poll_time);
  // Appends what is finished when it passed the budget; the log then holds part of S_k.
  std::size_t appended = 0;  // entries appended so far in this poll
  std::optional<std::int64_t> last_order;
  // Appends the finished entries with a checkpoint of `state`, and counts them.
  auto append = [&](const CheckpointState& state) -> Status {
    std::vector<log::BuiltEntry>& built = assembler.built();
    const std::int64_t rows_read = trace != nullptr ? unix_micros() : 0;
    auto base = append_with_checkpoint(built, assembler.offset(), state, predicted, *poll_time);
    if (!base.ok()) return base.error();
    if (!built.empty()) {
      if (!stats.base.is_valid()) stats.base = *base;
      stats.last_lsn = *base + built.back().meta.commit_lsn.value();
      if (auto committed = log::last_commit_time(built)) stats.last_commit_time = *committed;
      if (trace != nullptr) {
        const std::uint64_t through = (*base + built.back().meta.end_lsn.value()).value();
        trace->stamp(Hop::kUpstreamSend, through, poll_sent);
        trace->stamp(Hop::kCaptureReceipt, through, rows_read);
      }
    }
    appended += built.size();
    return {};
  };
  auto append_part = [&]() -> Status {
    PGRELAY_TRY(assembler.end_transaction());
    if (assembler.built().empty()) return {};
    PGRELAY_TRY(append({stats.snapshot, stats.upstream_lsn, *last_order, prev_snapshot_}));
    partial_ = Partial{stats.snapshot, stats.upstream_lsn, *last_order};
    predicted = log_.last_end_lsn() + 1;
    assembler.rebase(predicted);
    return {};
  };
  bool more = !stream.row().is_null(0, 3);
  if (!more) {
    // Only the head: read the result to its end. A stream left before its end cancels the
    // statement, and the cancel request's own connection to the postmaster made each empty
    // poll take some 15 ms (p50; 10% of the polls at 1000 tx/s, the p99 of trigger capture's
    // latency). And a cancel that reached the statement before it ended would undo its release.
    auto end = stream.next();
    if (!end.ok()) return end.error();
    if (*end) return bad("the poll returned rows after a head row without changes");
  }
  while (more) {
    auto row = parse_change_row(stream.row());
    if (!row.ok()) return row.error();
    if (stale_is_miss && row->rel != 0 && !layouts.contains({row->rel, row->layout})) {
      return Attempt::kStaleLayouts;  // the stream reads (and drops) the rest as it goes
    }
    // Every entry of a log order before this row's is finished: a part may end here.
    if (last_order && row->unit_order != *last_order &&
        (assembler.built().size() >= options_.batch_entries ||
         assembler.data_bytes() >= options_.batch_bytes)) {
      PGRELAY_TRY(append_part());
    }
    last_order = row->unit_order;
    auto chunk = RowChunk::parse(stream.row());
    if (!chunk.ok()) return chunk.error();
    for (std::size_t i = 0, n = std::max<std::size_t>(chunk->size(), 1); i < n; ++i) {
      if (chunk->size() != 0) chunk->fill(i, *row);
      ++stats.rows;
      auto outcome = assembler.add(*row, skip_unfit, stats);
      if (!outcome.ok()) return outcome.error();
      if (*outcome == Outcome::kMismatch) return Attempt::kMismatch;
    }
    auto next = stream.next();
    if (!next.ok()) return next.error();
    more = *next;
  }
  PGRELAY_TRY(assembler.end_transaction());
  // Ends the statement's transaction. A releasing poll commits its DELETE after the last row,
  // and that commit waits for the upstream's WAL flush; the rows in hand are appended (and made
  // durable) meanwhile rather than after it (the poll step, p50 at 1000 tx/s: 0.43 -> 0.26 ms).
  auto end_statement = [&]() -> Status {
    PGRELAY_TRY(stream.finish());
    // The statement ran to its end: its release of the persisted snapshot's rows happened.
    if (releasing) released();
    if (in_transaction) {
      rollback.active = false;
      PGRELAY_TRY(s.run("COMMIT"));
    }
    return {};
  };

  if (assembler.built().empty() && !partial_) {
    PGRELAY_TRY(end_statement());
    // Nothing to persist: the transactions new in S_k wrote no rows, so resuming from the older
    // checkpoint would find nothing more either.
    stats.transactions = appended - stats.messages;
    prev_snapshot_ = stats.snapshot;
    return Attempt::kDone;
  }
  // An imported snapshot's transaction ends before anything is appended, as before.
  if (in_transaction) PGRELAY_TRY(end_statement());
  // The rest of S_k, and a checkpoint that says S_k is whole (alone, when the parts held it all).
  CheckpointState whole;
  whole.snapshot = stats.snapshot;
  whole.upstream_lsn = stats.upstream_lsn;
  PGRELAY_TRY(append(whole));
  stats.transactions = appended - stats.messages;
  partial_.reset();
  prev_snapshot_ = stats.snapshot;
  // The log holds S_k whatever the statement's end says: the state moves on with it, and the
  // poll counts. A failed commit only leaves the release to the next poll (released() is not
  // called), whose snapshot covers the same rows; a broken connection fails the next poll.
  if (!in_transaction) {
    if (auto ended = end_statement(); !ended.ok()) stats.end_error = ended.error();
  }
  unsettled_ = Unsettled{stats.snapshot, log_.last_end_lsn()};
  return Attempt::kDone;
}

Result<Lsn> TriggerPoller::append_with_checkpoint(std::vector<log::BuiltEntry>& built,
                                                  std::uint64_t end, const CheckpointState& state,
                                                  Lsn predicted, std::int64_t time) {
  const Bytes checkpoint = encode_checkpoint(state);
  std::vector<log::PendingEntry> batch;
  batch.reserve(built.size() + 1);
  for (const auto& e : built) batch.push_back(e.pending());
  log::EntryMeta cp_meta;
  cp_meta.kind = log::EntryKind::kCheckpoint;
  cp_meta.begin_lsn = cp_meta.commit_lsn = cp_meta.end_lsn = Lsn(end);
  cp_meta.commit_time = time;
  batch.push_back(log::PendingEntry{cp_meta, checkpoint, nullptr});
  return log_.append_assigning(batch, predicted, log::ChangeLog::ReturnWhen::kWritten);
}

Status TriggerPoller::settle() {
  if (!unsettled_) return {};
  // Under the other policies an append is as durable once written as it will be when append()
  // returns. Under kFsyncPerCommit the log syncs what is written without delay; only its
  // failure or its stop ends the wait early.
  const bool per_commit = log_.options().sync == log::SyncPolicy::kFsyncPerCommit;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  if (per_commit && !log_.wait_durable(unsettled_->end, deadline)) {
    return Error::make(sqlstate::kIoError, "the change log did not make the last poll durable",
                       "See pgrelay's log for the change log's error.");
  }
  persisted_snapshot_ = std::move(unsettled_->snapshot);
  release_pending_ = true;
  unsettled_.reset();
  return {};
}

Status TriggerPoller::release() {
  PGRELAY_TRY(settle());
  if (!release_pending_) return {};
  Params params;
  PGRELAY_TRY(
      session_->run("DELETE FROM " + changes_table_ + " WHERE " + released_rows(params), params));
  released();
  return {};
}

}  // namespace pgrelay::capture
