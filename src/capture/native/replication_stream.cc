// The upstream side of native capture: one walsender connection streaming a pgoutput slot.
#include "capture/native/replication_stream.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace pgrelay::capture {

Result<std::unique_ptr<ReplicationStream>> ReplicationStream::start(
    std::unique_ptr<PgSession> session, const std::string& slot, wire::Lsn start,
    const std::string& options) {
  auto quoted = session->ident(slot);
  if (!quoted.ok()) return quoted.error();
  const std::string command =
      "START_REPLICATION SLOT " + *quoted + " LOGICAL " + start.to_string() + " (" + options + ")";
  PGresult* res = PQexec(session->raw(), command.c_str());
  if (res == nullptr) return session->connection_error("START_REPLICATION failed");
  if (PQresultStatus(res) != PGRES_COPY_BOTH) {
    Error error = PgSession::server_error(res).value_or(
        session->connection_error("START_REPLICATION failed"));
    PQclear(res);
    return error;
  }
  PQclear(res);
  return std::unique_ptr<ReplicationStream>(new ReplicationStream(std::move(session)));
}

Error ReplicationStream::lost(const std::string& what) const {
  return session_->connection_error(what, sqlstate::kConnectionFailure);
}

Error ReplicationStream::ended() {
  std::optional<Error> error;
  while (PGresult* res = PQgetResult(session_->raw())) {
    if (!error && PQresultStatus(res) == PGRES_FATAL_ERROR) {
      error = PgSession::server_error(res);
      if (!error) error = lost("upstream replication stream failed");
    }
    PQclear(res);
  }
  if (error) return *error;
  return Error::make(sqlstate::kConnectionFailure, "the upstream ended the replication stream");
}

Result<StreamFrame> ReplicationStream::read(std::chrono::milliseconds timeout) {
  PGconn* conn = session_->raw();
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    char* buffer = nullptr;
    const int n = PQgetCopyData(conn, &buffer, /*async=*/1);
    if (n > 0) {
      ByteView payload(reinterpret_cast<const std::uint8_t*>(buffer), static_cast<std::size_t>(n));
      auto frame = wire::parse_from_server(payload);
      PQfreemem(buffer);
      if (!frame.ok()) return frame.error();
      if (auto* data = std::get_if<wire::XLogData>(&*frame)) return StreamFrame{std::move(*data)};
      return StreamFrame{std::get<wire::PrimaryKeepalive>(*frame)};
    }
    if (n == -1) return ended();
    if (n == -2) return lost("upstream replication stream failed");
    // Nothing whole buffered: wait for the socket, then let libpq read what came.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return StreamFrame{NoFrame{}};
    pollfd pfd{PQsocket(conn), POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) return lost("waiting for the upstream failed");
    if (ready == 0) return StreamFrame{NoFrame{}};
    if (PQconsumeInput(conn) == 0) return lost("upstream replication connection lost");
  }
}

Status ReplicationStream::take_in() {
  if (PQconsumeInput(session_->raw()) == 0) return lost("upstream replication connection lost");
  return {};
}

int ReplicationStream::socket() const {
  return PQsocket(session_->raw());
}

void ReplicationStream::shut_down() {
  const int fd = socket();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

Status ReplicationStream::send_status(wire::Lsn written, wire::Lsn flushed) {
  wire::StandbyStatusUpdate update;
  update.write = written;
  update.flush = flushed;
  update.apply = flushed;
  update.send_time = wire::to_pg_timestamp(std::chrono::system_clock::now());
  const Bytes payload = wire::encode(update);
  PGconn* conn = session_->raw();
  if (PQputCopyData(conn, reinterpret_cast<const char*>(payload.data()),
                    static_cast<int>(payload.size())) != 1 ||
      PQflush(conn) != 0) {
    return lost("could not send a status update upstream");
  }
  return {};
}

}  // namespace pgrelay::capture
