// Streams a slot's changes from the log to one consumer, as Postgres's logical walsender does.
//
// Two coroutines share the session: the sender below reads the log and writes frames; a reader
// handles what the consumer sends (standby status, CopyDone). They meet in WalsenderState and
// the sender's WakeSignal, which the reader, the log (through the hub) and pg_terminate_backend
// use to wake it.
#include "server/walsender.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "base/hop_trace.h"
#include "pgoutput/encoder.h"
#include "server/binary_values.h"
#include "server/blocking.h"
#include "server/command_result.h"
#include "server/entry_encoder.h"
#include "server/entry_source.h"
#include "server/in_progress_streamer.h"
#include "server/wake_signal.h"
#include "wire/backend_messages.h"
#include "wire/replication_frames.h"

namespace pgrelay::server {
namespace {

using Clock = std::chrono::steady_clock;

// Flush the write buffer at this size so memory stays bounded however far behind a consumer is.
constexpr std::size_t kWriteChunk = 256 * 1024;
constexpr int kEntriesPerPass = 4096;

struct WalsenderState {
  explicit WalsenderState(asio::any_io_executor executor) : wake(executor) {}
  // Wakes the sender. The count tells the sender, before it sleeps, that something happened
  // since it last looked (while it was busy writing, say).
  void wake_up() {
    ++wakes;
    wake.wake();
  }
  WakeSignal wake;
  std::uint64_t wakes = 0;
  bool copy_done = false;        // the consumer sent CopyDone
  bool reply_requested = false;  // the consumer asked for a keepalive
  bool reader_finished = false;
  bool terminated = false;  // pg_terminate_backend
  bool stopping = false;    // server shutdown: send what is there, then CopyDone
  std::optional<Error> reader_error;
  Clock::time_point last_reply = Clock::now();
  Lsn write, flush, apply;
  std::int64_t reply_time = 0;
};

void append_copy_data(Bytes& out, const Bytes& payload) {
  wire::CopyData data{payload};
  Bytes frame = wire::encode(data);
  out.insert(out.end(), frame.begin(), frame.end());
}

void append_keepalive(Bytes& out, Lsn wal_end, bool reply_requested) {
  wire::PrimaryKeepalive k;
  k.wal_end = wal_end;
  k.send_time = wire::to_pg_timestamp(std::chrono::system_clock::now());
  k.reply_requested = reply_requested;
  append_copy_data(out, wire::encode(k));
}

// Handles the consumer's messages until CopyDone, Terminate, EOF or an error.
upstream::awaitable<void> read_consumer(upstream::MessageStream& client, ReplicationHub& hub,
                                        std::string slot, std::shared_ptr<WalsenderState> state) {
  for (;;) {
    auto frame = co_await client.read_frame();
    if (!frame.ok()) {
      state->reader_error = frame.error();
      break;
    }
    if (frame->tag == 'd') {
      auto parsed = wire::parse_from_client(frame->body);
      if (!parsed.ok()) {
        state->reader_error = parsed.error();
        break;
      }
      if (auto* status = std::get_if<wire::StandbyStatusUpdate>(&*parsed)) {
        state->last_reply = Clock::now();
        state->write = status->write;
        state->flush = status->flush;
        state->apply = status->apply;
        state->reply_time = status->send_time;
        // Only flush moves the slot, and only forward (the registry ignores older positions).
        if (status->flush.is_valid()) {
          auto confirmed = hub.slots().confirm(slot, status->flush);
          if (!confirmed.ok()) {
            state->reader_error = confirmed.error();
            break;
          }
        }
        // Wake the sender: to answer, or to show the new positions in pg_stat_replication.
        if (status->reply_requested) state->reply_requested = true;
        state->wake_up();
      } else {
        state->last_reply = Clock::now();  // hot standby feedback: alive, nothing to apply
      }
    } else if (frame->tag == 'c') {
      state->copy_done = true;
      break;
    } else if (frame->tag == 'X') {
      state->reader_error = Error::make("08006", "the consumer terminated the connection");
      break;
    } else {
      state->reader_error = Error::protocol("unexpected message type \"" +
                                            std::string(1, frame->tag) + "\" during COPY");
      break;
    }
  }
  state->reader_finished = true;
  state->wake_up();
}

// What one consumer already knows: pgoutput sends a Relation (with its Types) only when the
// session has not sent that relation yet or it changed, and so do we.
struct SessionRelations {
  std::unordered_map<pgoutput::Oid, Bytes> sent;  // relation OID -> its Relation message
  std::vector<std::size_t> pending_types;  // Types of the entry waiting for their Relation (rare)
};

// XLogData's send time, big-endian as framed. Postgres stamps each message as it sends it;
// messages that go out in one write share a stamp, taken again after anything that waits.
struct SendTime {
  std::uint8_t bytes[8];
  SendTime() { stamp(); }
  void stamp() {
    store_be(bytes,
             static_cast<std::uint64_t>(wire::to_pg_timestamp(std::chrono::system_clock::now())));
  }
};

// Appends one framed message, stamped with this send's time.
void append_frame(Bytes& out, const EncodedEntry& entry, const EncodedEntry::Message& m,
                  const SendTime& send_time) {
  const std::size_t at = out.size();
  const auto begin = entry.frames.begin() + m.offset;
  out.insert(out.end(), begin, begin + m.size);
  std::memcpy(out.data() + at + EncodedEntry::kSendTimeOffset, send_time.bytes,
              sizeof send_time.bytes);
}

// Appends the entry's messages from `from` on, except what the consumer already knows, until
// `out` reaches kWriteChunk; returns where it stopped. Runs once per message per consumer: a
// copy of bytes framed once, and the send time.
std::size_t emit(const EncodedEntry& entry, std::size_t from, SessionRelations& relations,
                 const SendTime& send_time, Bytes& out) {
  std::size_t i = from;
  while (i < entry.messages.size()) {
    const EncodedEntry::Message& m = entry.messages[i++];
    if (m.tag == 'Y') {
      relations.pending_types.push_back(i - 1);
      continue;
    }
    if (m.tag == 'R') {
      const ByteView payload = entry.payload(m);
      auto known = relations.sent.find(m.oid);
      if (known != relations.sent.end() &&
          std::equal(known->second.begin(), known->second.end(), payload.begin(), payload.end())) {
        relations.pending_types.clear();
        continue;
      }
      relations.sent[m.oid] = Bytes(payload.begin(), payload.end());
    }
    for (std::size_t type : relations.pending_types) {
      append_frame(out, entry, entry.messages[type], send_time);
    }
    relations.pending_types.clear();
    append_frame(out, entry, m, send_time);
    if (out.size() >= kWriteChunk) break;
  }
  return i;
}

// The view a session sends through, and its use of that view in the encoded-entry cache.
struct SessionView {
  log::ChangeView view;
  EncodedEntryCache::ViewUse use;
  std::uint64_t id() const { return use.id(); }
};

// Binary mode converts an entry's values a batch of messages at a time (one upstream round trip
// per batch, most transactions being one batch); the bounds keep a huge transaction's memory
// bounded.
constexpr std::size_t kBinaryBatchMessages = 4096;
constexpr std::size_t kBinaryBatchBytes = 1u << 20;

std::size_t value_bytes(const pgoutput::Tuple& tuple) {
  std::size_t n = 0;
  for (const auto& v : tuple.columns) n += v.bytes.size();
  return n;
}

std::size_t value_bytes(const pgoutput::Message& m) {
  if (auto* i = std::get_if<pgoutput::Insert>(&m)) return value_bytes(i->new_tuple);
  if (auto* u = std::get_if<pgoutput::Update>(&m)) {
    return value_bytes(u->new_tuple) + (u->old ? value_bytes(u->old->tuple) : 0);
  }
  if (auto* d = std::get_if<pgoutput::Delete>(&m)) return value_bytes(d->old.tuple);
  return 0;
}

// How long a stream waits for an upstream that restarts or fails over (its connections go with
// it for a while) before its session ends with the upstream's error, where it reads from the
// upstream: converting values for binary mode, reading publications where they changed. Both
// are read-only, and a retried conversion converts only what is left.
constexpr auto kUpstreamOutageWait = std::chrono::seconds(30);

bool upstream_unavailable(const Error& e) {
  // Connection exceptions, and a server shutting down, crashed or not accepting connections yet.
  return e.sqlstate.starts_with("08") || e.sqlstate == "57P01" || e.sqlstate == "57P02" ||
         e.sqlstate == "57P03";
}

// co_await attempt() until it succeeds or fails otherwise than by the upstream being
// unavailable, backing off from 50 ms to 1 s, for up to kUpstreamOutageWait; then its error,
// with a hint saying that pgrelay was `doing` meanwhile.
template <typename Attempt>
upstream::awaitable<Status> through_upstream_outage(Attempt attempt, std::string_view doing) {
  const auto deadline = std::chrono::steady_clock::now() + kUpstreamOutageWait;
  auto backoff = std::chrono::milliseconds(50);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (;;) {
    Status done = co_await attempt();
    if (done.ok() || !upstream_unavailable(done.error())) co_return done;
    if (std::chrono::steady_clock::now() + backoff > deadline) {
      Error e = done.error();
      e.hint = "The upstream was unreachable for " + std::to_string(kUpstreamOutageWait.count()) +
               " s while pgrelay " + std::string(doing) +
               "; connect again once it is back (the stream resumes from the slot's confirmed "
               "position).";
      co_return e;
    }
    timer.expires_after(backoff);
    co_await timer.async_wait(upstream::kAsTuple);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

// Where capture marked a change of the publications: go on with what they say after it, every
// Relation sent again (as pgoutput does after an invalidation).
upstream::awaitable<Status> reload_view(const WalsenderParams& params, SessionView& session_view,
                                        SessionRelations& relations,
                                        const log::PublicationsChange& change) {
  std::optional<WalsenderView> reloaded;
  PGRELAY_CO_TRY(co_await through_upstream_outage(
      [&]() -> upstream::awaitable<Status> {
        auto read = co_await params.reload_view(change);
        if (!read.ok()) co_return read.error();
        reloaded = std::move(*read);
        co_return Status{};
      },
      "read the publications where they changed"));
  session_view.view.replace_options(std::move(reloaded->options));
  session_view.use.switch_to(reloaded->key);
  relations.sent.clear();
  co_return Status{};
}

// Replaces the text values of `batch` by their binary form, through the upstream on the
// blocking pool (the io thread goes on with other sessions meanwhile).
upstream::awaitable<Status> convert_to_binary(ReplicationHub& hub, const std::string& conninfo,
                                              std::vector<PendingMessage>& batch,
                                              RelationTypes& types) {
  std::vector<pgoutput::Message*> messages;
  messages.reserve(batch.size());
  for (auto& m : batch) messages.push_back(&m.message);
  auto values = collect_text_values(messages, types);
  if (!values.ok()) co_return values.error();
  if (values->empty()) co_return Status{};
  co_return co_await through_upstream_outage(
      [&] {
        return run_blocking(hub.blocking(),
                            [&] { return hub.binary_converter().convert(conninfo, *values); });
      },
      "converted values for a stream in binary mode");
}

// While a session converts an entry, others with its view wait for the result (see
// ReplicationHub::converting); this ends the wait however the encoding ends.
class ConvertingEntry {
 public:
  ConvertingEntry(ReplicationHub& hub, std::uint64_t view_id, Lsn end_lsn)
      : hub_(hub), view_id_(view_id), end_lsn_(end_lsn) {
    hub_.begin_converting(view_id_, end_lsn_);
  }
  ~ConvertingEntry() { hub_.end_converting(view_id_, end_lsn_); }
  ConvertingEntry(const ConvertingEntry&) = delete;
  ConvertingEntry& operator=(const ConvertingEntry&) = delete;

 private:
  ReplicationHub& hub_;
  std::uint64_t view_id_;
  Lsn end_lsn_;
};

// Sends one log entry: from the shared cache when another session (or this one) encoded it
// through the same view (`cached`, when the entry source took it from there), else encoded
// here and kept for others (see the end). Frames collect in `out`, written whenever it
// passes kWriteChunk, and `produced` grows by their size; an entry larger than kMaxCachedEntry is
// streamed without being kept, so a huge transaction never sits in memory whole. A
// publications-changed marker reloads the view where it is (so a cached entry that had one was
// encoded through the view that followed it, and its reader reloads after it). In binary mode
// the values go through the upstream first (binary_values.h), a batch of messages at a time;
// a session that finds another converting the same entry for the same view waits for it (and
// so the converting session writes nothing to its consumer until the entry is cached, so that
// a slow consumer never holds the others up).
constexpr std::size_t kMaxCachedEntry = 4u << 20;

upstream::awaitable<Status> send_entry(upstream::MessageStream& client, ReplicationHub& hub,
                                       const WalsenderParams& params, SessionView& session_view,
                                       log::Cursor& cursor, const log::EntryMeta& meta,
                                       std::shared_ptr<const EncodedEntry> cached,
                                       SessionRelations& relations, SendTime& send_time, Bytes& out,
                                       std::size_t& produced) {
  const std::uint64_t entry_view_id = session_view.id();
  const bool binary = params.options.binary;
  if (!cached) cached = hub.encoded_cache().find(entry_view_id, meta.end_lsn);
  while (!cached && binary) {
    auto in_flight = hub.converting(entry_view_id, meta.end_lsn);
    if (!in_flight) break;
    co_await in_flight->async_wait(upstream::kAsTuple);
    cached = hub.encoded_cache().find(entry_view_id, meta.end_lsn);
    send_time.stamp();
  }
  if (cached) {
    for (std::size_t next = 0; next < cached->messages.size();) {
      const std::size_t before = out.size();
      next = emit(*cached, next, relations, send_time, out);
      produced += out.size() - before;
      if (out.size() >= kWriteChunk) {
        PGRELAY_CO_TRY(co_await client.write(out));
        out.clear();
        send_time.stamp();
      }
    }
    relations.pending_types.clear();
    if (cached->publications_changed && params.reload_view) {
      PGRELAY_CO_TRY(
          co_await reload_view(params, session_view, relations, cached->publications_change));
      send_time.stamp();
    }
    co_return Status{};
  }
  std::optional<ConvertingEntry> converting;
  if (binary) converting.emplace(hub, entry_view_id, meta.end_lsn);
  log::ChangeView& view = session_view.view;
  view.start(meta);
  EntryEncoder encoder(view, cursor, meta);
  auto built = std::make_shared<EncodedEntry>();
  bool cacheable = true;
  RelationTypes types;                // binary mode: column types, from the entry's Relations
  std::vector<PendingMessage> batch;  // text mode: one message at a time
  std::size_t batch_bytes = 0;
  for (;;) {
    auto next = encoder.next_message();
    // What the view refuses at a change (a publication error Postgres raises while decoding
    // it) ends the entry after the messages before that change, as pgoutput sends them: a
    // binary batch collected so far is converted and sent first.
    std::optional<Error> refused;
    if (!next.ok()) refused = next.error();
    const bool paused_or_done = refused.has_value() || !next->has_value();
    if (!paused_or_done) {
      if (binary) batch_bytes += value_bytes((*next)->message);
      batch.push_back(std::move(**next));
      if (binary && batch.size() < kBinaryBatchMessages && batch_bytes < kBinaryBatchBytes) {
        continue;
      }
    }
    if (binary && !batch.empty()) {
      PGRELAY_CO_TRY(co_await convert_to_binary(hub, params.binary_conninfo, batch, types));
      send_time.stamp();
    }
    for (auto& pending : batch) {
      const std::size_t before = out.size();
      built->add(EntryEncoder::encode(std::move(pending)));
      emit(*built, built->messages.size() - 1, relations, send_time, out);
      produced += out.size() - before;
      // Too large to keep: stream it, holding only what has not been written (a Type waiting
      // for its Relation refers to the entry, so that waits for the Relation). Sessions
      // waiting for this conversion then go and convert it themselves.
      if (built->bytes() > kMaxCachedEntry) {
        cacheable = false;
        converting.reset();
      }
      if (!cacheable && relations.pending_types.empty()) built->clear();
      // While others wait for this entry, nothing waits for this session's consumer: what
      // the entry adds to `out` (bounded by kMaxCachedEntry) is written after it is cached.
      if (out.size() >= kWriteChunk && !converting) {
        PGRELAY_CO_TRY(co_await client.write(out));
        out.clear();
        send_time.stamp();
      }
    }
    batch.clear();
    batch_bytes = 0;
    if (refused) co_return *refused;
    if (!paused_or_done) continue;
    if (!encoder.paused()) break;
    PGRELAY_CO_TRY(
        co_await reload_view(params, session_view, relations, view.publications_change()));
    send_time.stamp();
  }
  relations.pending_types.clear();
  // Kept for other sessions with this view to copy: when another uses it now, and in binary
  // mode always (a consumer starting after this one over the same entries would otherwise
  // convert them through the upstream again). A text-mode session alone on its view keeps
  // nothing: keeping cost more than encoding (one consumer's drain of a 30,000-entry backlog
  // took 1.5-2.4x as long with every entry kept).
  if (cacheable && (binary || hub.encoded_cache().shared(entry_view_id))) {
    built->publications_changed = view.publications_changed();
    built->publications_change = view.publications_change();
    hub.encoded_cache().insert(entry_view_id, meta.end_lsn, std::move(built));
  }
  co_return Status{};
}

// A stream that starts behind the log's end judges the changes before the first marker after
// its start by the publications as that marker found them, not as they are now (params.view,
// read at START_REPLICATION): a consumer catching up is sent what Postgres's walsender would
// have sent, decoding with the catalog of each change's time, a publication dropped since
// included. The log is read up to that marker on the blocking pool; without one (or without
// its catalog before, or when that catalog lacks a requested publication: one made after the
// slot, where Postgres 15 fails at the first change before it, and none may come) the view
// read now stays.
upstream::awaitable<Status> view_at_start(ReplicationHub& hub, WalsenderParams& params, Lsn start) {
  if (!params.reload_view || start > hub.log().last_end_lsn()) co_return Status{};
  auto first = co_await run_blocking(
      hub.blocking(), [&hub, start] { return log::first_publications_change(hub.log(), start); });
  if (!first.ok()) co_return first.error();
  if (!first->has_value() || !(*first)->before) co_return Status{};
  log::PublicationsChange at_start;
  at_start.after = (*first)->before;
  auto view = co_await params.reload_view(at_start);
  if (!view.ok()) co_return view.error();
  if (!view->options.refused) params.view = std::move(*view);
  co_return Status{};
}

// A consumer far behind (a new slot on a long log, or back after a while) takes time to catch
// up: say how far it is every params.progress_interval, and when it is done.
struct CatchUpProgress {
  Clock::time_point started;
  Clock::time_point last_report;
  bool reported = false;
};

void report_catch_up(CatchUpProgress& progress, const WalsenderParams& params, Lsn sent, Lsn head,
                     bool caught_up, Clock::time_point now) {
  if (params.logger == nullptr) return;
  if (caught_up) {
    if (progress.reported) {
      auto seconds = std::chrono::duration<double>(now - progress.started).count();
      params.logger->info("consumer caught up",
                          {{"slot", params.slot}, {"lsn", sent.to_string()}, {"seconds", seconds}});
      progress.reported = false;
    }
    progress.started = now;
    progress.last_report = now;
    return;
  }
  if (now - progress.last_report < params.progress_interval) return;
  progress.last_report = now;
  progress.reported = true;
  std::uint64_t behind = head.value() > sent.value() ? head.value() - sent.value() : 0;
  params.logger->info("consumer catching up", {{"slot", params.slot},
                                               {"sent_lsn", sent.to_string()},
                                               {"head_lsn", head.to_string()},
                                               {"behind_bytes", behind}});
}

}  // namespace

upstream::awaitable<Result<StreamEnd>> run_walsender(upstream::MessageStream& client,
                                                     ReplicationHub& hub, WalsenderParams params) {
  auto executor = co_await asio::this_coro::executor;
  auto slot = hub.slots().get(params.slot);
  if (!slot) {
    co_return Error::make(sqlstate::kUndefinedObject,
                          "replication slot \"" + params.slot + "\" does not exist");
  }
  Lsn start = std::max(params.requested_start, slot->confirmed_flush);
  PGRELAY_CO_TRY(co_await view_at_start(hub, params, start));
  // A publication missing where the stream starts too is refused at START_REPLICATION, where
  // a consumer learns of a misspelt name at once.
  if (params.view.options.refused) co_return *params.view.options.refused;
  SessionView session_view{log::ChangeView(params.view.options),
                           EncodedEntryCache::ViewUse(hub.encoded_cache(), params.view.key)};
  session_view.view.pause_at_publication_changes(params.reload_view != nullptr);
  auto cursor = hub.log().open_cursor(start);
  if (!cursor.ok()) co_return cursor.error();
  EntrySource source(hub.log(), std::move(*cursor), hub.encoded_cache());

  Bytes copy_both = wire::encode(wire::CopyBothResponse{});
  PGRELAY_CO_TRY(co_await client.write(copy_both));

  auto state = std::make_shared<WalsenderState>(executor);
  WalsenderInfo info = params.info;
  info.slot = params.slot;
  info.state = "catchup";
  info.sent = start;
  hub.add_walsender(
      info,
      [state] {
        state->terminated = true;
        state->wake_up();
      },
      [state] {
        state->stopping = true;
        state->wake_up();
      });
  hub.watch(&state->wake);
  asio::co_spawn(executor, read_consumer(client, hub, params.slot, state), asio::detached);

  SessionRelations relations;
  InProgressStreamer streamer(hub.in_progress(), params.options);
  Lsn sent = start;  // walEnd of keepalives: never beyond a commit not yet sent
  Lsn told;          // the furthest position the consumer has been sent (Commit end, walEnd)
  Clock::time_point last_ping = Clock::time_point::min();
  std::optional<Clock::time_point> nudged_at_reply;  // the consumer's reply a keepalive followed
  std::optional<Clock::time_point> stop_deadline;
  StreamEnd ended = StreamEnd::kConsumerDone;
  CatchUpProgress progress;
  progress.started = Clock::now();
  progress.last_report = progress.started;
  Bytes out;
  Status outcome;
  // `serve --hop-trace`: when this walsender read each entry (the time its pass began reading:
  // one stamp per pass, through the last entry it read, keeps the trace's cost off fan-out),
  // and when its Commit was written.
  HopTrace* trace = hub.log().options().hop_trace;
  const auto trace_session = static_cast<std::uint32_t>(info.pid);
  Lsn unwritten_commit;  // end of the newest entry in `out` not yet stamped as written
  for (;;) {
    // What woke the sender so far: a wake-up after this is looked at before it sleeps again.
    const std::uint64_t seen_wakes = state->wakes;
    const std::uint64_t seen_log_wakes = hub.wake_generation();
    if (state->terminated) {
      outcome = Error::make(sqlstate::kAdminShutdown,
                            "terminating connection due to administrator command");
      break;
    }
    if (state->copy_done || (state->reader_finished && !state->stopping)) break;
    // Read before the log is: what capture had read of the upstream when it said so is in the
    // log by then, so a pass that catches up has sent every commit before it.
    const Lsn read_through = hub.log().read_through();
    // Read what the log has, a chunk at a time: between chunks, the consumer's messages,
    // termination and progress are looked at even while a long backlog streams.
    bool caught_up = false;
    // Entries the view filters out produce nothing, hence the bound on entries as well.
    std::size_t produced = 0;
    SendTime send_time;
    std::int64_t pass_read_at = 0;  // with a trace: when this pass read its first entry
    Lsn pass_read_through;          // and the end of the last it read
    for (int scanned = 0; produced < kWriteChunk && scanned < kEntriesPerPass; ++scanned) {
      auto next = source.next(session_view.id());
      if (!next.ok()) {
        outcome = next.error();
        break;
      }
      if (!next->has_value()) {
        caught_up = true;
        break;
      }
      const log::EntryMeta& m = (*next)->meta;
      if (trace != nullptr && m.kind != log::EntryKind::kCheckpoint) {
        if (!pass_read_through.is_valid()) pass_read_at = unix_micros();
        pass_read_through = m.end_lsn;
      }
      if (m.kind == log::EntryKind::kCheckpoint || m.commit_lsn < start) {
        if (m.end_lsn > sent) sent = m.end_lsn;
        continue;
      }
      Status appended;
      bool whole = true;
      if (streamer.streamed(m, out)) {
        // Streamed while it was in progress: the rest of it, then Stream Commit.
        for (;;) {
          const std::size_t before = out.size();
          auto finished = streamer.finish(m, out, kWriteChunk, relations.sent);
          if (!finished.ok()) {
            appended = finished.error();
            break;
          }
          produced += out.size() - before;
          whole = *finished == InProgressStreamer::Finished::kSendWhole;
          if (whole) break;
          if (*finished == InProgressStreamer::Finished::kDone) break;
          if (auto written = co_await client.write(out); !written.ok()) {
            appended = written.error();
            break;
          }
          out.clear();
        }
      }
      streamer.end_block(out);
      if (appended.ok() && whole) {
        appended =
            co_await send_entry(client, hub, params, session_view, source.cursor(), m,
                                std::move((*next)->cached), relations, send_time, out, produced);
      }
      if (!appended.ok()) {
        outcome = appended.error();
        // What the view refuses to send (a publication error Postgres raises while decoding
        // the change), or a publication gone, reaches the consumer after what was sent before
        // it, as Postgres's ErrorResponse in COPY mode does.
        append_error(out, appended.error());
        append_ready(out);
        (void)co_await client.write(out);
        out.clear();
        break;
      }
      if (m.end_lsn > sent) sent = m.end_lsn;
      told = std::max(told, m.end_lsn);  // its Commit carries the entry's end
      unwritten_commit = m.end_lsn;
    }
    if (pass_read_through.is_valid()) {
      trace->stamp(Hop::kWalsenderRead, pass_read_through.value(), pass_read_at, trace_session);
    }
    if (!outcome.ok()) break;
    // Caught up with the log: transactions still in progress go out in stream blocks.
    bool more_streaming = false;
    if (caught_up && !state->stopping && streamer.enabled()) {
      auto streamed =
          streamer.stream(session_view.view.options(), session_view.id(), out, kWriteChunk);
      if (!streamed.ok()) {
        outcome = streamed.error();
        streamer.end_block(out);
        append_error(out, streamed.error());
        append_ready(out);
        (void)co_await client.write(out);
        out.clear();
        break;
      }
      more_streaming = *streamed;
    }
    // Caught up, nothing the log holds is unsent: keepalives may go as far as the newest
    // consistent point, or as far as capture has read the upstream, past which every later
    // commit lands.
    if (caught_up) sent = std::max({sent, hub.quiet_position(), read_through});
    auto now = Clock::now();
    report_catch_up(progress, params, sent, hub.log().last_end_lsn(), caught_up, now);
    bool ping = params.timeout.count() > 0 && now - state->last_reply >= params.timeout / 2 &&
                last_ping < state->last_reply;
    // As Postgres's WalSndWaitForWal: caught up while the consumer has reported neither writing
    // nor flushing what was sent, tell it where the stream is, once per reply of its. A table
    // sync worker waits for exactly this before it can finish.
    const bool nudge = caught_up && state->write < sent && state->flush < sent &&
                       nudged_at_reply != state->last_reply;
    // Caught up past what the stream has shown (entries the consumer never sees, such as
    // capture checkpoints, or the consistent point): a keepalive tells it, so that a consumer
    // waiting for a position (pg_recvlogical --endpos, a table sync) need not wait for a ping.
    const bool untold = caught_up && told < sent;
    if (state->reply_requested || ping || nudge || untold) {
      if (caught_up) nudged_at_reply = state->last_reply;
      told = sent;
      append_keepalive(out, sent, ping);
      state->reply_requested = false;
      if (ping) last_ping = now;
    }
    if (!out.empty()) {
      auto written = co_await client.write(out);
      out.clear();
      if (!written.ok()) {
        outcome = written.error();
        break;
      }
      if (trace != nullptr && unwritten_commit.is_valid()) {
        trace->stamp(Hop::kSocketWrite, unwritten_commit.value(), unix_micros(), trace_session);
        unwritten_commit = Lsn();
      }
      info.sent = sent;
      info.state = caught_up ? "streaming" : "catchup";
      info.write = state->write;
      info.flush = state->flush;
      info.replay = state->apply;
      info.reply_time = state->reply_time;
      hub.update_walsender(info);
    } else if (info.write != state->write || info.flush != state->flush ||
               info.replay != state->apply) {
      // A standby status came: pg_stat_replication shows it at once, as Postgres's does.
      info.write = state->write;
      info.flush = state->flush;
      info.replay = state->apply;
      info.reply_time = state->reply_time;
      hub.update_walsender(info);
    }
    if (!caught_up || more_streaming) continue;
    if (state->stopping) {
      // Shutdown, as Postgres's WalSndDone does it: once everything is sent, ask the consumer
      // to confirm it, then end the COPY with CommandComplete "COPY 0" and close. Waiting is
      // bounded here (Postgres waits up to wal_sender_timeout).
      if (!stop_deadline) {
        stop_deadline = now + std::chrono::seconds(2);
        Bytes confirm_request;
        streamer.end_block(confirm_request);
        append_keepalive(confirm_request, sent, true);
        (void)co_await client.write(confirm_request);
      }
      if (state->flush >= sent || now >= *stop_deadline || state->reader_finished) {
        Bytes done;
        append_command_complete(done, "COPY 0");
        (void)co_await client.write(done);
        ended = StreamEnd::kShutdown;
        break;
      }
      co_await state->wake.wait_until(Clock::now() + std::chrono::milliseconds(50));
      continue;
    }
    if (params.timeout.count() > 0 && now - state->last_reply >= params.timeout) {
      outcome = Error::make("08006", "terminating walsender process due to replication timeout",
                            "The consumer sent no standby status for wal_sender_timeout.");
      break;
    }
    // Woken while busy (the log grew, the consumer spoke or left): look again, do not sleep.
    if (state->wakes != seen_wakes || hub.wake_generation() != seen_log_wakes) continue;
    // Sleep until the log grows, the consumer speaks, or a keepalive falls due.
    auto deadline = params.timeout.count() > 0
                        ? state->last_reply +
                              (last_ping < state->last_reply ? params.timeout / 2 : params.timeout)
                        : now + std::chrono::hours(1);
    co_await state->wake.wait_until(std::max(deadline, now + std::chrono::milliseconds(1)));
  }
  hub.unwatch(&state->wake);
  hub.remove_walsender(info.pid);

  if (state->copy_done && outcome.ok() && ended == StreamEnd::kConsumerDone) {
    // The consumer ended the stream: answer CopyDone as Postgres does.
    Bytes copy_done = wire::encode(wire::CopyDone{});
    PGRELAY_CO_TRY(co_await client.write(copy_done));
    co_return StreamEnd::kConsumerDone;
  }
  // Ending for another reason: stop the reader before the session (and `client`) goes away.
  client.transport().close();
  while (!state->reader_finished) {
    co_await state->wake.wait_until(Clock::now() + std::chrono::milliseconds(10));
  }
  if (ended == StreamEnd::kShutdown) co_return StreamEnd::kShutdown;
  if (state->reader_error && outcome.ok()) co_return *state->reader_error;
  if (outcome.ok()) co_return Error::make("08006", "the consumer closed the connection");
  co_return outcome.error();
}

}  // namespace pgrelay::server
