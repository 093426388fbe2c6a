// Runs native capture: streams pgrelay's upstream slot through pgoutput into the change log.
#include "capture/native/native_capture.h"

#include <algorithm>
#include <chrono>
#include <string_view>
#include <type_traits>

#include "base/thread_name.h"
#include "wire/replication_frames.h"

namespace pgrelay::capture {
namespace {

// The checkpoint native capture keeps in the log: which upstream slot the log continues. Trigger
// capture's checkpoints start differently, so neither mode continues the other's log.
constexpr std::string_view kCheckpointMagic = "pgrelay-native-checkpoint 1\n";

bool valid_slot_name(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

Error capture_error(std::string message, std::string hint = {}) {
  return Error::make(sqlstate::kObjectNotInPrerequisiteState, std::move(message), std::move(hint));
}

// "name" with embedded double quotes doubled.
std::string quoted_name(std::string_view name) {
  std::string out = "\"";
  for (char c : name) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// 'text' with embedded single quotes doubled: the replication grammar has no other string form.
std::string string_literal(std::string_view text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

Result<Lsn> lsn_of(std::string_view text, const char* what) {
  auto lsn = Lsn::parse(text);
  if (!lsn) return Error::make(sqlstate::kProtocolViolation, std::string("invalid ") + what);
  return *lsn;
}

}  // namespace

NativeCapture::NativeCapture(NativeCaptureOptions options, log::ChangeLog& log)
    : options_(std::move(options)), log_(log) {}

NativeCapture::~NativeCapture() {
  stop();
}

Result<std::unique_ptr<NativeCapture>> NativeCapture::start(NativeCaptureOptions options,
                                                            log::ChangeLog& log) {
  if (!valid_slot_name(options.slot)) {
    return Error::make(sqlstate::kInvalidName,
                       "invalid upstream slot name \"" + options.slot + "\"",
                       "Slot names use lower case letters, digits and underscores, at most 63.");
  }
  std::unique_ptr<NativeCapture> capture(new NativeCapture(std::move(options), log));
  PGRELAY_TRY(capture->check_log_is_native());
  {
    auto session = PgSession::connect(capture->options_.conninfo);
    if (!session.ok()) return session.error();
    if (capture->options_.install_on_start) {
      auto setup = install_native_capture(**session, {capture->options_.schema});
      if (!setup.ok()) return setup.error();
      capture->setup_ = *setup;
    } else {
      PGRELAY_TRY(check_native_capture_possible(**session, capture->options_.schema));
    }
  }
  log::BuilderOptions builder;
  builder.spill_dir = capture->options_.spill_dir;
  capture->builder_ = std::make_unique<log::TransactionBuilder>(capture->catalog_, builder);
  capture->appended_end_ = log.last_end_lsn();
  if (auto connected = capture->connect(); !connected.ok()) {
    // The walsender of a pgrelay that was just killed can hold the slot a moment longer;
    // the capture thread retries that. Anything else is a configuration error to report now.
    if (connected.error().sqlstate != sqlstate::kObjectInUse) return connected.error();
    capture->note_error(connected.error());
  }
  capture->thread_ = start_named_thread("native-capture", [c = capture.get()] { c->run(); });
  capture->mirror_thread_ =
      start_named_thread("native-mirror", [c = capture.get()] { c->run_mirror(); });
  return capture;
}

void NativeCapture::leave_loop() {
  {
    std::lock_guard lock(mu_);
    left_loop_ = true;
  }
  cv_.notify_all();
}

bool NativeCapture::reads_on_loop() const {
  if (options_.loop == nullptr) return false;
  std::lock_guard lock(mu_);
  return !left_loop_;
}

void NativeCapture::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (mirror_thread_.joinable()) mirror_thread_.join();
}

Status NativeCapture::check_log_is_native() {
  auto checkpoint = log_.last_checkpoint();
  if (!checkpoint) return {};
  std::string_view text(reinterpret_cast<const char*>(checkpoint->data()), checkpoint->size());
  if (text.substr(0, kCheckpointMagic.size()) == kCheckpointMagic) {
    std::string_view slot = text.substr(kCheckpointMagic.size());
    if (!slot.empty() && slot.back() == '\n') slot.remove_suffix(1);
    if (slot == options_.slot) return {};
    return capture_error("this log continues upstream slot \"" + std::string(slot) + "\", not \"" +
                             options_.slot + "\"",
                         "Start pgrelay with the data directory that slot belongs to, or a new "
                         "--data-dir.");
  }
  return capture_error("this data directory's log was captured with triggers",
                       "Keep --capture trigger for it, or start native capture with a new "
                       "--data-dir (and run `pgrelay capture uninstall` on the upstream).");
}

Status NativeCapture::connect() {
  auto session = PgSession::connect_replication(options_.conninfo);
  if (!session.ok()) return session.error();
  // Slot names are checked to need no quoting (valid_slot_name), and the replication grammar
  // takes no parameters.
  auto found = (*session)->exec(
      "SELECT plugin, database = current_database() FROM pg_catalog.pg_replication_slots "
      "WHERE slot_name = '" +
      options_.slot + "'");
  if (!found.ok()) return found.error();
  const bool have_checkpoint = log_.last_checkpoint().has_value();
  if (found->rows() == 0) {
    if (have_checkpoint) {
      return capture_error(
          "upstream replication slot \"" + options_.slot + "\" no longer exists: changes after " +
              log_.last_end_lsn().to_string() + " were not captured and cannot be recovered",
          "Start pgrelay with a new --data-dir; consumers then copy their tables again.");
    }
    PGRELAY_TRY((*session)->run("CREATE_REPLICATION_SLOT " + options_.slot +
                                " LOGICAL pgoutput (SNAPSHOT 'nothing')"));
  } else if (found->value(0, 0) != "pgoutput" || found->value(0, 1) != "t") {
    return capture_error("upstream replication slot \"" + options_.slot +
                             "\" exists but is not a pgoutput slot of this database",
                         "Drop it on the upstream (pg_drop_replication_slot) or point pgrelay at "
                         "the database it was made for.");
  }
  if (!have_checkpoint) {
    const std::string text = std::string(kCheckpointMagic) + options_.slot + "\n";
    Bytes data(text.begin(), text.end());
    log::EntryMeta meta;
    meta.kind = log::EntryKind::kCheckpoint;
    meta.begin_lsn = meta.commit_lsn = meta.end_lsn = log_.last_end_lsn();
    const log::PendingEntry entry{meta, data, nullptr};
    PGRELAY_TRY(log_.append(std::span<const log::PendingEntry>(&entry, 1)));
  }

  // publication_names is a replication-grammar string holding a list of identifiers.
  const std::string publications = quoted_name(capture_publication(options_.schema)) + "," +
                                   quoted_name(keyless_capture_publication(options_.schema));
  // Protocol 2 (PostgreSQL 14) is the first that streams transactions in progress.
  const bool streaming =
      options_.stream_in_progress && PQserverVersion((*session)->raw()) >= 140000;
  const std::string stream_options =
      std::string(streaming ? "proto_version '2', streaming 'on'" : "proto_version '1'") +
      ", publication_names " + string_literal(publications) + ", messages 'true'";
  // Postgres starts at max(this, the slot's confirmed position); what the log already holds is
  // skipped there, and by commit LSN below for anything the slot had not been told.
  auto stream = ReplicationStream::start(std::move(*session), options_.slot, log_.last_end_lsn(),
                                         stream_options);
  if (!stream.ok()) return stream.error();
  stream_ = std::move(*stream);
  pgoutput::DecoderOptions decoding;
  decoding.protocol_version = streaming ? 2 : 1;
  decoder_.emplace(decoding);
  appended_end_ = log_.last_end_lsn();
  reported_ = Lsn();
  last_status_ = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  if (connected_before_) ++stats_.reconnects;
  connected_before_ = true;
  return {};
}

void NativeCapture::run() {
  auto backoff = options_.reconnect_min;
  while (!stopping_) {
    if (!stream_) {
      if (auto st = connect(); !st.ok()) {
        note_error(st.error());
        reset_stream();
        sleep_interruptibly(backoff);
        backoff = std::min(backoff * 2, options_.reconnect_max);
        continue;
      }
    }
    auto st = reads_on_loop() ? read_on_loop() : pump();
    if (stopping_) break;
    if (st.ok()) {
      backoff = options_.reconnect_min;
      continue;
    }
    note_error(st.error());
    reset_stream();
    sleep_interruptibly(backoff);
    backoff = std::min(backoff * 2, options_.reconnect_max);
  }
  reset_stream();
}

void NativeCapture::run_mirror() {
  std::unique_ptr<PgSession> session;
  CatalogWatch watch;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, options_.mirror_interval, [&] { return stopping_.load(); });
    if (stopping_) break;
    lock.unlock();
    if (!session || !session->connection_ok()) {
      auto connected = PgSession::connect(options_.conninfo);
      if (connected.ok()) {
        session = std::move(*connected);
      } else {
        note_error(connected.error());
      }
    }
    if (session) {
      if (auto mirrored = mirror_publications(*session, options_.schema, &watch); !mirrored.ok()) {
        note_error(mirrored.error());
        if (!session->connection_ok()) session.reset();
      }
    }
    lock.lock();
    stats_.catalog_mirrors = watch.checks();
  }
}

// With nothing pending the socket is waited on this long at a time, so that progress is
// reported and the read position noted while the upstream is quiet.
constexpr auto kQuietTick = std::chrono::milliseconds(100);
// Frames one turn on the loop takes in before the loop's other work (walsenders) goes on.
constexpr int kFramesPerTurn = 1024;

Status NativeCapture::pump() {
  while (!stopping_) {
    const bool waiting = pending_.empty() && !pending_barrier_.is_valid();
    auto frame = stream_->read(waiting ? kQuietTick : std::chrono::milliseconds(0));
    if (!frame.ok()) return frame.error();
    if (std::holds_alternative<NoFrame>(*frame)) {
      PGRELAY_TRY(on_quiet());
      continue;
    }
    PGRELAY_TRY(take(*frame));
  }
  return {};
}

Status NativeCapture::read_on_loop() {
  {
    std::lock_guard lock(mu_);
    loop_done_ = false;
    loop_status_ = {};
  }
  {
    std::lock_guard gate(gate_->mu);
    gate_->owner = this;
  }
  Status watching = options_.loop->watch(stream_->socket(), kQuietTick, [gate = gate_] {
    std::lock_guard lock(gate->mu);
    if (gate->owner == nullptr) return ReadingLoop::Next::kStop;
    return gate->owner->loop_turn();
  });
  if (watching.ok()) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return loop_done_ || left_loop_ || stopping_.load(); });
  }
  // Take the stream back: a turn in progress ends first, and later ones touch nothing.
  {
    std::lock_guard gate(gate_->mu);
    gate_->owner = nullptr;
  }
  if (!watching.ok()) return watching;
  Status status;
  {
    std::lock_guard lock(mu_);
    // Left the loop, stream intact: this thread reads on (run() calls pump() next).
    if (!loop_done_ && !stopping_) return {};
    status = loop_status_;
  }
  // It goes now (an error, or stop()): the loop's duplicate of the socket would keep the
  // connection, and the upstream walsender holding the slot, until the loop's next turn.
  stream_->shut_down();
  return status;
}

ReadingLoop::Next NativeCapture::loop_turn() {
  bool more = false;
  Status status = stopping_ ? Status{} : take_in_available(&more);
  if (status.ok() && !stopping_) return more ? ReadingLoop::Next::kAgain : ReadingLoop::Next::kWait;
  gate_->owner = nullptr;  // the caller holds the gate's mutex
  {
    std::lock_guard lock(mu_);
    loop_done_ = true;
    loop_status_ = std::move(status);
  }
  cv_.notify_all();
  return ReadingLoop::Next::kStop;
}

Status NativeCapture::take_in_available(bool* more) {
  // One read per turn: the loop's wait for readiness that follows reports at once what is
  // still unread (a wait on a ready descriptor completes), so reading on until the socket says
  // "empty" would only cost a failing read per turn.
  PGRELAY_TRY(stream_->take_in());
  for (int frames = 0;;) {
    auto frame = stream_->read(std::chrono::milliseconds(0));
    if (!frame.ok()) return frame.error();
    if (std::holds_alternative<NoFrame>(*frame)) break;
    PGRELAY_TRY(take(*frame));
    if (++frames == kFramesPerTurn) {
      *more = true;  // what libpq holds already: no readiness would tell of it
      return {};
    }
  }
  return on_quiet();
}

Status NativeCapture::on_quiet() {
  if (!pending_.empty() || pending_barrier_.is_valid()) PGRELAY_TRY(flush_pending());
  PGRELAY_TRY(maybe_report_progress());
  maybe_note_read_through();
  return {};
}

Status NativeCapture::take(const StreamFrame& frame) {
  if (const auto* data = std::get_if<wire::XLogData>(&frame)) {
    PGRELAY_TRY(handle(*data));
    if (pending_bytes_ >= options_.batch_bytes) PGRELAY_TRY(flush_pending());
    return {};
  }
  const auto& keepalive = std::get<wire::PrimaryKeepalive>(frame);
  // Outside a transaction the walsender has sent every commit before its position: once what
  // is pending is durable, the slot may move there (past WAL no publication needs).
  bool advanced = false;
  if (!builder_->in_transaction() && keepalive.wal_end > stream_position_) {
    stream_position_ = keepalive.wal_end;
    advanced = true;
  }
  // An idle walsender sends a keepalive when the slot lags what it has decoded; answering at
  // once lets the slot (and the upstream's WAL retention) follow without waiting for
  // status_interval.
  if (keepalive.reply_requested || (advanced && pending_.empty())) {
    PGRELAY_TRY(flush_pending());
    PGRELAY_TRY(report_progress());
  }
  if (advanced) maybe_note_read_through();
  return {};
}

// Walsenders report the position in keepalives, as Postgres's report the WAL they decoded
// (pg_recvlogical --endpos waits for one): each note wakes every walsender of the database, so
// at most one per kReadThroughEvery; the quiet tick (kQuietTick) gives the last one.
constexpr auto kReadThroughEvery = std::chrono::milliseconds(100);

void NativeCapture::maybe_note_read_through() {
  if (builder_->in_transaction() || !pending_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_read_through_ < kReadThroughEvery) return;
  last_read_through_ = now;
  log_.note_read_through(stream_position_);
}

void NativeCapture::stamp_received(const wire::XLogData& data, Lsn end) {
  HopTrace* trace = log_.options().hop_trace;
  if (trace == nullptr) return;
  trace->stamp(Hop::kUpstreamSend, end.value(), wire::pg_to_unix_micros(data.send_time));
  trace->stamp(Hop::kCaptureReceipt, end.value());
}

Status NativeCapture::handle(const wire::XLogData& data) {
  auto decoded = decoder_->decode(data.data);
  if (!decoded.ok()) return decoded.error();
  const Lsn last_commit =
      pending_.empty() ? log_.last_commit_lsn() : pending_.back().meta.commit_lsn;
  auto streamed = handle_streamed(data, *decoded, last_commit);
  if (!streamed.ok() || *streamed) return streamed.ok() ? Status{} : Status(streamed.error());
  return std::visit(
      [&](auto& m) -> Status {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Begin>) {
          open_header_ = log::TransactionHeader{};
          open_header_.begin_lsn = data.wal_start;
          open_header_.commit_lsn = m.final_lsn;
          open_header_.commit_time = m.commit_time;
          open_header_.xid = m.xid;
          open_rows_ = 0;
          return builder_->begin(open_header_);
        } else if constexpr (std::is_same_v<T, pgoutput::Origin>) {
          open_header_.origin = m.name;
          open_header_.origin_lsn = m.origin_lsn;
          builder_->set_origin(m.name, m.origin_lsn);
          return {};
        } else if constexpr (std::is_same_v<T, pgoutput::Relation> ||
                             std::is_same_v<T, pgoutput::Type>) {
          catalog_.put(std::move(m));
          return {};
        } else if constexpr (std::is_same_v<T, pgoutput::Insert> ||
                             std::is_same_v<T, pgoutput::Update> ||
                             std::is_same_v<T, pgoutput::Delete> ||
                             std::is_same_v<T, pgoutput::Truncate>) {
          ++open_rows_;
          return builder_->add(data.wal_start, std::move(m));
        } else if constexpr (std::is_same_v<T, pgoutput::LogicalMessage>) {
          if (m.transactional) return builder_->add(data.wal_start, std::move(m));
          if (m.prefix == kBarrierPrefix) {
            pending_barrier_ = std::max(pending_barrier_, m.lsn);
            return {};
          }
          // pgoutput gives a message the end of its WAL record, which is where the next record
          // starts: often the commit of the transaction that emitted it, at the same LSN. The
          // log orders by a strictly increasing key, so the message takes the byte before: the
          // restart rule then skips it exactly when Postgres's does (by the record's start), as
          // a start point is never inside a record.
          const Lsn key = Lsn(m.lsn.value() - 1);
          if (key <= last_commit) return {};  // already in the log
          log::TransactionHeader header;
          header.begin_lsn = header.commit_lsn = key;
          header.end_lsn = m.lsn;
          header.commit_time = data.send_time;
          const Lsn at = m.lsn;
          auto entry = log::build_message_entry(header, at, std::move(m));
          if (!entry.ok()) return entry.error();
          queue(std::move(*entry), 0, false);
          return {};
        } else if constexpr (std::is_same_v<T, pgoutput::Commit>) {
          auto entry = builder_->finish();
          if (!entry.ok()) return entry.error();
          if (m.commit_lsn != open_header_.commit_lsn) {
            return Error::make(sqlstate::kProtocolViolation,
                               "upstream Commit LSN " + m.commit_lsn.to_string() +
                                   " differs from its Begin's " +
                                   open_header_.commit_lsn.to_string());
          }
          if (m.commit_lsn <= last_commit) return {};  // already in the log
          entry->meta.end_lsn = m.end_lsn;
          entry->meta.commit_time = m.commit_time;
          entry->meta.origin = open_header_.origin;
          entry->meta.origin_lsn = open_header_.origin_lsn;
          queue(std::move(*entry), open_rows_, false);
          stamp_received(data, m.end_lsn);
          return {};
        } else {
          return Error::make(sqlstate::kProtocolViolation,
                             "unexpected pgoutput message from the upstream slot",
                             "Native capture asks for protocol 1 or 2 without two-phase; "
                             "report this as a bug.");
        }
      },
      *decoded);
}

Result<bool> NativeCapture::handle_streamed(const wire::XLogData& data, pgoutput::Message& message,
                                            Lsn last_commit) {
  auto protocol_error = [](std::string what) {
    return Error::make(sqlstate::kProtocolViolation, "upstream stream: " + std::move(what),
                       "Native capture reconnects and the upstream streams it again.");
  };
  if (auto* start = std::get_if<pgoutput::StreamStart>(&message)) {
    auto& t = streamed_[start->xid];
    if (!t) {
      if (!start->first_segment) {
        streamed_.erase(start->xid);
        return protocol_error("a later block of transaction " + std::to_string(start->xid) +
                              " came before its first");
      }
      t = std::make_unique<StreamedTransaction>();
      log::BuilderOptions options;
      options.spill_dir = options_.spill_dir;
      t->builder = std::make_unique<log::TransactionBuilder>(t->catalog, options);
      log::TransactionHeader header;
      header.begin_lsn = data.wal_start;  // the block's first change
      header.xid = start->xid;
      PGRELAY_TRY(t->builder->begin(header));
      if (options_.in_progress != nullptr) {
        t->visible = options_.in_progress->open(start->xid, data.wal_start);
      }
    }
    stream_xid_ = start->xid;
    in_stream_ = t.get();
    return true;
  }
  if (std::holds_alternative<pgoutput::StreamStop>(message)) {
    in_stream_ = nullptr;
    return true;
  }
  if (auto* commit = std::get_if<pgoutput::StreamCommit>(&message)) {
    auto it = streamed_.find(commit->xid);
    if (it == streamed_.end()) {
      return protocol_error("Stream Commit of transaction " + std::to_string(commit->xid) +
                            ", which it never streamed");
    }
    std::unique_ptr<StreamedTransaction> t = std::move(it->second);
    streamed_.erase(it);
    // pgoutput counts what it sent in the blocks as sent once they commit, and does not send it
    // again before the next change of schema: later transactions are built with it.
    for (pgoutput::Oid oid : t->sent_types) catalog_.put(*t->catalog.type(oid));
    for (pgoutput::Oid oid : t->sent_relations) catalog_.put(*t->catalog.relation(oid));
    if (commit->commit_lsn <= last_commit) return true;  // already in the log
    auto entry = t->builder->finish(commit->commit_lsn, commit->end_lsn);
    if (!entry.ok()) return entry.error();
    entry->meta.commit_time = commit->commit_time;
    // Walsenders that streamed it find it in the log next, at these LSNs.
    t->visible.finish(
        {entry->data_size(), commit->commit_lsn, commit->end_lsn, commit->commit_time});
    queue(std::move(*entry), t->rows, true);
    stamp_received(data, commit->end_lsn);
    return true;
  }
  if (auto* abort = std::get_if<pgoutput::StreamAbort>(&message)) {
    auto it = streamed_.find(abort->xid);
    if (it == streamed_.end()) return true;  // nothing of it was streamed
    if (abort->subxid == abort->xid || abort->subxid == 0) {
      streamed_.erase(it);  // its builder drops the spill file
      return true;
    }
    StreamedTransaction& t = *it->second;
    for (std::size_t i = 0; i < t.subtransactions.size(); ++i) {
      if (t.subtransactions[i].xid != abort->subxid) continue;
      // Readers are told before the file is cut.
      t.visible.rewind(t.subtransactions[i].mark.size, abort->subxid);
      PGRELAY_TRY(t.builder->rewind(t.subtransactions[i].mark));
      PGRELAY_TRY(t.visible.show(*t.builder));
      t.rows = t.subtransactions[i].rows;
      t.subtransactions.resize(i);
      break;
    }
    return true;  // a subtransaction that changed nothing has no mark
  }
  if (in_stream_ == nullptr) return false;
  // A non-transactional message is sent as it is decoded, never as part of a transaction.
  if (auto* message_of = std::get_if<pgoutput::LogicalMessage>(&message);
      message_of != nullptr && !message_of->transactional) {
    return false;
  }
  StreamedTransaction& t = *in_stream_;
  return std::visit(
      [&](auto& m) -> Result<bool> {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Relation> || std::is_same_v<T, pgoutput::Type>) {
          // Private to the transaction until it commits: pgoutput sends it again to the others.
          auto& sent = std::is_same_v<T, pgoutput::Relation> ? t.sent_relations : t.sent_types;
          if (std::find(sent.begin(), sent.end(), m.oid) == sent.end()) sent.push_back(m.oid);
          t.catalog.put(std::move(m));
          return true;
        } else if constexpr (std::is_same_v<T, pgoutput::Origin>) {
          // pgoutput_stream_start sends the origin of a transaction replicated into the
          // upstream inside its first block.
          t.builder->set_origin(m.name, m.origin_lsn);
          t.visible.set_origin(m.name);
          return true;
        } else if constexpr (std::is_same_v<T, pgoutput::Insert> ||
                             std::is_same_v<T, pgoutput::Update> ||
                             std::is_same_v<T, pgoutput::Delete> ||
                             std::is_same_v<T, pgoutput::Truncate> ||
                             std::is_same_v<T, pgoutput::LogicalMessage>) {
          const pgoutput::Xid xid = m.xid.value_or(stream_xid_);
          if (xid != stream_xid_ && std::none_of(t.subtransactions.begin(), t.subtransactions.end(),
                                                 [&](const auto& sub) { return sub.xid == xid; })) {
            t.subtransactions.push_back({xid, t.builder->mark(), t.rows});
          }
          if constexpr (!std::is_same_v<T, pgoutput::LogicalMessage>) {
            ++t.rows;
            // pgoutput sends a table's Relation in each streamed transaction before its first
            // change there; one it did not is the one sent before, outside.
            std::vector<pgoutput::Oid> oids;
            if constexpr (std::is_same_v<T, pgoutput::Truncate>) {
              oids = m.relation_oids;
            } else {
              oids.push_back(m.relation_oid);
            }
            for (pgoutput::Oid oid : oids) {
              if (t.catalog.relation(oid) != nullptr) continue;
              if (const pgoutput::Relation* known = catalog_.relation(oid)) t.catalog.put(*known);
            }
          }
          t.visible.note_xid(t.builder->encoded_size(), xid);
          PGRELAY_TRY(t.builder->add(data.wal_start, std::move(m)));
          PGRELAY_TRY(t.visible.show(*t.builder));
          return true;
        } else {
          return protocol_error("a message that has no place inside a stream block");
        }
      },
      message);
}

void NativeCapture::queue(log::BuiltEntry entry, std::uint64_t rows, bool streamed) {
  pending_bytes_ += entry.data_size();
  pending_rows_ += rows;
  if (streamed) ++pending_streamed_;
  pending_.push_back(std::move(entry));
}

Status NativeCapture::flush_pending() {
  if (!pending_.empty()) {
    std::vector<log::PendingEntry> batch;
    batch.reserve(pending_.size());
    for (const auto& e : pending_) batch.push_back(e.pending());
    // Readers get the batch without waiting for its fdatasync: should a crash lose it, the
    // slot, confirmed only up to what is durable, streams it again at the same LSNs.
    PGRELAY_TRY(log_.append_visible(batch));
    appended_end_ = pending_.back().meta.end_lsn;
    std::lock_guard lock(mu_);
    ++stats_.batches;
    stats_.transactions += pending_.size();
    stats_.rows += pending_rows_;
    stats_.streamed += pending_streamed_;
    stats_.last_lsn = pending_.back().meta.commit_lsn;
    if (auto committed = log::last_commit_time(pending_)) {
      stats_.last_commit_time = *committed;
      stats_.last_appended_at = wire::to_pg_timestamp(std::chrono::system_clock::now());
    }
  }
  pending_.clear();
  pending_bytes_ = 0;
  pending_rows_ = 0;
  pending_streamed_ = 0;
  if (pending_barrier_.is_valid()) {
    {
      std::lock_guard lock(mu_);
      barrier_reached_ = std::max(barrier_reached_, pending_barrier_);
    }
    cv_.notify_all();
    pending_barrier_ = Lsn();
  }
  return {};
}

Status NativeCapture::maybe_report_progress() {
  const auto since = std::chrono::steady_clock::now() - last_status_;
  if (since >= options_.status_interval ||
      (since >= options_.report_gap && log_.durable_end_lsn() > reported_)) {
    return report_progress();
  }
  return {};
}

Status NativeCapture::report_progress() {
  // Only what the log made durable is released upstream; a keepalive's position only once
  // everything read before it is.
  Lsn confirmed = log_.durable_end_lsn();
  if (confirmed >= appended_end_ && pending_.empty())
    confirmed = std::max(confirmed, stream_position_);
  PGRELAY_TRY(stream_->send_status(confirmed, confirmed));
  last_status_ = std::chrono::steady_clock::now();
  reported_ = confirmed;
  std::lock_guard lock(mu_);
  stats_.confirmed_lsn = confirmed;
  return {};
}

void NativeCapture::reset_stream() {
  stream_.reset();
  decoder_.reset();
  if (builder_) builder_->abort();
  streamed_.clear();
  in_stream_ = nullptr;
  pending_.clear();
  pending_bytes_ = 0;
  pending_rows_ = 0;
  pending_streamed_ = 0;
  pending_barrier_ = Lsn();
  stream_position_ = Lsn();
}

void NativeCapture::note_error(const Error& error) {
  {
    std::lock_guard lock(mu_);
    if (stats_.last_error == error.message) return;
    stats_.last_error = error.message;
  }
  if (options_.logger != nullptr) {
    options_.logger->warning("native capture: " + error.message + "; retrying",
                             {{"sqlstate", error.sqlstate}, {"hint", error.hint}});
  }
}

void NativeCapture::sleep_interruptibly(std::chrono::milliseconds duration) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, duration, [&] { return stopping_.load(); });
}

Result<Lsn> NativeCapture::sync() {
  auto session = PgSession::connect(options_.conninfo);
  if (!session.ok()) return session.error();
  // A slot created right after its publication must see that publication's tables captured
  // from its consistent point on, without waiting for the mirror's interval.
  auto mirrored = mirror_publications(**session, options_.schema);
  if (!mirrored.ok()) return mirrored.error();
  // A walsender sends only WAL that is flushed, and a message written outside a transaction
  // with an xid waits for the WAL writer (wal_writer_delay, 200 ms by default) to be flushed.
  // The barrier is written inside a transaction that takes an xid, whose commit flushes it
  // (the transaction itself publishes nothing, so pgoutput sends nothing of it).
  PGRELAY_TRY((*session)->run("BEGIN; SELECT pg_catalog.pg_current_xact_id()"));
  auto emitted = (*session)->exec(
      "SELECT pg_catalog.pg_logical_emit_message(false, $1::text, ''::text)", {kBarrierPrefix});
  if (!emitted.ok()) return emitted.error();
  PGRELAY_TRY((*session)->run("COMMIT"));
  auto barrier = lsn_of(emitted->value(0, 0), "barrier LSN");
  if (!barrier.ok()) return barrier.error();
  std::unique_lock lock(mu_);
  const bool reached = cv_.wait_for(lock, options_.sync_timeout, [&] {
    return barrier_reached_ >= *barrier || stopping_.load();
  });
  if (!reached || barrier_reached_ < *barrier) {
    return Error::make(
        sqlstate::kObjectNotInPrerequisiteState,
        "native capture did not reach upstream position " + barrier->to_string() + " in time",
        "Check that pgrelay can reach the upstream; `pgrelay status` shows the "
        "capture's last error.",
        stats_.last_error.empty() ? "" : "last capture error: " + stats_.last_error);
  }
  return *barrier;
}

Result<ExportedSnapshot> NativeCapture::export_snapshot() {
  {
    // Tables of a publication created just before must be captured from before the snapshot
    // (sync() mirrors again, after the consistent point: too late for this).
    auto session = PgSession::connect(options_.conninfo);
    if (!session.ok()) return session.error();
    auto mirrored = mirror_publications(**session, options_.schema);
    if (!mirrored.ok()) return mirrored.error();
  }
  auto holder = PgSession::connect_replication(options_.conninfo);
  if (!holder.ok()) return holder.error();
  const std::string temp_slot = options_.slot + "_export_" + std::to_string(++exports_);
  auto created = (*holder)->exec("CREATE_REPLICATION_SLOT " + temp_slot +
                                 " TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')");
  if (!created.ok()) return created.error();
  if (created->rows() != 1 || created->columns() < 3 || created->is_null(0, 2)) {
    return Error::make(sqlstate::kProtocolViolation,
                       "CREATE_REPLICATION_SLOT returned no snapshot upstream");
  }
  auto point = lsn_of(created->value(0, 1), "consistent point");
  if (!point.ok()) return point.error();
  ExportedSnapshot out;
  out.snapshot_name = std::string(created->value(0, 2));
  out.consistent_point = *point;
  // The barrier comes after the consistent point in the WAL: once it is read, every
  // transaction the snapshot sees is durable in the log.
  auto synced = sync();
  if (!synced.ok()) return synced.error();
  out.holder = std::move(*holder);
  return out;
}

NativeCapture::Stats NativeCapture::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace pgrelay::capture
