// Replication connections (replication=database): replication commands answered by pgrelay,
// SQL relayed to an upstream backend.
//
// Like a walsender, the session answers one simple Query at a time. A replication command is
// executed here against the log and the slot registry; anything else is SQL and goes to an
// upstream backend opened for the session (SET, SHOW, SELECT on pg_settings...), rewritten
// like pass-through SQL. An exported snapshot lives until the next command, as in Postgres.
// On a follower the primary's facts (primary_facts.h) stand in for the upstream: the session
// opens an upstream backend only when SQL comes, and a follower without one refuses the SQL.
#include "server/replication_session.h"

#include <libpq-fe.h>

#include <algorithm>
#include <cctype>

#include "server/blocking.h"
#include "server/command_result.h"
#include "server/publications.h"
#include "server/session_start.h"
#include "server/walsender.h"
#include "upstream/upstream_login.h"
#include "wire/frontend_messages.h"
#include "wire/messages.h"

namespace pgrelay::server {
namespace {

using pgoutput::ReplicationCommand;

// A session end that needs no FATAL message: the walsender already said goodbye.
constexpr const char* kQuietClose = "00000";

// How long a stream waits for the transaction that changed the publications to become visible
// upstream (a synchronous standby's confirmation away, at most) before it ends with why.
constexpr auto kChangeVisibleWait = std::chrono::seconds(10);

// Setting names, as SHOW matches them: case aside ("datestyle" is DateStyle).
bool same_setting(std::string_view a, std::string_view b) {
  return std::ranges::equal(
      a, b, [](unsigned char x, unsigned char y) { return std::tolower(x) == std::tolower(y); });
}

// libpq's ALWAYS_SECURE_SEARCH_PATH_SQL, which pg_recvlogical and PostgreSQL's own subscriber
// send on every replication connection before anything else.
bool is_secure_search_path(std::string_view sql) {
  while (!sql.empty() &&
         (std::isspace(static_cast<unsigned char>(sql.back())) || sql.back() == ';')) {
    sql.remove_suffix(1);
  }
  while (!sql.empty() && std::isspace(static_cast<unsigned char>(sql.front())))
    sql.remove_prefix(1);
  return sql == "SELECT pg_catalog.set_config('search_path', '', false)";
}

std::string slot_not_found(const std::string& name) {
  return "replication slot \"" + name + "\" does not exist";
}

class ReplicationSession {
 public:
  ReplicationSession(upstream::MessageStream& client, const wire::StartupMessage& startup,
                     const User& user, ServerContext& context)
      : client_(client), startup_(startup), user_(user), context_(context), hubs_(*context.hubs) {
    pid_ = hubs_.walsenders().allocate_pid();
  }

  upstream::awaitable<void> run();

 private:
  // On a follower, the primary's ParameterStatus values as this session's client gets them;
  // nullopt when the session must take them from an upstream backend.
  std::optional<StartupParameters> facts_parameters() const;
  // Why a follower without an upstream cannot start this session without facts: the database
  // is not the one it follows, or it has not read them yet.
  Error facts_missing() const;
  // Opens the session's upstream backend unless it is open: 08004 naming `what` on a follower
  // without an upstream.
  upstream::awaitable<Status> ensure_upstream(const std::string& what);
  upstream::awaitable<Status> command_loop();
  upstream::awaitable<Status> execute(const ReplicationCommand& command, Bytes& out);
  // Sends `sql` to the upstream backend and relays its answer (the closing ReadyForQuery only
  // when `include_ready`).
  upstream::awaitable<Status> relay_sql(const std::string& sql, bool include_ready = true);
  upstream::awaitable<Status> start_replication(const pgoutput::StartReplication& command,
                                                Bytes& out);
  // `options`' publications: what the walsender sends, and its key. As `change` (a marker's,
  // see walsender.h) left them when it carries their catalog; else read from the upstream,
  // once the marker's transaction is visible there.
  upstream::awaitable<Result<WalsenderView>> load_view(ReplicationHub& hub,
                                                       const pgoutput::PgoutputOptions& options,
                                                       const log::PublicationsChange& change = {});
  // Blocking on the pool: the hub of the session's database, its capture started if need be.
  upstream::awaitable<Result<ReplicationHub*>> open_hub();
  upstream::awaitable<Status> create_slot(const pgoutput::CreateReplicationSlot& command,
                                          Bytes& out);
  upstream::awaitable<Status> drop_slot(const pgoutput::DropReplicationSlot& command, Bytes& out);
  upstream::awaitable<Status> identify_system(Bytes& out);
  // Runs `sql` on the session's upstream backend without showing the client; returns the
  // first value of the first row (nullopt when there is none).
  upstream::awaitable<Result<std::optional<std::string>>> side_query(const std::string& sql);
  void cleanup();
  // Counts (and logs, when it ends the session) an error about to be sent to the client.
  void note_error(const Error& error, bool ends_session) {
    auto peer = client_.transport().peer_address();
    note_error_sent(context_, error, ends_session, peer ? peer->to_string() : std::string("local"));
  }

  upstream::MessageStream& client_;
  const wire::StartupMessage& startup_;
  const User& user_;
  ServerContext& context_;
  ReplicationHubs& hubs_;
  // Its database's hub stays while the session runs (no DROP DATABASE lets go of it).
  std::shared_ptr<void> database_use_ = hubs_.use(std::string(startup_.database()));
  int pid_ = 0;
  std::optional<upstream::UpstreamLink> sql_;  // the upstream backend for SQL
  std::shared_ptr<void> exported_snapshot_;    // held until the next command
  std::vector<std::string> temporary_slots_;
  char transaction_status_ = 'I';
};

upstream::awaitable<void> ReplicationSession::run() {
  // A follower's sessions start from its primary's facts; others open the SQL backend first:
  // it proves the database exists and gives real ParameterStatus values.
  std::optional<StartupParameters> parameters = facts_parameters();
  if (!parameters) {
    Status linked = facts_missing();
    if (context_.upstream) linked = co_await ensure_upstream("replication sessions");
    if (!linked.ok()) {
      note_error(linked.error(), /*ends_session=*/true);
      Bytes fatal = wire::encode(wire::make_error_response(linked.error(), wire::Severity::kFatal));
      (void)co_await client_.write(fatal);
      co_return;
    }
    parameters = sql_->parameters;
  }
  wire::BackendKeyData key = context_.cancels.issue(pid_, std::nullopt);
  Bytes hello = session_hello(*parameters, key);
  if ((co_await client_.write(hello)).ok()) {
    auto outcome = co_await command_loop();
    if (!outcome.ok()) {
      note_error(outcome.error(), /*ends_session=*/true);
      Bytes fatal =
          wire::encode(wire::make_error_response(outcome.error(), wire::Severity::kFatal));
      (void)co_await client_.write(fatal);
    }
  }
  context_.cancels.forget(key);
  cleanup();
  if (sql_) sql_->stream.transport().close();
}

std::optional<StartupParameters> ReplicationSession::facts_parameters() const {
  if (context_.primary_facts == nullptr) return std::nullopt;
  // A database the follower does not serve is the upstream's to refuse (or to serve SQL).
  if (!hubs_.scope().admits(std::string(startup_.database()))) return std::nullopt;
  auto parameters = context_.primary_facts->parameters();
  if (!parameters) return std::nullopt;
  // What Postgres reports of the session itself is this session's, not the primary's.
  const std::string application_name(startup_.find("application_name").value_or(""));
  for (auto& [name, value] : *parameters) {
    if (name == "application_name") value = application_name;
    if (name == "session_authorization") value = user_.name;
  }
  return parameters;
}

Error ReplicationSession::facts_missing() const {
  const std::string database(startup_.database());
  if (!hubs_.scope().admits(database)) {
    return Error::make(sqlstate::kInvalidCatalogName,
                       "this pgrelay follower serves database \"" + hubs_.upstream().dbname +
                           "\", not \"" + database + "\"",
                       "Connect to " + hubs_.upstream().dbname +
                           ", or run a follower of that database's stream (--database).");
  }
  return Error::make("57P03", "the follower has not read its primary's server facts yet",
                     "It reads them from the stream when it connects to NATS (pgrelay status "
                     "shows whether it has); the primary publishes them when it starts "
                     "publishing. Retry shortly, or give the follower --upstream URL.");
}

upstream::awaitable<Status> ReplicationSession::ensure_upstream(const std::string& what) {
  if (sql_) co_return Status{};
  if (!context_.upstream) co_return upstream_absent(what);
  auto link =
      co_await upstream::connect_upstream(*context_.upstream, std::string(startup_.database()),
                                          upstream_parameters(startup_), context_.upstream_tls);
  if (!link.ok()) co_return link.error();
  sql_.emplace(std::move(*link));
  co_return Status{};
}

void ReplicationSession::cleanup() {
  exported_snapshot_.reset();
  for (const auto& name : temporary_slots_) {
    (void)hubs_.slots().release(name);
    (void)hubs_.slots().drop(name);
  }
  if (!temporary_slots_.empty()) hubs_.walsenders().changed();
}

upstream::awaitable<Status> ReplicationSession::command_loop() {
  bool skip_to_sync = false;
  for (;;) {
    auto frame = co_await client_.read_frame();
    if (!frame.ok()) co_return Status{};  // the client went away
    Bytes out;
    switch (frame->tag) {
      case 'X':
        co_return Status{};
      case 'Q': {
        skip_to_sync = false;
        exported_snapshot_.reset();  // a snapshot lives until the next command
        auto query = wire::parse_query(frame->body);
        if (!query.ok()) co_return query.error();
        if (!pgoutput::is_replication_command(query->sql)) {
          // A follower answers the secure search_path itself (it means nothing to replication
          // commands), so pg_recvlogical and subscribers need no upstream backend.
          if (!sql_ && context_.primary_facts != nullptr && is_secure_search_path(query->sql)) {
            append_result(out, {{"set_config"}}, {{std::string()}}, "SELECT 1");
            append_ready(out, transaction_status_);
            break;
          }
          // A follower opens its upstream backend for the first other SQL; without one the SQL
          // is refused and the session goes on.
          Status linked = co_await ensure_upstream("SQL on a replication connection");
          if (!linked.ok()) {
            note_error(linked.error(), /*ends_session=*/false);
            append_error(out, linked.error());
            append_ready(out, transaction_status_);
            break;
          }
          PGRELAY_CO_TRY(co_await relay_sql(query->sql));
          continue;
        }
        auto command = pgoutput::parse_replication_command(query->sql);
        if (!command.ok()) {
          note_error(command.error(), /*ends_session=*/false);
          append_error(out, command.error());
        } else {
          for (const auto& notice : command->notices) {
            append_notice(out, Error::make(notice.sqlstate.c_str(), notice.message));
          }
          auto done = co_await execute(*command, out);
          if (!done.ok()) {
            if (done.error().sqlstate == kQuietClose) co_return Status{};
            if (done.error().sqlstate == "08006" ||
                done.error().sqlstate == sqlstate::kAdminShutdown) {
              co_return done.error();
            }
            note_error(done.error(), /*ends_session=*/false);
            append_error(out, done.error());
          }
        }
        append_ready(out, transaction_status_);
        break;
      }
      case 'S':
        if (skip_to_sync) {
          skip_to_sync = false;
          append_ready(out, transaction_status_);
        }
        break;
      case 'P':
      case 'B':
      case 'D':
      case 'E':
      case 'C':
      case 'H':
      case 'F':
        if (!skip_to_sync) {
          const Error refused =
              Error::protocol("extended query protocol not supported in a replication connection",
                              "Use the simple query protocol on replication connections.");
          note_error(refused, /*ends_session=*/false);
          append_error(out, refused);
          skip_to_sync = true;
        }
        break;
      default:
        co_return Error::protocol("invalid frontend message type " +
                                  std::to_string(static_cast<unsigned char>(frame->tag)));
    }
    if (!out.empty()) PGRELAY_CO_TRY(co_await client_.write(out));
  }
}

upstream::awaitable<Status> ReplicationSession::relay_sql(const std::string& sql,
                                                          bool include_ready) {
  std::string text = sql;
  if (context_.rewrite) {
    // Only users with the REPLICATION right open replication sessions.
    if (auto rewritten = context_.rewrite(sql, SlotAccess::kGranted)) text = *rewritten;
  }
  Bytes query = wire::encode(wire::Query{text});
  PGRELAY_CO_TRY(co_await sql_->stream.write(query));
  // The answer goes to the client as it came, a batch of frames at a time: a table sync's COPY
  // of a large table is millions of CopyData frames, so the frames already buffered are taken
  // without a copy each (FrameView) and written in 64 KiB batches.
  Bytes out;
  enum class Next { kMore, kDone, kCopyIn };
  auto take = [&](char tag, ByteView body) {
    if (tag == 'Z') {
      if (!body.empty()) transaction_status_ = static_cast<char>(body[0]);
      if (include_ready) wire::append_frame(out, tag, body);
      return Next::kDone;
    }
    wire::append_frame(out, tag, body);
    return tag == 'G' ? Next::kCopyIn : Next::kMore;
  };
  for (Next next = Next::kMore; next == Next::kMore;) {
    auto frame = co_await sql_->stream.read_frame();
    if (!frame.ok()) co_return frame.error();
    next = take(frame->tag, frame->body);
    while (next == Next::kMore && out.size() < 64 * 1024) {
      auto view = sql_->stream.reader().next_view();
      if (!view.ok()) co_return view.error();
      if (!view->has_value()) break;
      next = take((*view)->tag, (*view)->body);
    }
    if (next == Next::kCopyIn) {
      co_return Error::make(sqlstate::kFeatureNotSupported,
                            "COPY FROM STDIN is not supported on replication connections",
                            "Run COPY on an ordinary connection.");
    }
    if (out.size() >= 64 * 1024) {
      PGRELAY_CO_TRY(co_await client_.write(out));
      out.clear();
    }
  }
  co_return co_await client_.write(out);
}

upstream::awaitable<Status> ReplicationSession::execute(const ReplicationCommand& command,
                                                        Bytes& out) {
  if (auto* start = std::get_if<pgoutput::StartReplication>(&command.command)) {
    co_return co_await start_replication(*start, out);
  }
  if (auto* create = std::get_if<pgoutput::CreateReplicationSlot>(&command.command)) {
    co_return co_await create_slot(*create, out);
  }
  if (auto* drop = std::get_if<pgoutput::DropReplicationSlot>(&command.command)) {
    co_return co_await drop_slot(*drop, out);
  }
  if (command.is<pgoutput::IdentifySystem>()) co_return co_await identify_system(out);
  if (auto* show = std::get_if<pgoutput::Show>(&command.command)) {
    // The replication settings pgrelay owns; anything else is the upstream's.
    const auto& s = context_.settings;
    std::optional<std::string> value;
    if (show->name == "wal_level") value = "logical";
    if (show->name == "max_wal_senders") value = std::to_string(s.max_wal_senders);
    if (show->name == "max_replication_slots") value = std::to_string(s.max_replication_slots);
    if (show->name == "wal_sender_timeout") {
      value = std::to_string(s.wal_sender_timeout.count() / 1000) + "s";
    }
    // pg_recvlogical asks it to make its files; a follower's own data directory's is 0700.
    if (show->name == "data_directory_mode" && context_.primary_facts != nullptr) value = "0700";
    // A follower knows the primary's reported settings (server_version, encodings...).
    if (auto parameters = facts_parameters(); parameters && !value) {
      for (const auto& [name, setting] : *parameters) {
        if (same_setting(name, show->name)) value = setting;
      }
    }
    if (value) {
      append_result(out, {{show->name}}, {{value}}, "SHOW");
      co_return Status{};
    }
    // The upstream's answer to the same SHOW is what the client expects.
    PGRELAY_CO_TRY(co_await ensure_upstream("SHOW " + show->name));
    PGRELAY_CO_TRY(co_await client_.write(out));
    out.clear();
    std::string sql = "SHOW " + show->name;
    co_return co_await relay_sql(sql, /*include_ready=*/false);
  }
  if (auto* read = std::get_if<pgoutput::ReadReplicationSlot>(&command.command)) {
    auto slot = hubs_.slots().get(read->slot_name);
    if (slot) {
      co_return Error::make(sqlstate::kFeatureNotSupported,
                            "cannot use READ_REPLICATION_SLOT with a logical replication slot");
    }
    append_result(out, {{"slot_type"}, {"restart_lsn"}, {"restart_tli", kInt8Oid, 8}},
                  {{std::nullopt, std::nullopt, std::nullopt}}, "READ_REPLICATION_SLOT");
    co_return Status{};
  }
  if (command.is<pgoutput::TimelineHistory>()) {
    co_return Error::make(
        "58P01", "could not open file \"pg_wal/00000001.history\": No such file or directory",
        "pgrelay's timeline is always 1 and has no history.");
  }
  if (command.is<pgoutput::AlterReplicationSlot>()) {
    co_return Error::make(sqlstate::kSyntaxError,
                          "ALTER_REPLICATION_SLOT is not supported by PostgreSQL 15",
                          "Drop and create the slot with the options you need.");
  }
  co_return Error::make(sqlstate::kFeatureNotSupported, "unsupported replication command");
}

upstream::awaitable<Result<std::optional<std::string>>> ReplicationSession::side_query(
    const std::string& sql) {
  PGRELAY_CO_TRY(co_await ensure_upstream("\"" + sql + "\""));
  Bytes query = wire::encode(wire::Query{sql});
  PGRELAY_CO_TRY(co_await sql_->stream.write(query));
  std::optional<Error> failed;
  std::optional<std::string> value;
  for (;;) {
    auto frame = co_await sql_->stream.read_frame();
    if (!frame.ok()) co_return frame.error();
    if (frame->tag == 'E') {
      if (auto e = wire::parse_error_response(frame->body); e.ok()) failed = e->to_error();
    } else if (frame->tag == 'D' && !value) {
      auto row = wire::parse_data_row(frame->body);
      if (row.ok() && !row->values.empty() && row->values[0]) {
        value = std::string(row->values[0]->begin(), row->values[0]->end());
      }
    } else if (frame->tag == 'Z') {
      break;
    }
  }
  if (failed) co_return *failed;
  co_return value;
}

upstream::awaitable<Status> ReplicationSession::identify_system(Bytes& out) {
  // The log's head, or the upstream's WAL position when that is further (an empty log, or one
  // idle since): LSNs clients get from the upstream compare correctly with it.
  // A database not captured (yet) has no log: the upstream's position stands alone.
  ReplicationHub* hub = hubs_.find(std::string(startup_.database()));
  ReplicationHub* first = hubs_.find(hubs_.upstream().dbname);
  Lsn head = hub ? hub->log().last_end_lsn() : Lsn();
  // A follower's log is what it serves: it does not open an upstream backend to ask.
  if (context_.primary_facts == nullptr || sql_) {
    auto upstream_lsn = co_await side_query("SELECT pg_catalog.pg_current_wal_insert_lsn()");
    if (upstream_lsn.ok() && *upstream_lsn) {
      if (auto parsed = Lsn::parse(**upstream_lsn); parsed && *parsed > head) head = *parsed;
    }
  }
  append_result(out, {{"systemid"}, {"timeline", kInt4Oid, 4}, {"xlogpos"}, {"dbname"}},
                {{std::to_string(first ? first->log().system_id() : 0), "1", head.to_string(),
                  std::string(startup_.database())}},
                "IDENTIFY_SYSTEM");
  co_return Status{};
}

upstream::awaitable<Status> ReplicationSession::create_slot(
    const pgoutput::CreateReplicationSlot& command, Bytes& out) {
  if (command.kind == pgoutput::SlotKind::kPhysical) {
    co_return Error::make(sqlstate::kFeatureNotSupported,
                          "pgrelay does not serve physical replication",
                          "Create a LOGICAL slot with the pgoutput plugin.");
  }
  if (command.plugin != "pgoutput") {
    co_return Error::make(
        "58P01", "could not access file \"" + command.plugin + "\": No such file or directory",
        "pgrelay provides the pgoutput plugin only.");
  }
  PGRELAY_CO_TRY(log::validate_slot_name(command.slot_name));
  if (hubs_.slots().get(command.slot_name)) {
    co_return Error::make(sqlstate::kDuplicateObject,
                          "replication slot \"" + command.slot_name + "\" already exists");
  }
  if (command.snapshot == pgoutput::SnapshotAction::kUse && transaction_status_ != 'T') {
    co_return Error::make(sqlstate::kInternalError,
                          "CREATE_REPLICATION_SLOT ... (SNAPSHOT 'use') must be called inside a "
                          "transaction");
  }
  if (command.snapshot != pgoutput::SnapshotAction::kNothing && transaction_status_ == 'T' &&
      command.snapshot == pgoutput::SnapshotAction::kExport) {
    co_return Error::make(sqlstate::kInternalError,
                          "CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export') must not be called "
                          "inside a transaction");
  }
  auto opened = co_await open_hub();
  if (!opened.ok()) co_return opened.error();
  ReplicationHub& hub = **opened;
  CaptureLink* capture = hub.capture();
  if (!capture) {
    co_return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                          "pgrelay has no capture running, so it cannot create a slot");
  }
  std::optional<ExportedSnapshot> snapshot;
  Lsn consistent_point;
  if (command.snapshot == pgoutput::SnapshotAction::kNothing) {
    auto synced = co_await run_blocking(hub.blocking(), [capture] { return capture->sync(); });
    if (!synced.ok()) co_return synced.error();
    consistent_point = *synced;
  } else {
    auto exported =
        co_await run_blocking(hub.blocking(), [capture] { return capture->export_snapshot(); });
    if (!exported.ok()) co_return exported.error();
    snapshot = std::move(*exported);
    consistent_point = snapshot->consistent_point;
  }

  log::Slot slot;
  slot.name = command.slot_name;
  slot.plugin = command.plugin;
  slot.database = std::string(startup_.database());
  slot.temporary = command.temporary;
  slot.two_phase = command.two_phase;
  slot.confirmed_flush = consistent_point;
  slot.restart_lsn = consistent_point;
  auto created = co_await run_blocking(hub.blocking(), [&] { return hubs_.slots().create(slot); });
  if (!created.ok()) co_return created.error();
  hub.note_consistent_point(consistent_point);
  if (command.temporary) temporary_slots_.push_back(command.slot_name);
  hubs_.walsenders().changed();
  co_await run_blocking(hub.blocking(), [this] {
    hubs_.walsenders().sync_mirror();
    return true;
  });

  std::optional<std::string> snapshot_name;
  if (snapshot && command.snapshot == pgoutput::SnapshotAction::kUse) {
    // Make the session's open transaction see exactly the slot's starting point.
    // The result of the SET is not the client's to see: run it on the side.
    std::string import = "SET TRANSACTION SNAPSHOT '" + snapshot->name + "'";
    auto imported = co_await side_query(import);
    if (!imported.ok()) co_return imported.error();
  } else if (snapshot) {
    snapshot_name = snapshot->name;
    exported_snapshot_ = snapshot->holder;
  }
  append_result(out, {{"slot_name"}, {"consistent_point"}, {"snapshot_name"}, {"output_plugin"}},
                {{command.slot_name, consistent_point.to_string(), snapshot_name, command.plugin}},
                "CREATE_REPLICATION_SLOT");
  co_return Status{};
}

upstream::awaitable<Status> ReplicationSession::drop_slot(
    const pgoutput::DropReplicationSlot& command, Bytes& out) {
  for (;;) {
    auto slot = hubs_.slots().get(command.slot_name);
    if (!slot) co_return Error::make(sqlstate::kUndefinedObject, slot_not_found(command.slot_name));
    if (slot->active_pid != 0 && slot->active_pid != pid_) {
      if (!command.wait) {
        co_return Error::make(sqlstate::kObjectInUse, "replication slot \"" + command.slot_name +
                                                          "\" is active for PID " +
                                                          std::to_string(slot->active_pid));
      }
      asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::milliseconds(100));
      co_await timer.async_wait(upstream::kAsTuple);
      continue;
    }
    break;
  }
  (void)hubs_.slots().release(command.slot_name);
  auto dropped = co_await run_blocking(hubs_.blocking(),
                                       [&] { return hubs_.slots().drop(command.slot_name); });
  if (!dropped.ok()) co_return dropped.error();
  std::erase(temporary_slots_, command.slot_name);
  hubs_.walsenders().changed();
  co_await run_blocking(hubs_.blocking(), [this] {
    hubs_.walsenders().sync_mirror();
    return true;
  });
  append_command_complete(out, "DROP_REPLICATION_SLOT");
  co_return Status{};
}

upstream::awaitable<Result<ReplicationHub*>> ReplicationSession::open_hub() {
  co_return co_await run_blocking(hubs_.blocking(),
                                  [this] { return hubs_.open(std::string(startup_.database())); });
}

upstream::awaitable<Result<WalsenderView>> ReplicationSession::load_view(
    ReplicationHub& hub, const pgoutput::PgoutputOptions& options,
    const log::PublicationsChange& change) {
  // A follower's sessions read the primary's catalog from its facts; one with an upstream
  // reads it there until the facts have come.
  PrimaryFacts* facts = context_.primary_facts;
  if (facts != nullptr && context_.upstream && !facts->parameters()) facts = nullptr;
  auto loaded = co_await run_blocking(hub.blocking(), [&]() -> Result<log::ViewOptions> {
    if (change.after) {
      return publication_view_at(*change.after, options.publication_names, options.messages);
    }
    if (facts != nullptr) {
      // A follower's: the primary's catalog as its log stands, no upstream asked.
      auto catalog = facts->catalog();
      if (!catalog.ok()) return catalog.error();
      if (!*catalog) {
        return Error::make(sqlstate::kFeatureNotSupported,
                           "the follower has no publications catalog from its primary",
                           "The primary publishes it only from a PostgreSQL 15 or later "
                           "upstream. Stream from the primary pgrelay instead.");
      }
      return publication_view_at(**catalog, options.publication_names, options.messages);
    }
    if (!context_.upstream) return upstream_absent("reading publications");
    const std::string conninfo = context_.upstream->conninfo(startup_.database());
    auto conn = hub.side_connections().acquire(conninfo);
    if (!conn.ok()) return conn.error();
    if (change.xid) PGRELAY_TRY(wait_until_visible(conn->get(), *change.xid, kChangeVisibleWait));
    return load_publication_view(conn->get(), options.publication_names, options.messages);
  });
  if (!loaded.ok() && loaded.error().sqlstate == sqlstate::kUndefinedObject) {
    // A publication missing (dropped, perhaps made again before the next change): Postgres 15
    // fails at the next change it decodes (walsender.h says what a START makes of it).
    log::ViewOptions refusing;
    refusing.operations = options.messages ? log::kOpMessage : 0;
    refusing.refused = loaded.error();
    loaded = std::move(refusing);
  }
  if (!loaded.ok()) co_return loaded.error();
  WalsenderView view;
  view.options = std::move(*loaded);
  // Sessions naming the same publications with the same options see the same messages.
  std::vector<std::string> names = options.publication_names;
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const auto& pub : names) view.key += pub + '\n';
  view.key += options.messages ? "messages" : "no messages";
  view.key += options.origin == pgoutput::OriginFilter::kNone ? "|origin none" : "|origin any";
  // Binary mode sends other bytes for the same values: its entries are cached apart.
  view.key += options.binary ? "|binary" : "|text";
  // What the publications said when read (tables, column lists, row filters): sessions that
  // read them before and after an ALTER PUBLICATION must not share bytes.
  if (view.options.publications) view.key += '\n' + view.options.publications->key();
  if (view.options.refused) view.key += "\nrefused: " + view.options.refused->message;
  co_return view;
}

upstream::awaitable<Status> ReplicationSession::start_replication(
    const pgoutput::StartReplication& command, Bytes& out) {
  if (command.kind == pgoutput::SlotKind::kPhysical) {
    co_return Error::make(sqlstate::kFeatureNotSupported,
                          "pgrelay does not serve physical replication",
                          "Use START_REPLICATION SLOT name LOGICAL lsn (options).");
  }
  const std::string& name = *command.slot_name;
  auto slot = hubs_.slots().get(name);
  if (!slot) co_return Error::make(sqlstate::kUndefinedObject, slot_not_found(name));
  if (slot->database != startup_.database()) {
    co_return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                          "replication slot \"" + name + "\" was not created in this database");
  }
  auto opened = co_await open_hub();
  if (!opened.ok()) co_return opened.error();
  ReplicationHub& hub = **opened;
  PGRELAY_CO_TRY(hubs_.slots().check_usable(name));
  auto options = pgoutput::pgoutput_options_for_start(command.options);
  if (!options.ok()) co_return options.error();
  PGRELAY_CO_TRY(hubs_.slots().acquire(name, pid_));

  auto view = co_await load_view(hub, *options);
  if (!view.ok()) {
    (void)hubs_.slots().release(name);
    co_return view.error();
  }
  hubs_.walsenders().changed();

  WalsenderParams params;
  params.slot = name;
  params.requested_start = command.start;
  params.options = *options;
  params.view = std::move(*view);
  if (options->binary) {
    // The upstream's send functions make binary values.
    if (!context_.upstream) {
      (void)hubs_.slots().release(name);
      co_return upstream_absent("binary mode (its send functions make the binary values)");
    }
    params.binary_conninfo = context_.upstream->conninfo(startup_.database());
  }
  params.reload_view = [this, &hub, options = *options](const log::PublicationsChange& change) {
    return load_view(hub, options, change);
  };
  params.timeout = context_.settings.wal_sender_timeout;
  params.info.pid = pid_;
  params.info.user = user_.name;
  if (auto app = startup_.find("application_name")) params.info.application_name = *app;
  if (auto peer = client_.transport().peer_endpoint()) {
    params.info.client_addr = peer->address().to_string();
    params.info.client_port = peer->port();
  }
  params.info.backend_start = log::now_pg_micros();
  params.logger = context_.logger;
  params.progress_interval = context_.settings.catch_up_report_interval;
  log_to(context_.logger, LogLevel::kInfo, "starting logical decoding for slot",
         {{"slot", name},
          {"start_lsn", command.start.to_string()},
          {"user", user_.name},
          {"application_name", params.info.application_name}});
  auto streamed = co_await run_walsender(client_, hub, std::move(params));
  (void)hubs_.slots().release(name);
  (void)hubs_.slots().flush();
  hubs_.walsenders().changed();
  if (!streamed.ok()) co_return streamed.error();
  if (*streamed == StreamEnd::kShutdown) {
    co_return Error::make(kQuietClose, "server shutdown");
  }
  // After CopyDone: the COPY ends, then the command, as Postgres's walsender reports them.
  append_command_complete(out, "COPY 0");
  append_command_complete(out, "START_REPLICATION");
  co_return Status{};
}

}  // namespace

upstream::awaitable<void> run_replication_session(upstream::MessageStream& client,
                                                  const wire::StartupMessage& startup,
                                                  const User& user, ServerContext& context) {
  ReplicationSession session(client, startup, user, context);
  co_await session.run();
}

}  // namespace pgrelay::server
