// Streams a slot's changes from the log to one consumer, as Postgres's logical walsender does.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "base/logger.h"
#include "log/change_view.h"
#include "pgoutput/options.h"
#include "server/replication_hub.h"
#include "upstream/message_stream.h"

namespace pgrelay::server {

// What a consumer is sent: the view of its publications and options, and a key identifying
// it among sessions (sessions with equal keys share encoded entries).
struct WalsenderView {
  log::ViewOptions options;
  std::string key;
};

struct WalsenderParams {
  std::string slot;
  Lsn requested_start;
  pgoutput::PgoutputOptions options;
  WalsenderView view;
  // Binary mode (options.binary): the upstream database to convert text values through
  // (binary_values.h), a libpq conninfo.
  std::string binary_conninfo;
  // The view of the publications as capture's publications-changed marker `change` left them.
  // Called where the log carries one, even inside a transaction, so what follows is sent as
  // they then said, with every Relation sent again before its table's next change (pgoutput
  // invalidates its whole relation cache then); and at the start of a stream behind the log's
  // end with the first marker after its start, its catalog before as `change.after`, so that
  // the changes before it are judged as they were. A marker without the catalog after it has
  // the publications read from the upstream once its transaction is visible there. A
  // publication the catalog lacks (dropped) refuses the next change (ViewOptions::refused); an
  // error ends the stream. Null: the view never changes.
  std::function<upstream::awaitable<Result<WalsenderView>>(const log::PublicationsChange& change)>
      reload_view;
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
