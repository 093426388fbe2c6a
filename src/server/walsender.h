// Streams a slot's changes from the log to one consumer, as Postgres's logical walsender does.
#pragma once

#include <chrono>
#include <string>

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
  // Postgres's wal_sender_timeout: a consumer silent this long is disconnected; a keepalive
  // asking for a reply goes out at half of it. Zero disables both.
  std::chrono::milliseconds timeout{60000};
  WalsenderInfo info;  // pid, user, application name... for pg_stat_replication
};

// Runs START_REPLICATION after its checks passed and the slot was acquired: sends
// CopyBothResponse, then the slot's transactions from max(requested, confirmed_flush) onwards,
// keepalives, and applies the consumer's standby status updates to the slot. Returns ok when
// the consumer ended the stream with CopyDone (the CopyDone reply has been sent; the caller
// completes the command), an Error when the session must end (the caller reports it).
upstream::awaitable<Status> run_walsender(upstream::MessageStream& client, ReplicationHub& hub,
                                          WalsenderParams params);

}  // namespace pgrelay::server
