// The COPY BOTH loop of `pgrelay recv`: decode, write, acknowledge only what is durable, stop.
#include "cli/recv_stream.h"

#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cli/recv_connection.h"
#include "pgoutput/decoder.h"
#include "pgoutput/message_json.h"
#include "wire/replication_frames.h"

namespace pgrelay::cli {

namespace {

using Clock = std::chrono::steady_clock;
using wire::Lsn;

// A clean stop waits for the server to end the COPY after our CopyDone: at most this long
// without hearing from it (Postgres's default wal_sender_timeout; a server may be busy reading
// a large transaction), at most kEndCopyLimit in all, and not after a second signal.
constexpr std::chrono::seconds kEndCopySilence{60};
constexpr std::chrono::seconds kEndCopyLimit{300};
// How long a stop waits for the keepalive that tells the server's final position.
constexpr std::chrono::seconds kFinalKeepaliveTimeout{2};
// Output buffered beyond this is written out without waiting for the socket to run dry.
constexpr std::size_t kWriteOutBytes = 1u << 20;

class DecoderRelations final : public pgoutput::RelationLookup {
 public:
  explicit DecoderRelations(const pgoutput::Decoder& decoder) : decoder_(decoder) {}
  const pgoutput::Relation* find(pgoutput::Oid oid) const override {
    return decoder_.relation(oid);
  }

 private:
  const pgoutput::Decoder& decoder_;
};

Error stream_error(std::string message, std::string hint = {}) {
  return Error::make(sqlstate::kConnectionException, std::move(message), std::move(hint));
}

std::string trimmed(const char* text) {
  std::string s = text != nullptr ? text : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class Streamer {
 public:
  Streamer(PGconn* conn, int signal_fd, RecvOutput& output, const StreamOptions& options,
           std::ostream& log)
      : conn_(conn),
        signal_fd_(signal_fd),
        output_(output),
        options_(options),
        log_(log),
        decoder_(pgoutput::DecoderOptions{options.protocol_version, false}),
        relations_(decoder_) {}

  Result<StreamStop> run();

 private:
  Status on_copy_data(ByteView payload);
  Status on_xlog(const wire::XLogData& xlog);
  Status on_keepalive(const wire::PrimaryKeepalive& keepalive);
  void on_signal();
  // Makes the output durable and reports its position to the server; with `request_reply`
  // the server answers with a keepalive carrying its position.
  Status send_status(bool request_reply = false);
  // Before stopping between transactions: asks the server for its position and confirms it
  // too if nothing else arrives first (see finish()).
  Status learn_final_position();
  Result<StreamStop> finish(StreamStop stop);
  Error server_ended();
  void warn_if_partial();

  PGconn* conn_;
  int signal_fd_;
  RecvOutput& output_;
  const StreamOptions& options_;
  std::ostream& log_;
  pgoutput::Decoder decoder_;
  DecoderRelations relations_;
  std::optional<pgoutput::TransactionInfo> txn_;  // between Begin and Commit
  // Everything the server sent up to here is in `output_` as whole units (so, after a sync,
  // durable): the end of the last Commit, non-transactional message, or a keepalive's walEnd
  // received between transactions.
  Lsn whole_;
  Lsn reported_;
  Clock::time_point last_status_;
  int signals_ = 0;
  bool stop_after_commit_ = false;
  bool abandoned_ = false;  // stopped inside a transaction: confirm nothing past it
  std::optional<StreamStop> stop_;
  std::string scratch_;
};

Result<StreamStop> Streamer::run() {
  last_status_ = Clock::now();
  bool signalled = false;
  for (;;) {
    for (;;) {
      char* buf = nullptr;
      int n = PQgetCopyData(conn_, &buf, 1);
      if (n == 0) break;
      if (n == -1) return server_ended();
      if (n < 0) {
        return stream_error("could not read COPY data: " + trimmed(PQerrorMessage(conn_)));
      }
      Status handled = on_copy_data(
          ByteView(reinterpret_cast<const std::uint8_t*>(buf), static_cast<std::size_t>(n)));
      PQfreemem(buf);
      if (!handled.ok()) return handled.error();
      if (stop_) return finish(*stop_);
      // libpq's buffer can hold megabytes of backlog: write as we go to bound ours.
      if (output_.buffered() >= kWriteOutBytes) PGRELAY_TRY(output_.write_out());
    }
    // Signals are taken after the messages that had arrived with them, all at once (so that a
    // second one abandons the transaction the first would have completed).
    if (signalled) {
      signalled = false;
      signalfd_siginfo info{};
      while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        on_signal();
      }
      if (stop_) return finish(*stop_);
    }
    PGRELAY_TRY(output_.write_out());

    auto now = Clock::now();
    int timeout_ms = -1;
    if (options_.status_interval.count() > 0) {
      auto due = last_status_ + options_.status_interval;
      if (now >= due) {
        // Waiting for --endpos: ask for a keepalive, whose position may show it was passed
        // (pgrelay, unlike Postgres, sends none while idle to a consumer that keeps replying).
        PGRELAY_TRY(send_status(options_.endpos.has_value() && !txn_));
        due = last_status_ + options_.status_interval;
      }
      auto wait = std::chrono::ceil<std::chrono::milliseconds>(due - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<std::int64_t>(wait.count(), 0, 3'600'000));
    }
    pollfd fds[2] = {{PQsocket(conn_), POLLIN, 0}, {signal_fd_, POLLIN, 0}};
    if (fds[0].fd < 0) return stream_error("invalid socket: " + trimmed(PQerrorMessage(conn_)));
    int ready = ::poll(fds, 2, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return stream_error(std::string("poll() failed: ") + std::strerror(errno));
    }
    if ((fds[0].revents & (POLLIN | POLLERR | POLLHUP)) != 0 && PQconsumeInput(conn_) == 0) {
      return stream_error("could not receive data from the replication stream: " +
                          trimmed(PQerrorMessage(conn_)));
    }
    if ((fds[1].revents & POLLIN) != 0) signalled = true;
  }
}

Status Streamer::on_copy_data(ByteView payload) {
  auto frame = wire::parse_from_server(payload);
  if (!frame.ok()) return frame.error();
  if (auto* xlog = std::get_if<wire::XLogData>(&*frame)) return on_xlog(*xlog);
  return on_keepalive(std::get<wire::PrimaryKeepalive>(*frame));
}

Status Streamer::on_xlog(const wire::XLogData& xlog) {
  auto decoded = decoder_.decode(xlog.data);
  if (!decoded.ok()) {
    Error e = decoded.error();
    e.message =
        "could not decode the pgoutput message at " + xlog.wal_start.to_string() + ": " + e.message;
    return e;
  }
  const pgoutput::Message& message = *decoded;
  if (options_.format == RecvFormat::kPgoutput) {
    // The framing --help documents: start LSN (8 bytes), length (4 bytes), the message.
    ByteWriter frame;
    frame.u64(xlog.wal_start.value());
    frame.u32(static_cast<std::uint32_t>(xlog.data.size()));
    frame.raw(xlog.data);
    output_.append(as_chars(frame.bytes()));
  }

  if (const auto* begin = std::get_if<pgoutput::Begin>(&message)) {
    if (txn_) return Error::protocol("BEGIN inside a transaction that did not commit");
    txn_ = pgoutput::TransactionInfo{begin->xid, begin->commit_time};
    return {};
  }
  if (const auto* commit = std::get_if<pgoutput::Commit>(&message)) {
    if (!txn_) return Error::protocol("COMMIT outside a transaction");
    txn_.reset();
    output_.mark_boundary();
    whole_ = std::max(whole_, commit->end_lsn);
    if (stop_after_commit_) stop_ = StreamStop::kSignal;
    if (options_.endpos && commit->end_lsn >= *options_.endpos) stop_ = StreamStop::kEndpos;
    return {};
  }
  const char* unexpected = nullptr;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::StreamStart> ||
                      std::is_same_v<T, pgoutput::StreamStop> ||
                      std::is_same_v<T, pgoutput::StreamCommit> ||
                      std::is_same_v<T, pgoutput::StreamAbort> ||
                      std::is_same_v<T, pgoutput::BeginPrepare> ||
                      std::is_same_v<T, pgoutput::Prepare> ||
                      std::is_same_v<T, pgoutput::CommitPrepared> ||
                      std::is_same_v<T, pgoutput::RollbackPrepared> ||
                      std::is_same_v<T, pgoutput::StreamPrepare>) {
          unexpected = pgoutput::tag_name(static_cast<char>(pgoutput::tag_of(message)));
        }
      },
      message);
  if (unexpected != nullptr) {
    return Error::protocol(std::string("unexpected ") + unexpected +
                           " message: pgrelay recv requests neither streaming nor two-phase");
  }
  if (options_.format == RecvFormat::kJson) {
    scratch_.clear();
    pgoutput::append_json_lines(message, xlog.wal_start, txn_ ? &*txn_ : nullptr, relations_,
                                scratch_);
    output_.append(scratch_);
  }
  const auto* logical = std::get_if<pgoutput::LogicalMessage>(&message);
  if (logical != nullptr && !logical->transactional && !txn_) {
    // A non-transactional message is a unit of its own. Postgres puts it at the end of its
    // WAL record: acknowledging that position skips it on restart, and nothing else.
    output_.mark_boundary();
    whole_ = std::max(whole_, xlog.wal_start);
    if (options_.endpos && xlog.wal_start >= *options_.endpos) stop_ = StreamStop::kEndpos;
  }
  return {};
}

Status Streamer::on_keepalive(const wire::PrimaryKeepalive& keepalive) {
  // Between transactions, walEnd passes no commit that is still to come (Postgres decodes a
  // transaction and sends it before moving past its commit), so acknowledging it lets the
  // slot move past WAL with nothing published, as pg_recvlogical does.
  if (!txn_) {
    whole_ = std::max(whole_, keepalive.wal_end);
    if (options_.endpos && keepalive.wal_end >= *options_.endpos) stop_ = StreamStop::kEndpos;
  }
  if (keepalive.reply_requested && !stop_) return send_status();
  return {};
}

void Streamer::on_signal() {
  ++signals_;
  if (!txn_) {
    stop_ = StreamStop::kSignal;
    return;
  }
  if (signals_ == 1) {
    stop_after_commit_ = true;
    if (options_.verbose) {
      log_ << "pgrelay recv: finishing the current transaction before stopping "
              "(signal again to stop at once)\n";
    }
    return;
  }
  warn_if_partial();
  txn_.reset();
  abandoned_ = true;
  stop_ = StreamStop::kSignal;
}

void Streamer::warn_if_partial() {
  if (!txn_) return;
  if (output_.discard_partial()) {
    log_ << "pgrelay recv: warning: stopped inside transaction " << txn_->xid
         << ", whose beginning was already written (it exceeded the output buffer); the "
            "whole transaction will be sent again\n";
  }
}

Status Streamer::send_status(bool request_reply) {
  PGRELAY_TRY(output_.sync());
  wire::StandbyStatusUpdate status;
  status.write = whole_;
  status.flush = whole_;
  status.apply = Lsn();  // as pg_recvlogical: it applies nothing
  status.send_time = wire::to_pg_timestamp(std::chrono::system_clock::now());
  status.reply_requested = request_reply;
  Bytes bytes = wire::encode(status);
  if (PQputCopyData(conn_, reinterpret_cast<const char*>(bytes.data()),
                    static_cast<int>(bytes.size())) <= 0 ||
      PQflush(conn_) != 0) {
    return stream_error("could not send feedback packet: " + trimmed(PQerrorMessage(conn_)));
  }
  if (options_.verbose && whole_ != reported_) {
    log_ << "pgrelay recv: confirming write up to " << whole_.to_string() << ", flush to "
         << whole_.to_string() << "\n";
  }
  reported_ = whole_;
  last_status_ = Clock::now();
  return {};
}

Status Streamer::learn_final_position() {
  PGRELAY_TRY(send_status(true));
  auto deadline = Clock::now() + kFinalKeepaliveTimeout;
  for (;;) {
    char* buf = nullptr;
    int n = PQgetCopyData(conn_, &buf, 1);
    if (n > 0) {
      auto frame = wire::parse_from_server(
          ByteView(reinterpret_cast<const std::uint8_t*>(buf), static_cast<std::size_t>(n)));
      PQfreemem(buf);
      // Data first: the keepalive after it would cover what is not written. It is not
      // confirmed, so the server sends it again next time.
      if (!frame.ok() || !std::holds_alternative<wire::PrimaryKeepalive>(*frame)) return {};
      whole_ = std::max(whole_, std::get<wire::PrimaryKeepalive>(*frame).wal_end);
      return {};
    }
    if (n < 0) return {};  // the stream ended; finish() reports what follows
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return {};
    pollfd fds[2] = {{PQsocket(conn_), POLLIN, 0}, {signal_fd_, POLLIN, 0}};
    if (::poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) return {};
    if ((fds[1].revents & POLLIN) != 0) return {};  // a second signal: stop now
    if (PQconsumeInput(conn_) == 0) return {};
  }
}

Result<StreamStop> Streamer::finish(StreamStop stop) {
  warn_if_partial();
  // The server's position between transactions can be confirmed too: that keeps WAL with
  // nothing published from being decoded again, and covers pgrelay, where a
  // non-transactional message is skipped on restart only once that position passes it.
  if (!txn_ && !abandoned_) PGRELAY_TRY(learn_final_position());
  PGRELAY_TRY(send_status());
  if (options_.verbose) {
    log_ << "pgrelay recv: "
         << (stop == StreamStop::kEndpos
                 ? "end position " + options_.endpos->to_string() + " reached"
                 : std::string("stopping on signal"))
         << " at " << whole_.to_string() << "\n";
  }
  if (PQputCopyEnd(conn_, nullptr) <= 0 || PQflush(conn_) != 0) {
    return stream_error("could not send end-of-streaming message to the server: " +
                        trimmed(PQerrorMessage(conn_)));
  }
  // Whatever still arrives is neither written nor acknowledged: the server sends it again.
  // A server may finish sending a transaction first, so only silence counts against us; the
  // wait for CommandComplete matters: until then the server may still hold the slot.
  auto started = Clock::now();
  auto last_input = started;
  std::string problem;
  auto wait_input = [&]() -> bool {
    auto now = Clock::now();
    auto deadline = std::min(last_input + kEndCopySilence, started + kEndCopyLimit);
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    if (left <= 0) {
      problem = "timed out waiting for the server to end the stream";
      return false;
    }
    pollfd fds[2] = {{PQsocket(conn_), POLLIN, 0}, {signal_fd_, POLLIN, 0}};
    int ready = ::poll(fds, 2, static_cast<int>(left));
    if (ready < 0 && errno != EINTR) {
      problem = std::string("poll() failed: ") + std::strerror(errno);
      return false;
    }
    if ((fds[1].revents & POLLIN) != 0) {
      problem = "stopped waiting for it on a second signal";
      return false;
    }
    if ((fds[0].revents & POLLIN) != 0) last_input = Clock::now();
    if (PQconsumeInput(conn_) == 0) {
      problem = trimmed(PQerrorMessage(conn_));
      return false;
    }
    return true;
  };
  auto warn = [&] {
    log_ << "pgrelay recv: warning: the server did not end the stream cleanly: " << problem << "\n";
    return stop;
  };
  for (;;) {
    char* buf = nullptr;
    int n = PQgetCopyData(conn_, &buf, 1);
    if (n > 0) {
      PQfreemem(buf);
      continue;
    }
    if (n == -1) break;
    if (n < -1) {
      problem = trimmed(PQerrorMessage(conn_));
      return warn();
    }
    if (!wait_input()) return warn();
  }
  while (PQisBusy(conn_) != 0) {
    if (!wait_input()) return warn();
  }
  while (PgResult result{PQgetResult(conn_)}) {
    if (PQresultStatus(result.get()) == PGRES_FATAL_ERROR) {
      log_ << "pgrelay recv: warning: the server reported after the stream ended: "
           << error_of(result.get(), "error").to_string() << "\n";
    }
    while (PQisBusy(conn_) != 0) {
      if (!wait_input()) return warn();
    }
  }
  return stop;
}

Error Streamer::server_ended() {
  PgResult result(PQgetResult(conn_));
  warn_if_partial();
  // Nothing more can be confirmed: what is not written yet would only be written twice.
  output_.discard_unwritten();
  Status synced = output_.sync();
  if (result != nullptr && PQresultStatus(result.get()) == PGRES_COMMAND_OK) {
    Error e = stream_error("the server ended the replication stream",
                           "It may be shutting down. Run pgrelay recv again to resume from the "
                           "slot's confirmed position.");
    if (!synced.ok()) e.detail = synced.error().message;
    return e;
  }
  Error e =
      error_of(result.get(), "the replication stream ended: " + trimmed(PQerrorMessage(conn_)));
  if (!synced.ok()) e.detail += (e.detail.empty() ? "" : "\n") + synced.error().message;
  return e;
}

}  // namespace

Result<StreamStop> stream_changes(PGconn* conn, int signal_fd, RecvOutput& output,
                                  const StreamOptions& options, std::ostream& log) {
  Streamer streamer(conn, signal_fd, output, options, log);
  return streamer.run();
}

}  // namespace pgrelay::cli
