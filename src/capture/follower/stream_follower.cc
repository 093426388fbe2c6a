// Rebuilds a database's change log from the _tx subject of the JetStream stream a pgrelay
// primary publishes: the same entries, at the same LSNs, with the same bytes.
#include "capture/follower/stream_follower.h"

#include <algorithm>
#include <utility>

#include "base/strings.h"
#include "log/file_util.h"
#include "nats/message_id.h"
#include "nats/stream_setup.h"

namespace pgrelay::capture {

namespace {

struct SubscriptionDeleter {
  void operator()(natsSubscription* sub) const {
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
  }
};
using SubscriptionPtr = std::unique_ptr<natsSubscription, SubscriptionDeleter>;

Error not_pgrelays(std::uint64_t seq, const std::string& stream, const std::string& why) {
  return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                     "message " + std::to_string(seq) + " of the JetStream stream " + stream +
                         " was not written by pgrelay: " + why,
                     "Point the follower at the stream a pgrelay primary publishes (its "
                     "--nats-stream and --nats-subject-prefix).");
}

// A _tx message's headers, checked: what the assembler needs.
Result<TxMessage> read_tx_message(natsMsg* msg, std::uint64_t seq, const std::string& stream) {
  using nats::header_value;
  auto id_text = header_value(msg, "Nats-Msg-Id");
  auto part_text = header_value(msg, nats::kHeaderPart);
  auto log_text = header_value(msg, nats::kHeaderLogId);
  if (!id_text || !part_text || !log_text) {
    return not_pgrelays(seq, stream, "it lacks pgrelay's headers");
  }
  TxMessage out;
  out.stream_seq = seq;
  auto id = nats::parse_message_id(*id_text);
  auto part = nats::parse_part_header(*part_text);
  auto log_id = parse_decimal(*log_text);
  if (!id || !id->tx_part || !part || !log_id || part->number != id->number) {
    return not_pgrelays(seq, stream, "its headers are not those of a _tx part");
  }
  out.id = *id;
  out.part = *part;
  out.log_id = *log_id;
  if (auto previous = header_value(msg, nats::kHeaderPrevious)) {
    auto lsn = wire::Lsn::parse(*previous);
    if (!lsn) return not_pgrelays(seq, stream, "its previous-LSN header is not an LSN");
    out.previous = *lsn;
  }
  const char* data = natsMsg_GetData(msg);
  out.payload = ByteView(reinterpret_cast<const std::uint8_t*>(data),
                         static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
  return out;
}

}  // namespace

Result<std::unique_ptr<StreamFollower>> StreamFollower::make(FollowerOptions options,
                                                             log::ChangeLog& log, Logger& logger) {
  std::optional<FollowerCheckpoint> checkpoint;
  if (auto data = log.last_checkpoint()) {
    auto decoded = decode_follower_checkpoint(*data);
    if (!decoded.ok()) return decoded.error();
    checkpoint = *decoded;
  }
  if (!checkpoint && log.last_commit_lsn().is_valid()) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "the log in " + log.options().dir +
                           " was captured from an upstream, not rebuilt from a stream",
                       "Give the follower a --data-dir of its own: it rebuilds its log there.");
  }
  std::optional<nats::ServerFacts> facts;
  if (!options.facts_dir.empty()) {
    const std::string path = options.facts_dir + "/" + kFactsFileName;
    if (auto kept = log::read_whole_file(path); kept.ok()) {
      auto parsed = nats::parse_server_facts(
          std::string_view(reinterpret_cast<const char*>(kept->data()), kept->size()));
      if (!parsed.ok()) {
        Error e = parsed.error();
        e.message = path + ": " + e.message;
        e.hint = "Remove the file: the follower reads the facts from the stream again.";
        return e;
      }
      facts = std::move(*parsed);
    }
  }
  std::unique_ptr<StreamFollower> out(
      new StreamFollower(std::move(options), log, logger, std::move(checkpoint)));
  if (facts) out->facts_ = std::make_shared<const nats::ServerFacts>(std::move(*facts));
  return out;
}

StreamFollower::StreamFollower(FollowerOptions options, log::ChangeLog& log, Logger& logger,
                               std::optional<FollowerCheckpoint> checkpoint)
    : options_(std::move(options)),
      log_(log),
      logger_(logger),
      subjects_(options_.subject_prefix, options_.database),
      checkpoint_(std::move(checkpoint)),
      head_(log.last_commit_lsn()) {
  if (checkpoint_) {
    log_id_ = checkpoint_->log_id;
    read_seq_ = checkpoint_->stream_seq;
  }
  figures_.state = "stopped";
  figures_.applied_seq = read_seq_;
  figures_.applied_commit_lsn = head_;
}

StreamFollower::~StreamFollower() {
  stop();
}

void StreamFollower::start() {
  set_state("connecting");
  thread_.start("nats-follow", [this] { run(); });
}

void StreamFollower::stop() {
  thread_.stop();
  set_state("stopped");
}

FollowerFigures StreamFollower::figures() const {
  std::lock_guard lock(mu_);
  return figures_;
}

std::shared_ptr<const nats::ServerFacts> StreamFollower::server_facts() const {
  std::lock_guard lock(mu_);
  return facts_;
}

Status StreamFollower::refresh_facts(const nats::Connection& connection) {
  auto read = nats::read_server_facts(connection, options_.stream, subjects_, options_.connect);
  PGRELAY_TRY(read);
  if (!*read) {
    if (!std::exchange(warned_no_facts_, true)) {
      logger_.warning(
          "the stream holds no server facts of the database yet: replication "
          "sessions need --upstream until the primary publishes them",
          {{"stream", options_.stream},
           {"subject", subjects_.server_facts()},
           {"hint", "Run the primary with a pgrelay that publishes them."}});
    }
    return {};
  }
  {
    std::lock_guard lock(mu_);
    if (facts_ && facts_->same_server(**read) && facts_->as_of == (*read)->as_of) return {};
    facts_ = std::make_shared<const nats::ServerFacts>(**read);
  }
  logger_.info("read the primary's server facts from the stream",
               {{"subject", subjects_.server_facts()}, {"as_of", (*read)->as_of.to_string()}});
  if (options_.facts_dir.empty()) return {};
  const std::string text = nats::encode_server_facts(**read);
  return log::write_file_atomically(options_.facts_dir, kFactsFileName, as_bytes(text));
}

void StreamFollower::set_state(const char* state) {
  std::lock_guard lock(mu_);
  figures_.state = state;
}

void StreamFollower::count_error(const std::string& reason, const std::string& text) {
  std::lock_guard lock(mu_);
  ++figures_.errors[reason];
  figures_.last_error = text;
}

void StreamFollower::report(const Error& error) {
  if (!news_.is_news(error.message)) return;
  logger_.log(LogLevel::kError, "following the NATS stream interrupted, retrying: " + error.message,
              {{"stream", options_.stream},
               {"database", options_.database},
               {"detail", error.detail},
               {"hint", error.hint}});
}

void StreamFollower::run() {
  auto delay = options_.retry_min;
  while (!stopping()) {
    const std::uint64_t before = read_seq_;
    Status s = session();
    if (stopping()) break;
    if (!s.ok()) {
      count_error(s.error().sqlstate.starts_with("08") ? "connection" : "stream",
                  s.error().message);
      report(s.error());
    }
    set_state("retrying");
    // A session that got somewhere starts the backoff over.
    delay = read_seq_ != before ? options_.retry_min : std::min(delay * 2, options_.retry_max);
    thread_.pause(delay);
  }
}

Status StreamFollower::session() {
  set_state("connecting");
  nats::ConnectionEvents events;
  events.disconnected = [this] {
    logger_.warning("NATS connection lost; reconnecting",
                    {{"servers", nats::redact_urls(options_.connect.urls)}});
  };
  events.reconnected = [this] { logger_.info("NATS connection back", {}); };
  auto connection = nats::Connection::open(options_.connect, nullptr, std::move(events));
  PGRELAY_TRY(connection);
  Status followed = follow(**connection);
  Status flushed = flush();
  PGRELAY_TRY(followed);
  return flushed;
}

Status StreamFollower::follow(const nats::Connection& connection) {
  auto bounds = nats::read_stream_bounds(connection, options_.stream, options_.connect);
  PGRELAY_TRY(bounds);
  std::uint64_t start = read_seq_ + 1;
  if (checkpoint_ && (checkpoint_->stream != options_.stream || read_seq_ > bounds->last_seq)) {
    // Another stream, or this one made anew: its sequences are not the ones the checkpoint
    // counted. Read it from its start; what the log holds is skipped by LSN.
    logger_.warning(
        "the stream is not the one this follower read before; reading it from its start",
        {{"stream", options_.stream},
         {"followed_before", checkpoint_->stream},
         {"read_through", read_seq_},
         {"stream_last_seq", bounds->last_seq}});
    start = 1;
    read_seq_ = 0;
  }
  // Retention removed what lies before the stream's first message; whether any of it was this
  // log's, the first entry's Pgrelay-Previous-Lsn says.
  start = std::max(start, bounds->first_seq);
  PGRELAY_TRY(refresh_facts(connection));
  auto facts_read = std::chrono::steady_clock::now();

  const std::string filter = subjects_.transactions();
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = options_.stream.c_str();
  so.Ordered = true;
  so.Config.DeliverPolicy = js_DeliverByStartSequence;
  so.Config.OptStartSeq = start;
  natsSubscription* raw = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  natsStatus s = js_SubscribeSync(&raw, connection.js(), filter.c_str(), nullptr, &so, &code);
  SubscriptionPtr sub(raw);
  if (s != NATS_OK) {
    return nats::nats_error(
        s, "could not read " + filter + " from the JetStream stream " + options_.stream,
        options_.connect);
  }
  // The follower reads as fast as it appends: nats.c must not drop what it has not yet taken.
  natsSubscription_SetPendingLimits(sub.get(), -1, 256 << 20);
  set_state("following");
  if (std::exchange(logged_start_, start) != start) {
    logger_.info("following the JetStream stream",
                 {{"stream", options_.stream}, {"subject", filter}, {"from_seq", start}});
  }
  EntryAssembler assembler;
  while (!stopping()) {
    natsMsg* raw_msg = nullptr;
    s = natsSubscription_NextMsg(&raw_msg, sub.get(), 100);
    nats::MsgPtr msg(raw_msg);
    if (s == NATS_TIMEOUT) {
      PGRELAY_TRY(flush());
      if (std::chrono::steady_clock::now() - facts_read >= options_.facts_interval) {
        PGRELAY_TRY(refresh_facts(connection));
        facts_read = std::chrono::steady_clock::now();
      }
      continue;
    }
    if (s != NATS_OK) {
      return nats::nats_error(s, "lost the JetStream consumer of " + filter, options_.connect);
    }
    jsMsgMetaData* meta = nullptr;
    if (natsMsg_GetMetaData(&meta, msg.get()) != NATS_OK || meta == nullptr) {
      return not_pgrelays(0, options_.stream, "a message without JetStream metadata");
    }
    const std::uint64_t seq = meta->Sequence.Stream;
    const std::uint64_t pending = meta->NumPending;
    jsMsgMetaData_Destroy(meta);
    auto tx = read_tx_message(msg.get(), seq, options_.stream);
    PGRELAY_TRY(tx);
    if (log_id_ == 0) log_id_ = tx->log_id;
    if (tx->log_id != log_id_) {
      return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                         "message " + std::to_string(seq) + " of the JetStream stream " +
                             options_.stream + " came from another change log (log id " +
                             std::to_string(tx->log_id) + "; this follower's log follows " +
                             std::to_string(log_id_) + ")",
                         "Give the follower an empty --data-dir to follow the new log, or point "
                         "it at the stream of the log it follows.");
    }
    auto entry = assembler.add(*tx);
    PGRELAY_TRY(entry);
    if (*entry) PGRELAY_TRY(take(std::move(**entry)));
    if (!assembler.in_entry()) read_seq_ = seq;
    {
      std::lock_guard lock(mu_);
      figures_.pending_messages = pending;
    }
    if ((pending == 0 && !assembler.in_entry()) || batch_bytes_ >= options_.batch_bytes ||
        batch_.size() >= options_.batch_entries) {
      PGRELAY_TRY(flush());
    }
  }
  return {};
}

Status StreamFollower::take(AssembledEntry entry) {
  const wire::Lsn commit = entry.meta.commit_lsn;
  if (head_.is_valid() && commit <= head_) return {};  // the log holds it already
  if (head_.is_valid() && entry.previous != head_) {
    const std::string before = entry.previous.is_valid() ? entry.previous.to_string() : "unknown";
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "the JetStream stream " + options_.stream +
                           " no longer holds what follows this follower's log: its next "
                           "transaction, committed at " +
                           commit.to_string() + ", follows " + before + ", and the log ends at " +
                           head_.to_string(),
                       "The stream's retention removed those transactions before the follower "
                       "read them. Rebuild this follower (stop it, empty its --data-dir, start "
                       "it again), and keep the stream's max age and max bytes longer than a "
                       "follower may be down.");
  }
  head_ = commit;
  batch_bytes_ += entry.bytes.size();
  batch_.push_back(std::move(entry));
  return {};
}

Status StreamFollower::flush() {
  if (batch_.empty() && (read_seq_ == 0 || (checkpoint_ && checkpoint_->stream_seq == read_seq_ &&
                                            checkpoint_->stream == options_.stream))) {
    return {};
  }
  FollowerCheckpoint checkpoint{options_.stream, log_id_, read_seq_};
  const Bytes checkpoint_bytes = encode_follower_checkpoint(checkpoint);
  std::vector<log::PendingEntry> pending;
  pending.reserve(batch_.size() + 1);
  for (const auto& entry : batch_) pending.push_back(entry.pending());
  log::EntryMeta checkpoint_meta;
  checkpoint_meta.kind = log::EntryKind::kCheckpoint;
  const wire::Lsn end =
      batch_.empty() ? log_.last_end_lsn() : std::max(batch_.back().meta.end_lsn, head_);
  checkpoint_meta.begin_lsn = checkpoint_meta.commit_lsn = checkpoint_meta.end_lsn = end;
  pending.push_back(log::PendingEntry{checkpoint_meta, checkpoint_bytes, nullptr});
  PGRELAY_TRY(log_.append(pending));
  checkpoint_ = checkpoint;
  std::lock_guard lock(mu_);
  if (!batch_.empty()) news_.reset();  // following works: the next failure is news again
  figures_.entries += batch_.size();
  figures_.applied_seq = read_seq_;
  figures_.applied_commit_lsn = head_;
  batch_.clear();
  batch_bytes_ = 0;
  return {};
}

}  // namespace pgrelay::capture
