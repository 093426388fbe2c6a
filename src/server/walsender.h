// Streams a slot's changes from the log to one consumer, as Postgres's logical walsender does.
#pragma once

#include <chrono>
#include <string>

#include "base/logger.h"
#include "log/change_view.h"
#include "pgoutput/options.h"
#include "server/replication_hub.h"
#include "upstream/message_stream.h"

namespace pgrelay::server {

struct WalsenderParams {
  std::string slot;
  Lsn requested_start;
  pgoutput::PgoutputOptions options;
  log::ViewOptions view;
  // Identifies `view` among sessions (publications and options): sessions with equal keys
  // share encoded entries.
  std::string view_key;
  // Postgres's wal_sender_timeout: a consumer silent this long is disconnected; a keepalive
  // asking for a reply goes out at half of it. Zero disables both.
  std::chrono::milliseconds timeout{60000};
  WalsenderInfo info;        // pid, user, application name... for pg_stat_replication
  Logger* logger = nullptr;  // progress of a consumer catching up; null: silent
  std::chrono::milliseconds progress_interval{10000};  // between "consumer catching up" lines
};

enum class StreamEnd {
  kConsumerDone,  // the consumer sent CopyDone; ours is sent, the caller completes the command
  kShutdown,      // server shutdown: "COPY 0" was sent after the consumer confirmed; close
};

// Runs START_REPLICATION after its checks passed and the slot was acquired: sends
// CopyBothResponse, then the slot's transactions from max(requested, confirmed_flush) onwards,
// keepalives, and applies the consumer's standby status updates to the slot. An Error means
// the session must end (the caller reports it).
upstream::awaitable<Result<StreamEnd>> run_walsender(upstream::MessageStream& client,
                                                     ReplicationHub& hub, WalsenderParams params);

}  // namespace pgrelay::server
