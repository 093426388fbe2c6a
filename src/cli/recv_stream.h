// The COPY BOTH loop of `pgrelay recv`: decode, write, acknowledge only what is durable, stop.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <optional>
#include <ostream>

#include "base/result.h"
#include "cli/recv_output.h"
#include "wire/lsn.h"

namespace pgrelay::cli {

enum class RecvFormat { kJson, kPgoutput };

struct StreamOptions {
  RecvFormat format = RecvFormat::kJson;
  int protocol_version = 1;
  std::optional<wire::Lsn> endpos;
  std::chrono::milliseconds status_interval{10'000};  // 0: only when the server asks
  bool verbose = false;
};

// How the stream ended when it ended without an error.
enum class StreamStop { kSignal, kEndpos };

// Streams from `conn`, which must be in COPY BOTH after START_REPLICATION, into `output` until
// a signal arrives on `signal_fd` (a signalfd for SIGINT and SIGTERM), --endpos is reached, or
// an error. Standby status updates report as written and flushed the end of the last whole
// transaction (or message, or keepalive position between transactions) that `output` has made
// durable. On a signal inside a transaction the transaction is completed first; a second
// signal abandons it (its unwritten part is dropped: it will be sent again).
Result<StreamStop> stream_changes(PGconn* conn, int signal_fd, RecvOutput& output,
                                  const StreamOptions& options, std::ostream& log);

}  // namespace pgrelay::cli
