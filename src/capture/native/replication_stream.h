// The upstream side of native capture: one walsender connection streaming a pgoutput slot.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "base/result.h"
#include "capture/trigger/pg_session.h"
#include "wire/replication_frames.h"

namespace pgrelay::capture {

// What one read() returned: a frame from the walsender, or nothing before the timeout.
struct NoFrame {};
using StreamFrame = std::variant<NoFrame, wire::XLogData, wire::PrimaryKeepalive>;

// START_REPLICATION over a replication=database connection, then CopyData frames both ways.
// Errors are values: 08006 when the connection is gone, the server's own error (with its
// SQLSTATE) when it ended the stream with one.
class ReplicationStream {
 public:
  // Starts streaming `slot` from `start` with pgoutput `options` (already quoted as the
  // replication grammar wants, e.g. "proto_version '1', publication_names '\"a\",\"b\"'").
  static Result<std::unique_ptr<ReplicationStream>> start(std::unique_ptr<PgSession> session,
                                                          const std::string& slot, wire::Lsn start,
                                                          const std::string& options);

  // The next frame, waiting at most `timeout` for one (zero: only what already arrived).
  Result<StreamFrame> read(std::chrono::milliseconds timeout);
  // Takes in what the socket holds now, without waiting (for a caller that watches socket()).
  Status take_in();
  int socket() const;
  // Ends the connection for every descriptor of its socket (an event loop may hold a
  // duplicate), so that the upstream's walsender lets the slot go now; the session is unusable
  // after.
  void shut_down();
  // Sends a standby status update (apply = flushed).
  Status send_status(wire::Lsn written, wire::Lsn flushed);

 private:
  explicit ReplicationStream(std::unique_ptr<PgSession> session) : session_(std::move(session)) {}
  Error lost(const std::string& what) const;
  // After the server ended COPY: its error, or 08006 if it ended without one.
  Error ended();

  std::unique_ptr<PgSession> session_;
};

}  // namespace pgrelay::capture
