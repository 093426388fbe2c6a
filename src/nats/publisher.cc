// Publishes one database's change log to a JetStream stream, exactly once and in commit order.
#include "nats/publisher.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/pg_time.h"
#include "log/file_util.h"
#include "log/slots.h"

namespace pgrelay::nats {

namespace {

// Room left in a message for its subject and headers when the log bytes are cut into parts.
constexpr std::int64_t kPartHeadroom = 4096;

std::string reason_of(const jsPubAckErr& error) {
  if (error.ErrCode == JSStreamWrongLastSequenceErr) return "wrong_last_sequence";
  if (error.ErrCode == JSStreamStoreFailedErr || error.ErrCode == JSStreamLimitsErr) {
    return "stream_full";
  }
  if (error.ErrCode == JSStreamMessageExceedsMaximumErr) return "message_too_large";
  if (error.Err == NATS_TIMEOUT) return "ack_timeout";
  if (error.Err == NATS_NO_RESPONDERS) return "no_responders";
  return "publish";
}

}  // namespace

Publisher::Publisher(PublisherOptions options, log::ChangeLog& log, Logger& logger)
    : options_(std::move(options)),
      log_(log),
      logger_(logger),
      subjects_(options_.subject_prefix, options_.database),
      log_id_(std::to_string(log.system_id())) {
  figures_.state = "stopped";
}

Publisher::~Publisher() {
  stop();
}

void Publisher::start() {
  set_state("connecting");
  thread_.start("nats-publish", [this] { run(); });
}

void Publisher::stop() {
  thread_.stop();
  set_state("stopped");
}

PublisherFigures Publisher::figures() const {
  PublisherFigures out;
  {
    std::lock_guard lock(mu_);
    out = figures_;
  }
  const wire::Lsn head = log_.last_end_lsn();
  const wire::Lsn from = out.published_end_lsn;
  out.lag_bytes = head.value() > from.value() ? head.value() - from.value() : 0;
  return out;
}

void Publisher::set_state(const char* state) {
  {
    std::lock_guard lock(mu_);
    if (figures_.state == state) return;
    figures_.state = state;
  }
  write_state(true);
}

void Publisher::write_state(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (options_.state_dir.empty()) return;
  {
    std::lock_guard lock(mu_);
    if (state_dirty_) force = true;
    state_dirty_ = false;
  }
  if (!force && now - state_written_ < std::chrono::seconds(1)) return;
  state_written_ = now;
  const PublisherFigures f = figures();
  nlohmann::json j = {{"stream", options_.stream},
                      {"servers", redact_urls(options_.connect.urls)},
                      {"subjects", subjects_.database_subjects()},
                      {"state", f.state},
                      {"published_commit_lsn", f.published_commit_lsn.to_string()},
                      {"published_end_lsn", f.published_end_lsn.to_string()},
                      {"published_messages", f.published_messages},
                      {"published_transactions", f.published_transactions},
                      {"last_error", f.last_error},
                      {"pid", static_cast<int>(::getpid())},
                      {"written_at", format_pg_time(log::now_pg_micros())}};
  const std::string text = j.dump() + "\n";
  // Only for `pgrelay status`: a failure to write it costs nothing else.
  (void)log::write_file_atomically(options_.state_dir, kStateFileName, as_bytes(text));
}

void Publisher::count_error(const std::string& reason, const std::string& text) {
  std::lock_guard lock(mu_);
  ++figures_.errors[reason];
  figures_.last_error = text;
}

void Publisher::report(const Error& error) {
  if (!news_.is_news(error.message)) return;
  logger_.log(LogLevel::kError, "NATS publishing interrupted, retrying: " + error.message,
              {{"stream", options_.stream},
               {"database", options_.database},
               {"detail", error.detail},
               {"hint", error.hint}});
}

void Publisher::run() {
  auto delay = options_.retry_min;
  while (!stopping()) {
    Status s = session();
    if (stopping()) break;
    if (!s.ok()) {
      count_error("connection", s.error().message);
      report(s.error());
    }
    set_state("retrying");
    thread_.pause(delay);
    // A session that published something starts the backoff over.
    delay = news_.any() ? std::min(delay * 2, options_.retry_max) : options_.retry_min;
  }
}

Status Publisher::session() {
  set_state("connecting");
  jsOptions js_options;
  jsOptions_Init(&js_options);
  js_options.PublishAsync.MaxPending = options_.max_pending;
  js_options.PublishAsync.AckHandler = &Publisher::on_ack;
  js_options.PublishAsync.AckHandlerClosure = this;
  js_options.PublishAsync.StallWait = 200;
  ConnectionEvents events;
  // On nats.c's thread: the state file follows from the publisher's own loop.
  events.disconnected = [this] {
    logger_.warning("NATS connection lost; reconnecting",
                    {{"servers", redact_urls(options_.connect.urls)}});
    std::lock_guard lock(mu_);
    figures_.state = "disconnected";
    state_dirty_ = true;
  };
  events.reconnected = [this] {
    logger_.info("NATS connection back", {});
    std::lock_guard lock(mu_);
    figures_.state = "publishing";
    state_dirty_ = true;
  };
  auto connection = Connection::open(options_.connect, &js_options, std::move(events));
  PGRELAY_TRY(connection);
  const std::string all = subjects_.all();
  auto check = ensure_stream(**connection, options_.stream, all, options_.connect);
  PGRELAY_TRY(check);
  if (!std::exchange(warned_, true)) {
    if (check->created) {
      logger_.info("created the JetStream stream", {{"stream", options_.stream},
                                                    {"subjects", all},
                                                    {"replicas", check->replicas},
                                                    {"storage", "file"},
                                                    {"duplicate_window", "2m"}});
    }
    for (const auto& w : check->warnings) {
      logger_.warning(w.message, {{"stream", options_.stream}, {"hint", w.hint}});
    }
  }
  std::uint64_t published_at_resync = 0;
  auto delay = options_.retry_min;
  for (;;) {
    auto end = read_stream_end(**connection, options_.stream, subjects_, log_.system_id(),
                               options_.connect);
    PGRELAY_TRY(end);
    broken_ = false;
    Status s = publish_from(**connection, *end);
    drain(**connection);
    if (stopping()) return {};
    PGRELAY_TRY(s);
    // An ack failed: go on from what the stream holds, after a pause that grows while no
    // transaction gets through (a full stream, a cluster without a leader).
    set_state("retrying");
    std::string cause;
    std::uint64_t published = 0;
    {
      std::lock_guard lock(mu_);
      cause = figures_.last_error;
      published = figures_.published_transactions;
    }
    delay = published != published_at_resync ? options_.retry_min
                                             : std::min(delay * 2, options_.retry_max);
    published_at_resync = published;
    const bool full = cause.find("maximum bytes") != std::string::npos ||
                      cause.find("maximum messages") != std::string::npos;
    report(Error::make(sqlstate::kConnectionFailure, "JetStream did not store a message: " + cause,
                       full ? "The stream " + options_.stream +
                                  " is full: raise its max bytes or max messages, or let it "
                                  "discard old messages (nats stream edit " +
                                  options_.stream + ")."
                            : "pgrelay goes on from the stream's end once JetStream takes "
                              "messages again."));
    thread_.pause(delay);
    if (stopping()) return {};
  }
}

Status Publisher::publish_from(const Connection& connection, const StreamEnd& end) {
  wire::Lsn start;
  std::optional<ResumePoint> partial;
  wire::Lsn previous;  // the commit LSN of the entry before the next one, when known
  {
    std::lock_guard lock(mu_);
    expected_last_seq_ = end.last_seq;
    in_flight_.clear();
  }
  if (end.resume) {
    if (end.resume->whole) {
      start = end.resume->commit_lsn + 1;
      previous = end.resume->commit_lsn;
      std::lock_guard lock(mu_);
      if (figures_.published_commit_lsn < end.resume->commit_lsn) {
        figures_.published_commit_lsn = end.resume->commit_lsn;
        figures_.published_end_lsn = end.resume->commit_lsn;  // its end is near enough for lag
      }
    } else {
      start = end.resume->commit_lsn;
      partial = end.resume;
      previous = end.resume->previous;
    }
  }
  auto cursor = log_.open_cursor(start);
  if (!cursor.ok()) {
    Error e = cursor.error();
    e.message = "the JetStream stream " + options_.stream +
                " ends before what the log still "
                "holds: transactions from " +
                start.to_string() + " to " + log_.removed_through().to_string() +
                " are missing from it (" + e.message + ")";
    e.hint =
        "They were removed from the log before they were published. Consumers of the "
        "stream miss them; a follower must be rebuilt from a new stream.";
    return e;
  }
  PGRELAY_TRY(publish_server_facts(connection));
  const std::int64_t max_payload = connection.max_payload();
  const std::size_t part_size =
      static_cast<std::size_t>(std::max<std::int64_t>(1024, max_payload - kPartHeadroom));
  set_state("publishing");
  while (!stopping() && !broken_) {
    write_state(false);
    auto next = (*cursor)->next_entry();
    PGRELAY_TRY(next);
    if (!*next) {
      (*cursor)->wait(std::chrono::milliseconds(100));
      continue;
    }
    const log::EntryMeta meta = **next;
    // What only a later fdatasync makes durable may yet be taken back by a crash.
    while (!stopping() && !log_.wait_durable(meta.end_lsn, std::chrono::steady_clock::now() +
                                                               std::chrono::milliseconds(200))) {
    }
    if (stopping()) break;
    auto data = (*cursor)->read_data();
    PGRELAY_TRY(data);
    auto messages =
        EntryMessages::make(meta, *data, subjects_,
                            partial && partial->part_size != 0 ? partial->part_size : part_size);
    PGRELAY_TRY(messages);
    if (partial) {
      if (meta.commit_lsn != partial->commit_lsn || messages->change_count() != partial->changes) {
        return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                           "the JetStream stream " + options_.stream +
                               " ends inside a transaction committed at " +
                               partial->commit_lsn.to_string() + " that this log does not hold",
                           "The stream was written from another copy of this log. Delete the "
                           "stream (nats stream rm " +
                               options_.stream + ") or give this pgrelay another --nats-stream.");
      }
      PGRELAY_TRY(messages->skip(partial->skip));
      partial.reset();
    }
    for (;;) {
      auto message = messages->next();
      PGRELAY_TRY(message);
      if (!*message) break;
      PGRELAY_TRY(publish(connection, **message, *messages, previous));
      if (broken_ || stopping()) break;
    }
    previous = meta.commit_lsn;
  }
  return {};
}

Status Publisher::publish(const Connection& connection, const OutMessage& message,
                          const EntryMessages& entry, wire::Lsn previous) {
  natsMsg* raw = nullptr;
  natsStatus s = natsMsg_Create(&raw, message.subject.c_str(), nullptr, message.payload.data(),
                                static_cast<int>(message.payload.size()));
  MsgPtr msg(raw);
  if (s != NATS_OK) return nats_error(s, "could not build a NATS message", options_.connect);
  const log::EntryMeta& meta = entry.meta();
  const std::string lsn = message.lsn.to_string();
  const std::string xid = std::to_string(meta.xid);
  const std::string time = format_pg_time(meta.commit_time);
  const std::string count = std::to_string(entry.change_count());
  natsMsgHeader_Set(msg.get(), kHeaderLsn, lsn.c_str());
  natsMsgHeader_Set(msg.get(), kHeaderXid, xid.c_str());
  natsMsgHeader_Set(msg.get(), kHeaderCommitTime, time.c_str());
  natsMsgHeader_Set(msg.get(), kHeaderCount, count.c_str());
  natsMsgHeader_Set(msg.get(), kHeaderLogId, log_id_.c_str());
  if (previous.is_valid()) {
    natsMsgHeader_Set(msg.get(), kHeaderPrevious, previous.to_string().c_str());
  }
  if (message.id.tx_part) {
    const std::string part =
        format_part_header({message.id.number, entry.part_count(), entry.part_size()});
    natsMsgHeader_Set(msg.get(), kHeaderPart, part.c_str());
  }
  const std::string id = format_message_id(message.id);
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MsgId = id.c_str();
  po.MaxWait = options_.ack_wait.count();
  std::uint64_t seq = 0;
  {
    std::lock_guard lock(mu_);
    po.ExpectLastSeq = expected_last_seq_;  // 0 (an empty stream) sets no expectation
    seq = expected_last_seq_ + 1;
    in_flight_[seq] = InFlight{meta.commit_lsn, meta.end_lsn, message.last};
  }
  natsMsg* handed = msg.release();
  for (;;) {
    s = js_PublishMsgAsync(connection.js(), &handed, &po);
    // NATS_TIMEOUT: max_pending acks are outstanding; wait for them, as long as it takes.
    if (s != NATS_TIMEOUT || stopping() || broken_) break;
  }
  if (s != NATS_OK) {
    natsMsg_Destroy(handed);
    {
      std::lock_guard lock(mu_);
      in_flight_.erase(seq);
    }
    if (stopping() || broken_.exchange(true)) return {};
    count_error("publish", natsStatus_GetText(s));
    return {};
  }
  std::lock_guard lock(mu_);
  expected_last_seq_ = seq;
  return {};
}

Status Publisher::publish_server_facts(const Connection& connection) {
  if (!options_.read_server_facts || facts_current_) return {};
  // The log's end before the read: markers after it carry whatever changes from there on.
  const wire::Lsn as_of = log_.last_end_lsn();
  auto facts = options_.read_server_facts();
  if (!facts.ok()) {
    count_error("server_facts", facts.error().message);
    logger_.warning(
        "could not read the server facts followers answer sessions with; "
        "publishing goes on, and they are read again at the next reconnect",
        {{"error", facts.error().message}, {"hint", facts.error().hint}});
    return {};
  }
  facts->as_of = as_of;
  auto last = read_server_facts(connection, options_.stream, subjects_, options_.connect);
  PGRELAY_TRY(last);
  if (*last && (*last)->same_server(*facts)) {
    facts_current_ = true;
    return {};
  }
  const std::string payload = encode_server_facts(*facts);
  // Followers can do without the facts (with --upstream); the entries cannot wait for them.
  const auto give_up = [&](const std::string& why, const std::string& hint) {
    count_error("server_facts", why);
    logger_.warning("not publishing the server facts: " + why,
                    {{"subject", subjects_.server_facts()}, {"hint", hint}});
    facts_current_ = true;
  };
  if (static_cast<std::int64_t>(payload.size()) > connection.max_payload()) {
    give_up(std::to_string(payload.size()) + " bytes exceed the NATS servers' max_payload of " +
                std::to_string(connection.max_payload()),
            "Raise max_payload in the NATS servers' configuration; until then followers read "
            "publications from their --upstream.");
    return {};
  }
  natsMsg* raw = nullptr;
  natsStatus s = natsMsg_Create(&raw, subjects_.server_facts().c_str(), nullptr, payload.data(),
                                static_cast<int>(payload.size()));
  MsgPtr msg(raw);
  if (s != NATS_OK) return nats_error(s, "could not build a NATS message", options_.connect);
  natsMsgHeader_Set(msg.get(), kHeaderLogId, log_id_.c_str());
  natsMsgHeader_Set(msg.get(), kHeaderLsn, as_of.to_string().c_str());
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MaxWait = options_.ack_wait.count();
  {
    // No publish is outstanding yet: the facts take the next sequence, as an entry would.
    std::lock_guard lock(mu_);
    po.ExpectLastSeq = expected_last_seq_;
  }
  jsPubAck* ack = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  s = js_PublishMsg(&ack, connection.js(), msg.get(), &po, &code);
  if (s != NATS_OK) {
    // Whether it was stored is unknown: the caller reads the stream's end again. A cause that
    // persists (a permission on this subject alone) must not hold the entries back for good.
    Error e = nats_error(s, "could not publish the server facts to " + subjects_.server_facts(),
                         options_.connect);
    if (++facts_failures_ >= 3) give_up(e.message, e.hint);
    return e;
  }
  {
    std::lock_guard lock(mu_);
    expected_last_seq_ = ack->Sequence;
  }
  jsPubAck_Destroy(ack);
  facts_current_ = true;
  logger_.info("published the server facts followers answer sessions with",
               {{"subject", subjects_.server_facts()}, {"as_of", as_of.to_string()}});
  return {};
}

void Publisher::drain(const Connection& connection) {
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MaxWait = options_.ack_wait.count() + 1000;
  if (js_PublishAsyncComplete(connection.js(), &po) != NATS_OK) {
    natsMsgList pending;
    if (js_PublishAsyncGetPendingList(&pending, connection.js()) == NATS_OK) {
      natsMsgList_Destroy(&pending);
    }
  }
  std::lock_guard lock(mu_);
  in_flight_.clear();
}

void Publisher::on_ack(jsCtx*, natsMsg* msg, jsPubAck* ack, jsPubAckErr* error, void* closure) {
  static_cast<Publisher*>(closure)->take_ack(ack, error);
  natsMsg_Destroy(msg);
}

void Publisher::take_ack(const jsPubAck* ack, const jsPubAckErr* error) {
  if (ack != nullptr && !ack->Duplicate) {
    std::lock_guard lock(mu_);
    // Stored in order: an ack for `seq` means everything before it is stored too.
    auto end = in_flight_.upper_bound(ack->Sequence);
    for (auto it = in_flight_.begin(); it != end; ++it) {
      ++figures_.published_messages;
      if (it->second.last) {
        ++figures_.published_transactions;
        figures_.published_commit_lsn = it->second.commit_lsn;
        figures_.published_end_lsn = it->second.end_lsn;
        news_.reset();  // publishing works: the next failure is news again
      }
    }
    in_flight_.erase(in_flight_.begin(), end);
    return;
  }
  // The first failure says why; those after it fail only because it did.
  if (broken_.exchange(true)) return;
  if (ack != nullptr) {
    // The stream held this Msg-Id already, where the publisher did not expect it.
    count_error("duplicate", "a message the stream already held");
    return;
  }
  if (error != nullptr) {
    count_error(reason_of(*error),
                error->ErrText != nullptr ? error->ErrText : natsStatus_GetText(error->Err));
  }
}

}  // namespace pgrelay::nats
