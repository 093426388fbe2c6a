// The JetStream stream pgrelay publishes into: created when missing, checked when it exists,
// and where its end leaves a database's publishing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "nats/connection.h"
#include "nats/message_id.h"
#include "nats/server_facts.h"
#include "nats/subjects.h"

namespace pgrelay::nats {

// The headers pgrelay sets on every message (besides Nats-Msg-Id).
inline constexpr const char* kHeaderLsn = "Pgrelay-Lsn";
inline constexpr const char* kHeaderXid = "Pgrelay-Xid";
inline constexpr const char* kHeaderCommitTime = "Pgrelay-Commit-Time";
// The change messages of the message's transaction (its "count").
inline constexpr const char* kHeaderCount = "Pgrelay-Count";
// On _tx messages: "k/n/S", part k of n, each part S bytes but the last.
inline constexpr const char* kHeaderPart = "Pgrelay-Part";
// The system id of the log the message came from, in decimal.
inline constexpr const char* kHeaderLogId = "Pgrelay-Log-Id";
// The commit LSN of the entry before this message's in the log, X/Y: a follower appends an
// entry only right after that one, so a message lost to the stream's retention is a gap it
// sees. Absent on the entries of a publisher that began where the log held nothing before.
inline constexpr const char* kHeaderPrevious = "Pgrelay-Previous-Lsn";

// A message the caller logs at WARNING level.
struct StreamWarning {
  std::string message;
  std::string hint;
};

struct StreamCheck {
  bool created = false;
  int replicas = 0;
  std::vector<StreamWarning> warnings;
};

// Whether the subject filter `pattern` (a stream's subject) takes every subject `wanted`
// (a filter such as "pgrelay.>") can match.
bool subject_covers(const std::string& pattern, const std::string& wanted);

// Creates stream `name` for `subjects` when it does not exist: file storage, min(3, servers
// known) replicas, a duplicate window of 2 minutes. An existing stream is used as it is: one
// whose subjects do not take `subjects` is an error, and settings that weaken what pgrelay
// promises (memory storage, fewer replicas, a shorter duplicate window, a retention other than
// limits) come back as warnings that name the fix.
Result<StreamCheck> ensure_stream(const Connection& connection, const std::string& name,
                                  const std::string& subjects, const ConnectOptions& options);

// Where a stream's messages begin and end now (retention removes from the front).
struct StreamBounds {
  std::uint64_t first_seq = 0;
  std::uint64_t last_seq = 0;  // 0: the stream is empty
};
// Reads them; a stream that does not exist is an error naming how it comes to be.
Result<StreamBounds> read_stream_bounds(const Connection& connection, const std::string& name,
                                        const ConnectOptions& options);

// The stream's end, as a publisher of one database's log needs it.
struct StreamEnd {
  std::uint64_t last_seq = 0;  // of the whole stream: the next message must follow it
  // Where this database's publishing goes on; nullopt when the stream holds none of it.
  std::optional<ResumePoint> resume;
};

// Reads the stream's last sequence and this database's last message. A message there that
// pgrelay did not write, or that came from another log than `log_id`, is an error.
Result<StreamEnd> read_stream_end(const Connection& connection, const std::string& name,
                                  const Subjects& subjects, std::uint64_t log_id,
                                  const ConnectOptions& options);

// The stream's last server facts of the database (nullopt: none published yet).
Result<std::optional<ServerFacts>> read_server_facts(const Connection& connection,
                                                     const std::string& name,
                                                     const Subjects& subjects,
                                                     const ConnectOptions& options);

}  // namespace pgrelay::nats
