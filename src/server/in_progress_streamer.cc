// Streams transactions in progress to a consumer that asked for streaming, as stream blocks.
#include "server/in_progress_streamer.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <type_traits>
#include <vector>

#include "log/transaction.h"
#include "pgoutput/encoder.h"
#include "wire/replication_frames.h"

namespace pgrelay::server {
namespace {

// A new block starts once this much of a transaction is readable (or it has committed), so
// that blocks are not a record (256 KiB) each: a subscriber opens its stream file per block.
constexpr std::uint64_t kMinBlock = 2ull << 20;
// Bytes read from a spill file at a time.
constexpr std::size_t kReadChunk = 256 * 1024;

log::EntryMeta meta_for(const log::InProgressSource& source) {
  log::EntryMeta meta;
  meta.kind = log::EntryKind::kTransaction;
  meta.begin_lsn = meta.commit_lsn = meta.end_lsn = source.begin_lsn();
  meta.xid = source.xid();
  // The count is not known before the commit; the log checks it when it takes the entry.
  meta.change_count = std::numeric_limits<std::uint32_t>::max();
  return meta;
}

void append_message(Bytes& out, Lsn lsn, const pgoutput::Message& message) {
  const Bytes payload = pgoutput::encode(message);
  wire::append_xlog_data_frame(out, lsn, lsn,
                               wire::to_pg_timestamp(std::chrono::system_clock::now()), payload);
}

// Inside a stream block, every message of a change names its (sub)transaction.
void set_xid(pgoutput::Message& message, pgoutput::Xid xid) {
  std::visit(
      [&](auto& m) {
        if constexpr (requires { m.xid = std::optional<pgoutput::Xid>(); }) m.xid = xid;
      },
      message);
}

}  // namespace

struct InProgressStreamer::Stream {
  Stream(const log::InProgressSource& source, const log::ViewOptions& options,
         std::uint64_t options_id)
      : reader(source), meta(meta_for(source)), view(options), view_id(options_id), changes(meta) {
    view.start(meta);
  }
  log::InProgressReader reader;
  log::EntryMeta meta;
  log::ChangeView view;
  std::uint64_t view_id;          // the session view it was copied from
  log::ChangeReader changes;      // decodes what the reader read
  std::vector<log::XidRun> runs;  // of the data read, from the change being decoded
  // Where what the consumer was sent switched (sub)transaction: a cut finds the first one it
  // must abort here.
  std::vector<log::XidRun> sent;
  // The Relations sent in this transaction, as they are sent outside streams.
  std::unordered_map<pgoutput::Oid, Bytes> relations;
  bool started = false;    // the consumer was sent its Stream Start
  bool abandoned = false;  // aborted for this consumer: the log's entry goes out whole

  pgoutput::Xid xid_at(std::uint64_t offset) const {
    auto after =
        std::upper_bound(runs.begin(), runs.end(), offset,
                         [](std::uint64_t at, const log::XidRun& r) { return at < r.offset; });
    return after == runs.begin() ? meta.xid : std::prev(after)->xid;
  }
};

InProgressStreamer::InProgressStreamer(log::InProgressTransactions* registry,
                                       const pgoutput::PgoutputOptions& options)
    : registry_(options.streaming != pgoutput::StreamingMode::kOff &&
                        options.proto_version >= pgoutput::kProtoStreamVersion && !options.binary
                    ? registry
                    : nullptr),
      parallel_(options.streaming == pgoutput::StreamingMode::kParallel) {}

InProgressStreamer::~InProgressStreamer() = default;

void InProgressStreamer::begin_block(Stream& s, Lsn lsn, Bytes& out) {
  if (open_block_ == &s) return;
  end_block(out);
  append_message(out, lsn, pgoutput::StreamStart{s.meta.xid, !s.started});
  // As pgoutput_stream_start: the origin in the first block, without its LSN.
  if (!s.started) {
    if (std::string origin = s.reader.origin(); !origin.empty()) {
      append_message(out, lsn, pgoutput::Origin{Lsn(), std::move(origin)});
    }
  }
  s.started = true;
  open_block_ = &s;
  block_lsn_ = lsn;
}

void InProgressStreamer::end_block(Bytes& out) {
  if (open_block_ == nullptr) return;
  append_message(out, block_lsn_, pgoutput::StreamStop{});
  open_block_ = nullptr;
}

void InProgressStreamer::abort_stream(Stream& s, Bytes& out) {
  if (!s.started) return;
  end_block(out);
  pgoutput::StreamAbort abort{s.meta.xid, s.meta.xid, std::nullopt};
  // Protocol 4's parallel apply moves the subscriber's origin to the abort's LSN: the
  // transaction's first change is one it has certainly passed.
  if (parallel_) {
    abort.abort_info = pgoutput::AbortInfo{s.meta.begin_lsn,
                                           wire::to_pg_timestamp(std::chrono::system_clock::now())};
  }
  append_message(out, s.meta.begin_lsn, abort);
  s.started = false;
  s.sent.clear();
  s.relations.clear();
}

void InProgressStreamer::apply_cut(Stream& s, const log::InProgressReader::Cut& cut, Bytes& out) {
  auto first = std::find_if(s.sent.begin(), s.sent.end(),
                            [&](const log::XidRun& r) { return r.offset >= cut.offset; });
  if (first != s.sent.end()) {
    if (first->xid == s.meta.xid) {
      // Not a subtransaction's change: nothing can take back only the part past the cut.
      abort_stream(s, out);
      s.abandoned = true;
      return;
    }
    end_block(out);
    pgoutput::StreamAbort abort{s.meta.xid, first->xid, std::nullopt};
    if (parallel_) {
      abort.abort_info = pgoutput::AbortInfo{
          s.meta.begin_lsn, wire::to_pg_timestamp(std::chrono::system_clock::now())};
    }
    append_message(out, s.meta.begin_lsn, abort);
    s.sent.erase(first, s.sent.end());
  }
  s.changes.restart_at(cut.offset);
  s.runs.erase(std::find_if(s.runs.begin(), s.runs.end(),
                            [&](const log::XidRun& r) { return r.offset >= cut.offset; }),
               s.runs.end());
  // What the consumer dropped may have described tables: describe every one again.
  s.view.replace_options(s.view.options());
  s.relations.clear();
}

Status InProgressStreamer::send_change(Stream& s, std::uint64_t offset, log::Change change,
                                       Bytes& out) {
  const pgoutput::Xid xid = s.xid_at(offset);
  std::vector<log::Change> send;
  PGRELAY_TRY(s.view.push(std::move(change), send));
  if (send.empty() || s.view.publications_changed()) return {};
  for (auto& c : send) {
    pgoutput::Message message = log::to_message(std::move(c.message));
    if (auto* relation = std::get_if<pgoutput::Relation>(&message)) {
      s.relations[relation->oid] = pgoutput::encode(message);
    }
    set_xid(message, xid);
    begin_block(s, c.lsn, out);
    append_message(out, c.lsn, message);
    block_lsn_ = c.lsn;
  }
  if (s.sent.empty() || s.sent.back().xid != xid) s.sent.push_back({offset, xid});
  return {};
}

Status InProgressStreamer::pump(Stream& s, Bytes& out, std::size_t budget, std::uint64_t at_least) {
  while (out.size() < budget && !s.abandoned) {
    if (auto cut = s.reader.take_cut()) {
      apply_cut(s, *cut, out);
      if (s.abandoned) break;
    }
    const std::uint64_t available = s.reader.available();
    if (available == 0 || available < at_least) break;
    auto piece = s.reader.read(kReadChunk);
    if (!piece.ok()) return piece.error();
    if (piece->data.empty()) break;  // a rewind overlapped the read: read again next time
    for (const auto& run : piece->runs) {
      if (!s.runs.empty() && run.offset <= s.runs.back().offset) {
        if (run.offset == s.runs.back().offset) s.runs.back().xid = run.xid;
        continue;
      }
      s.runs.push_back(run);
    }
    s.changes.feed(piece->data);
    for (;;) {
      const std::uint64_t at = s.changes.offset();
      auto change = s.changes.next();
      if (!change.ok()) return change.error();
      if (!change->has_value()) break;
      PGRELAY_TRY(send_change(s, at, std::move(**change), out));
      if (s.view.publications_changed()) {
        // Capture marked a change of the publications here: what follows must go through the
        // view they make, read once the transaction has committed. The log sends it whole.
        abort_stream(s, out);
        s.abandoned = true;
        return {};
      }
    }
    // Keep the run in effect at the next change, and those after it.
    const std::uint64_t next = s.changes.offset();
    auto after =
        std::upper_bound(s.runs.begin(), s.runs.end(), next,
                         [](std::uint64_t at, const log::XidRun& r) { return at < r.offset; });
    if (after != s.runs.begin()) s.runs.erase(s.runs.begin(), std::prev(after));
    at_least = 0;  // the block is open: go on with whatever is there
  }
  return {};
}

void InProgressStreamer::refresh(const log::ViewOptions& view, std::uint64_t view_id, Bytes& out) {
  for (auto& [id, s] : streams_) {
    if (s->view_id == view_id) continue;
    s->view.replace_options(view);
    s->view_id = view_id;
  }
  const std::uint64_t generation = registry_->generation();
  if (generation == generation_) return;
  generation_ = generation;
  for (const auto& source : registry_->list()) {
    if (source.id() <= last_id_) continue;
    last_id_ = source.id();
    // An earlier showing of the same transaction: capture lost it, and the upstream streams it
    // again from its start.
    for (auto it = streams_.begin(); it != streams_.end();) {
      if (it->second->meta.xid != source.xid()) {
        ++it;
        continue;
      }
      abort_stream(*it->second, out);
      it = streams_.erase(it);
    }
    streams_.emplace(source.id(), std::make_unique<Stream>(source, view, view_id));
  }
}

Result<bool> InProgressStreamer::stream(const log::ViewOptions& view, std::uint64_t view_id,
                                        Bytes& out, std::size_t budget) {
  if (!enabled()) return false;
  refresh(view, view_id, out);
  bool more = false;
  for (auto it = streams_.begin(); it != streams_.end();) {
    Stream& s = *it->second;
    const log::InProgressPhase phase = s.reader.phase();
    if (phase == log::InProgressPhase::kAborted) {
      abort_stream(s, out);
      it = streams_.erase(it);
      continue;
    }
    ++it;
    if (s.abandoned) continue;
    if (out.size() >= budget) {
      more = true;
      break;
    }
    const bool finished = phase == log::InProgressPhase::kFinished;
    PGRELAY_TRY(pump(s, out, budget, open_block_ == &s || finished ? 0 : kMinBlock));
    if (s.abandoned) continue;
    const std::uint64_t left = s.reader.available();
    if (out.size() >= budget && left > 0) more = true;
    // Nothing more of it for now: the block ends, as Postgres ends one per streaming round.
    if (open_block_ == &s && left == 0) end_block(out);
  }
  return more;
}

bool InProgressStreamer::streamed(const log::EntryMeta& meta, Bytes& out) {
  if (!enabled() || meta.kind != log::EntryKind::kTransaction) return false;
  bool found = false;
  for (auto it = streams_.begin(); it != streams_.end();) {
    Stream& s = *it->second;
    if (s.reader.phase() == log::InProgressPhase::kAborted) {
      // It rolled back before this entry committed: its Stream Abort goes first, as the
      // upstream's abort record came first.
      abort_stream(s, out);
      it = streams_.erase(it);
      continue;
    }
    const auto commit = s.reader.commit();
    if (!commit) {
      ++it;
      continue;
    }
    if (s.meta.xid == meta.xid && s.meta.begin_lsn == meta.begin_lsn &&
        commit->commit_lsn == meta.commit_lsn) {
      if (s.started && !s.abandoned) {
        found = true;
        ++it;
      } else {
        it = streams_.erase(it);
      }
      continue;
    }
    if (commit->commit_lsn < meta.commit_lsn) {
      // The log went past it: capture lost it before the log took it.
      if (open_block_ == &s) end_block(out);
      abort_stream(s, out);
      it = streams_.erase(it);
      continue;
    }
    ++it;
  }
  return found;
}

Result<InProgressStreamer::Finished> InProgressStreamer::finish(
    const log::EntryMeta& meta, Bytes& out, std::size_t budget,
    std::unordered_map<pgoutput::Oid, Bytes>& known) {
  auto it = std::find_if(streams_.begin(), streams_.end(), [&](const auto& entry) {
    return entry.second->meta.xid == meta.xid && entry.second->meta.begin_lsn == meta.begin_lsn;
  });
  if (it == streams_.end()) return Finished::kSendWhole;
  Stream& s = *it->second;
  if (!s.abandoned) PGRELAY_TRY(pump(s, out, budget, 0));
  if (s.abandoned) {
    streams_.erase(it);
    return Finished::kSendWhole;
  }
  if (s.reader.available() > 0) return Finished::kMore;
  if (s.changes.buffered() > 0) {
    return Error::make(sqlstate::kDataCorrupted,
                       "transaction " + std::to_string(meta.xid) + " (commit LSN " +
                           meta.commit_lsn.to_string() + ") ends inside a change",
                       "Restore the data directory from a backup.");
  }
  end_block(out);
  append_message(out, meta.end_lsn,
                 pgoutput::StreamCommit{meta.xid, meta.commit_lsn, meta.end_lsn, meta.commit_time});
  for (auto& [oid, relation] : s.relations) known[oid] = std::move(relation);
  streams_.erase(it);
  return Finished::kDone;
}

}  // namespace pgrelay::server
