// The composition root of `pgrelay serve`: its parts, owned in start order, stopped in reverse.
#include "cli/relay.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>

#include "base/child_process.h"
#include "base/strings.h"
#include "cli/primary_facts_reader.h"
#include "log/file_util.h"
#include "server/tls_setup.h"
#include "upstream/virtual_catalog.h"
#include "wire/replication_frames.h"
#include "wire/scram.h"
#include "zero/zero_environment.h"

namespace pgrelay::cli {

namespace {

// Percent-encodes a URL component (user, password, database name).
std::string url_encode(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buffer[4];
      std::snprintf(buffer, sizeof buffer, "%%%02X", c);
      out += buffer;
    }
  }
  return out;
}

// The NATS publisher's figures for /metrics, read at scrape time.
void publish_nats_metrics(server::MetricWriter& out, const nats::PublisherFigures& figures,
                          const std::string& stream) {
  const server::MetricLabels labels = {{"stream", stream}};
  out.gauge({"pgrelay_nats_lag_bytes", "Log bytes not yet stored in the JetStream stream"}, labels,
            static_cast<double>(figures.lag_bytes));
  out.counter({"pgrelay_nats_published_total", "Messages the JetStream stream acknowledged"},
              labels, static_cast<double>(figures.published_messages));
  out.counter({"pgrelay_nats_published_transactions_total",
               "Transactions the JetStream stream holds whole since the start"},
              labels, static_cast<double>(figures.published_transactions));
  out.gauge({"pgrelay_nats_published_lsn", "Commit LSN of the last transaction published whole"},
            labels, static_cast<double>(figures.published_commit_lsn.value()));
  for (const char* reason : {"connection", "publish", "ack_timeout", "wrong_last_sequence",
                             "duplicate", "stream_full", "message_too_large", "no_responders"}) {
    auto it = figures.errors.find(reason);
    out.counter({"pgrelay_nats_errors_total", "NATS publishing failures, by reason"},
                {{"stream", stream}, {"reason", reason}},
                it == figures.errors.end() ? 0.0 : static_cast<double>(it->second));
  }
}

// The slots' lag and the walsenders, beside the databases' log heads.
void publish_slot_metrics(server::MetricWriter& out, server::ReplicationHubs& hubs,
                          std::map<std::string, wire::Lsn>& heads) {
  for (const auto& slot : hubs.slots().list()) {
    const std::uint64_t head = heads[slot.database].value();
    std::uint64_t lag =
        head > slot.confirmed_flush.value() ? head - slot.confirmed_flush.value() : 0;
    out.gauge({"pgrelay_slot_lag_bytes", "Log bytes past the slot's confirmed_flush_lsn"},
              {{"slot", slot.name}, {"database", slot.database}}, static_cast<double>(lag));
    out.gauge({"pgrelay_slot_active", "1 while a walsender streams the slot"},
              {{"slot", slot.name}, {"database", slot.database}}, slot.active_pid != 0 ? 1.0 : 0.0);
  }
  out.gauge({"pgrelay_walsenders", "Replication streams being served"}, {},
            static_cast<double>(hubs.walsenders().list().size()));
}

// A log's size and head.
void publish_log_metrics(server::MetricWriter& out, const server::MetricLabels& labels,
                         const log::LogStats& log, wire::Lsn head) {
  out.gauge({"pgrelay_log_size_bytes", "Bytes of change log on disk"}, labels,
            static_cast<double>(log.total_bytes));
  out.gauge({"pgrelay_log_segments", "Segments of the change log"}, labels,
            static_cast<double>(log.segments));
  out.gauge({"pgrelay_log_head_lsn", "End of the last logged transaction, as a number"}, labels,
            static_cast<double>(head.value()));
}

// A follower's progress through the stream, and its log.
void publish_follower_metrics(server::MetricWriter& out, FollowedDatabase& followed,
                              server::ReplicationHubs& hubs) {
  const capture::FollowerFigures figures = followed.figures();
  const server::MetricLabels labels = {{"database", followed.database()}};
  out.gauge({"pgrelay_follower_applied_seq",
             "The stream sequence the follower's log holds everything up to"},
            labels, static_cast<double>(figures.applied_seq));
  out.gauge({"pgrelay_follower_pending_messages",
             "Transaction messages of the stream the follower has not read yet"},
            labels, static_cast<double>(figures.pending_messages));
  out.counter({"pgrelay_follower_entries_total", "Transactions appended from the stream"}, labels,
              static_cast<double>(figures.entries));
  for (const char* reason : {"connection", "stream"}) {
    auto it = figures.errors.find(reason);
    out.counter({"pgrelay_follower_errors_total", "Failures to follow the stream, by reason"},
                {{"database", followed.database()}, {"reason", reason}},
                it == figures.errors.end() ? 0.0 : static_cast<double>(it->second));
  }
  const wire::Lsn head = followed.log().last_end_lsn();
  publish_log_metrics(out, labels, followed.log().stats(), head);
  std::map<std::string, wire::Lsn> heads = {{followed.database(), head}};
  publish_slot_metrics(out, hubs, heads);
}

// The values /metrics reads at scrape time beside the server's own counters.
void publish_metrics(server::MetricWriter& out, const std::vector<DatabaseFigures>& databases,
                     server::ReplicationHubs& hubs) {
  std::map<std::string, wire::Lsn> heads;
  for (const auto& db : databases) {
    const server::MetricLabels labels = {{"database", db.database}};
    out.counter({"pgrelay_captured_transactions_total", "Transactions captured into the log"},
                labels, static_cast<double>(db.capture.transactions));
    out.counter({"pgrelay_captured_changes_total", "Row changes captured into the log"}, labels,
                static_cast<double>(db.capture.rows));
    out.counter({"pgrelay_capture_reconnects_total", "Times capture reconnected to the upstream"},
                labels, static_cast<double>(db.capture.reconnects));
    out.counter({"pgrelay_captured_streamed_transactions_total",
                 "Transactions native capture took in while they still ran upstream"},
                labels, static_cast<double>(db.capture.streamed));
    if (db.capture.last_appended_at != 0) {
      out.gauge({"pgrelay_capture_last_commit_timestamp_seconds",
                 "Upstream commit time (Unix seconds) of the last transaction captured into the "
                 "log"},
                labels,
                static_cast<double>(wire::pg_to_unix_micros(db.capture.last_commit_time)) / 1e6);
      out.gauge(
          {"pgrelay_capture_delay_seconds",
           "Seconds from the upstream commit of the last transaction captured to its "
           "append to the log"},
          labels,
          static_cast<double>(db.capture.last_appended_at - db.capture.last_commit_time) / 1e6);
    }
    publish_log_metrics(out, labels, db.log, db.head);
    heads[db.database] = db.head;
  }
  publish_slot_metrics(out, hubs, heads);
}

}  // namespace

Relay::Relay(const ServeOptions& options, ServePlan plan, Logger& logger, const LineTail* log_tail)
    : options_(options),
      plan_(std::move(plan)),
      logger_(logger),
      log_tail_(log_tail),
      rewriter_(server::RewriteOptions{options.schema}) {}

Relay::~Relay() {
  // The catalog workers read the hubs: they stop before anything else goes.
  if (captures_) captures_->stop_workers();
}

Result<std::unique_ptr<Relay>> Relay::start(const ServeOptions& options, ServePlan plan,
                                            Logger& logger, const LineTail* log_tail) {
  std::unique_ptr<Relay> relay(new Relay(options, std::move(plan), logger, log_tail));
  auto pid_file = PidFile::acquire(options.data_dir);
  if (!pid_file.ok()) return pid_file.error();
  relay->pid_file_.emplace(std::move(*pid_file));
  PGRELAY_TRY(relay->start_upstream());
  PGRELAY_TRY(relay->open_slots());
  PGRELAY_TRY(relay->plan_.follow ? relay->start_follower() : relay->start_captures());
  PGRELAY_TRY(relay->start_publisher());
  PGRELAY_TRY(relay->configure_sessions());
  PGRELAY_TRY(relay->install_catalog());
  PGRELAY_TRY(relay->start_listener());
  PGRELAY_TRY(relay->start_metrics());
  relay->handle_signals();
  relay->announce_ready();
  PGRELAY_TRY(relay->start_zero());
  PGRELAY_TRY(relay->start_admin());
  return relay;
}

Status Relay::start_upstream() {
  if (plan_.upstream) {
    upstream_ = *plan_.upstream;
    return {};
  }
  if (upstream_absent()) {
    // A follower without --upstream starts nothing: its database and the name clients log in
    // with stand where the URL's would.
    upstream_.dbname = plan_.follow->database;
    upstream_.user = plan_.users->front().name;
    return {};
  }
  upstream::EmbeddedOptions embedded_options;
  embedded_options.data_dir = options_.data_dir;
  embedded_options.bin_dir = options_.pg_bin;
  embedded_options.run_as = options_.run_as;
  // Native capture decodes the private instance's WAL; trigger capture needs no more than
  // replica.
  embedded_options.logical_decoding = capture_mode(options_) != "trigger";
  embedded_options.on_event = [this](const std::string& text) { logger_.info(text); };
  auto started = upstream::EmbeddedPostgres::start(std::move(embedded_options));
  if (!started.ok()) return started.error();
  embedded_ = std::move(*started);
  for (const auto& database : options_.databases) {
    PGRELAY_TRY(embedded_->ensure_database(database));
  }
  auto upstream = upstream::UpstreamConfig::parse(embedded_->conninfo("postgres"));
  if (!upstream.ok()) return upstream.error();
  upstream_ = std::move(*upstream);
  return {};
}

Status Relay::open_slots() {
  // The slots of every database live beside the first database's log, as they always did.
  const std::string slots_dir = options_.data_dir + "/log";
  PGRELAY_TRY(log::ensure_directory(options_.data_dir));
  PGRELAY_TRY(log::ensure_directory(slots_dir));
  log::SlotRegistryOptions slot_options;
  slot_options.max_slots = static_cast<std::size_t>(options_.max_replication_slots);
  slot_options.persist_every = 0;
  slot_options.persist_interval = std::chrono::milliseconds(1000);
  auto slots = log::SlotRegistry::open(slots_dir, slot_options);
  if (!slots.ok()) return slots.error();
  slots_ = std::move(*slots);
  return {};
}

Status Relay::start_captures() {
  if (!options_.hop_trace.empty()) {
    hop_trace_ = std::make_unique<HopTrace>();
    // Written (empty) now, so that a path it cannot be written to is refused at start, not after
    // the run it was to trace.
    PGRELAY_TRY(hop_trace_->write(options_.hop_trace));
  }
  captures_ =
      std::make_unique<DatabaseCaptures>(options_, upstream_, io_, logger_, hop_trace_.get());
  DatabaseCaptures& captures = *captures_;
  hubs_ = std::make_unique<server::ReplicationHubs>(
      io_.get_executor(), blocking_, *slots_, upstream_,
      server::CaptureScope(upstream_.dbname, options_.capture_databases),
      [&captures](const std::string& database) { return captures.start(database); },
      [&captures](const std::string& database, const std::optional<Error>& refusal) {
        captures.prepare(database, refusal);
      },
      [&captures](const std::string& database) { captures.forget(database); });
  captures.attach(*hubs_);
  hubs_->walsenders().on_change([&captures] { captures.refresh_all(); });
  hubs_->walsenders().on_mirror_sync([&captures] { captures.flush_all(); });

  // The upstream URL's database is captured from the start; a failure there ends the run.
  PGRELAY_TRY(hubs_->open(upstream_.dbname));
  // So is every other database an earlier run captured (its slots must keep streaming). One
  // that cannot be captured now is said and left out: its slots get its capture error.
  if (auto noted = captures.note_scope(hubs_->scope()); !noted.ok()) {
    logger_.error(noted.error());
  }
  for (const auto& database : captures.captured_before()) {
    if (database == upstream_.dbname || !hubs_->scope().admits(database)) continue;
    if (auto other = hubs_->open(database); !other.ok()) {
      logger_.warning(
          "could not capture a database captured before",
          {{"database", database}, {"error", other.error().message}, {"hint", other.error().hint}});
    }
  }
  return {};
}

Status Relay::start_follower() {
  const std::string database = plan_.follow->database;
  auto followed = FollowedDatabase::start(options_.data_dir, *plan_.follow, logger_);
  if (!followed.ok()) return followed.error();
  followed_ = std::move(*followed);
  logger_.info("following the change log published to NATS JetStream",
               {{"servers", nats::redact_urls(plan_.follow->connect.urls)},
                {"stream", plan_.follow->stream},
                {"database", database},
                {"log_head", followed_->log().last_end_lsn().to_string()}});
  std::weak_ptr<FollowedDatabase> weak = followed_;
  hubs_ = std::make_unique<server::ReplicationHubs>(
      io_.get_executor(), blocking_, *slots_, upstream_, server::CaptureScope(database, {}),
      [weak](const std::string&) -> Result<server::CapturedParts> {
        auto self = weak.lock();
        if (!self) return Error::make(sqlstate::kInternalError, "the follower has stopped");
        return self->parts(self);
      });
  auto opened = hubs_->open(database);
  if (!opened.ok()) return opened.error();
  return {};
}

Status Relay::start_publisher() {
  if (!plan_.nats) return {};
  server::ReplicationHub* hub = hubs_->find(upstream_.dbname);
  if (hub == nullptr) {
    return Error::make(sqlstate::kInternalError, "the upstream URL's database is not captured");
  }
  nats::PublisherOptions options = *plan_.nats;
  options.database = upstream_.dbname;
  options.state_dir = options_.data_dir;
  options.read_server_facts = [conninfo = upstream_.conninfo()] {
    return read_primary_facts(conninfo);
  };
  publisher_ = std::make_unique<nats::Publisher>(std::move(options), hub->log(), logger_);
  publisher_->start();
  logger_.info("publishing the change log to NATS JetStream",
               {{"servers", nats::redact_urls(plan_.nats->connect.urls)},
                {"stream", plan_.nats->stream},
                {"subjects", plan_.nats->subject_prefix + "." + upstream_.dbname + ".>"}});
  if (hubs_->captured().size() > 1) {
    logger_.warning("only the upstream URL's database is published to NATS",
                    {{"database", upstream_.dbname},
                     {"hint",
                      "Other captured databases are served to replication sessions but "
                      "not published; run one pgrelay per database to publish each."}});
  }
  return {};
}

Status Relay::configure_sessions() {
  context_.logger = &logger_;
  context_.metrics = &metrics_;
  if (!upstream_absent()) context_.upstream = upstream_;
  context_.hubs = hubs_.get();
  context_.primary_facts = followed_.get();
  context_.settings.wal_sender_timeout = std::chrono::seconds(options_.wal_sender_timeout_seconds);
  context_.auth.timeout = std::chrono::seconds(options_.authentication_timeout_seconds);
  context_.settings.max_wal_senders = options_.max_wal_senders;
  context_.settings.max_replication_slots = options_.max_replication_slots;
  if (!upstream_absent()) {
    PGRELAY_TRY(relay_loop_.start());
    context_.relay_loop = &relay_loop_;
    if (options_.pool_idle_timeout_seconds > 0) {
      server::BackendPool::Settings pool;
      pool.idle_timeout = std::chrono::seconds(options_.pool_idle_timeout_seconds);
      backend_pool_ = std::make_unique<server::BackendPool>(io_.get_executor(), pool, &metrics_);
      backend_pool_->start();
      context_.backend_pool = backend_pool_.get();
    }
  }

  // Clients log in as the upstream's user, with its password, unless a users file says who.
  if (plan_.users) {
    context_.auth.users = *plan_.users;
  } else {
    server::User user{upstream_.user, "", true};
    if (!upstream_.password.empty()) {
      auto verifier = wire::ScramVerifier::from_password(upstream_.password);
      if (!verifier.ok()) return verifier.error();
      user.secret = verifier->to_string();
    }
    context_.auth.users.push_back(user);
  }
  auto mock = wire::random_bytes(32);
  if (mock.ok()) context_.auth.mock_secret = *mock;
  // Without a password only loopback clients may enter (trust); with one, SCRAM everywhere.
  if (upstream_.password.empty() && !plan_.users) {
    context_.auth.default_method = server::AuthMethod::kReject;
    for (const char* loopback : {"127.0.0.0/8", "::1/128"}) {
      context_.auth.rules.push_back(
          {*server::parse_auth_network(loopback), server::AuthMethod::kTrust});
    }
  }
  context_.auth.rules.insert(context_.auth.rules.begin(), plan_.auth_rules.begin(),
                             plan_.auth_rules.end());
  for (const auto& rule : plan_.trusting_rules) {
    logger_.warning("trust authentication admits anyone from this network", {{"rule", rule}});
  }

  if (!options_.no_tls) {
    std::string cert =
        options_.tls_cert.empty() ? options_.data_dir + "/tls/server.crt" : options_.tls_cert;
    std::string key =
        options_.tls_key.empty() ? options_.data_dir + "/tls/server.key" : options_.tls_key;
    if (options_.tls_cert.empty()) {
      PGRELAY_TRY(server::ensure_self_signed_certificate(cert, key, "pgrelay"));
    }
    auto tls = server::make_server_tls(cert, key);
    if (!tls.ok()) return tls.error();
    server_tls_ = std::move(*tls);
    context_.server_tls = server_tls_.get();
  }
  auto upstream_tls = server::make_upstream_tls(upstream_);
  if (!upstream_tls.ok()) return upstream_tls.error();
  upstream_tls_ = std::move(*upstream_tls);
  context_.upstream_tls = upstream_tls_.get();

  // A follower's slots are its own, and the upstream's catalog holds the primary's: its
  // sessions see the upstream's catalog unchanged.
  if (plan_.follow) return {};
  context_.rewrite = [this](const std::string_view sql,
                            const server::StatementSource& source) -> std::optional<std::string> {
    auto rewritten = rewriter_.rewrite(sql, source);  // tests may_need_rewrite first
    if (!rewritten.ok()) return std::nullopt;
    return *rewritten;
  };
  return {};
}

Status Relay::install_catalog() {
  if (plan_.follow) return {};  // the upstream's catalog schema is the primary's
  // The first database's catalog is there before clients come; a failure to install it ends
  // the run (elsewhere it is a warning: pgrelay serves those databases without it).
  auto catalog = upstream::VirtualCatalog::open(upstream_.conninfo(), options_.schema);
  if (!catalog.ok()) return catalog.error();
  PGRELAY_TRY((*catalog)->install());
  catalog->reset();
  for (const auto& database : hubs_->captured()) hubs_->prepare(database);
  return {};
}

Status Relay::start_listener() {
  server_ = std::make_unique<server::Server>(io_, context_);
  auto bound = server_->listen(plan_.listen.first, plan_.listen.second);
  if (!bound.ok()) return bound.error();
  port_ = bound->port();
  server_->start();
  return {};
}

Status Relay::start_metrics() {
  // Scrape-time values for /metrics (on the io thread).
  metrics_.add_collector([this](server::MetricWriter& out) {
    if (captures_) publish_metrics(out, captures_->figures(), *hubs_);
    if (followed_) publish_follower_metrics(out, *followed_, *hubs_);
    if (publisher_) publish_nats_metrics(out, publisher_->figures(), options_.nats_stream);
  });
  if (!plan_.metrics) return {};
  metrics_endpoint_ =
      std::make_unique<server::MetricsEndpoint>(io_, [this] { return metrics_.render(); });
  PGRELAY_TRY(metrics_endpoint_->listen(plan_.metrics->first, plan_.metrics->second));
  metrics_endpoint_->start();
  logger_.info("serving metrics", {{"address", options_.metrics}, {"path", "/metrics"}});
  return {};
}

void Relay::handle_signals() {
  signals_.async_wait([this](const std::error_code& error, int) {
    if (error) return;
    if (!admin_ && !zero_) return shut_down();
    // The admin page and zero-cache stop first, off the loop: a page's request may wait on
    // zero-cache (a reset), and zero-cache ends its sessions while pgrelay still serves them.
    asio::post(blocking_, [this] {
      if (admin_) admin_->stop();
      admin_sampler_.stop();
      if (zero_) {
        logger_.info("stopping zero-cache");
        zero_->stop();
      }
      asio::post(io_, [this] { shut_down(); });
    });
  });
}

void Relay::shut_down() {
  logger_.info("shutting down", {{"sessions", server_->session_count()}});
  server_->stop_accepting();
  hubs_->walsenders().stop_all();
  context_.shutdown.trigger();
  relay_loop_.recall_all();  // its sessions go back to their coroutines, which end them
  if (backend_pool_) backend_pool_->stop();
  shutdown_deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  wait_for_sessions();
}

void Relay::wait_for_sessions() {
  if (server_->session_count() == 0 || std::chrono::steady_clock::now() >= shutdown_deadline_) {
    server_->stop();
    if (metrics_endpoint_) metrics_endpoint_->stop();
    io_.stop();
    return;
  }
  shutdown_timer_.expires_after(std::chrono::milliseconds(50));
  shutdown_timer_.async_wait([this](const std::error_code&) { wait_for_sessions(); });
}

std::string Relay::client_host() const {
  const std::string& listen_host = plan_.listen.first;
  std::string host = listen_host == "0.0.0.0" || listen_host == "::" ? "127.0.0.1" : listen_host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return host;
}

std::string Relay::upstream_description() const {
  return upstream_absent() ? "none (a follower without --upstream)" : upstream_.describe();
}

std::string Relay::client_url(const std::string& database) const {
  std::string url = "postgres://" + url_encode(upstream_.user);
  if (!upstream_.password.empty()) url += ":" + url_encode(upstream_.password);
  return url + "@" + client_host() + ":" + std::to_string(port_) + "/" + url_encode(database);
}

void Relay::announce_ready() {
  const std::string host = client_host();
  const std::string url = client_url(upstream_.dbname);
  (void)pid_file_->publish_url(url);
  std::printf("pgrelay ready: %s\n", url.c_str());
  std::fflush(stdout);
  logger_.info("ready", {{"listen", host + ":" + std::to_string(port_)},
                         {"upstream", upstream_description()},
                         {"private_postgres", embedded_ != nullptr},
                         {"follower", followed_ != nullptr},
                         {"captured_databases", join(hubs_->captured())}});
}

Status Relay::start_zero() {
  if (!plan_.zero) return {};
  const ServePlan::Zero& zero = *plan_.zero;
  std::error_code ec;
  const std::string dir = std::filesystem::absolute(options_.data_dir, ec).string() + "/zero";
  PGRELAY_TRY(log::ensure_directory(dir));
  // A Node older than the package asks for is zero-cache's to refuse or not: a warning here.
  ChildSpec node_version;
  node_version.argv = {zero.node, "--version"};
  auto version = read_child_output(node_version);
  const auto major = version.ok() ? zero::node_major_version(*version) : std::nullopt;
  const auto least = zero::least_major_version(zero.package.node_engine);
  if (!major) {
    logger_.warning("could not tell the version of " + zero.node,
                    {{"error", version.ok() ? *version : version.error().message}});
  } else if (least && *major < *least) {
    logger_.warning("zero-cache " + zero.package.version + " asks for Node " +
                        zero.package.node_engine + ", and " + zero.node + " is " +
                        version->substr(0, version->find_first_of("\r\n")),
                    {{"hint", "Install Node " + std::to_string(*least) +
                                  " or later, or give its binary with --node PATH."}});
  }
  std::vector<std::string> inherited;
  for (char** entry = environ; *entry != nullptr; ++entry) inherited.emplace_back(*entry);
  zero::ZeroSupervisorOptions supervised;
  supervised.environment =
      zero::zero_cache_environment(inherited, zero.dotenv,
                                   {{"ZERO_UPSTREAM_DB", client_url(upstream_.dbname)},
                                    {"ZERO_CVR_DB", client_url("zero_cvr")},
                                    {"ZERO_CHANGE_DB", client_url("zero_cdb")},
                                    {"ZERO_REPLICA_FILE", dir + "/replica.db"}});
  zero_replica_file_ = zero::environment_value(supervised.environment, "ZERO_REPLICA_FILE");
  zero_app_id_ = zero::environment_value(supervised.environment, "ZERO_APP_ID");
  if (zero_app_id_.empty()) zero_app_id_ = "zero";  // zero-cache's default
  if (zero.port != 0) supervised.port = zero.port;  // checked by the plan
  supervised.argv = {zero.node, zero.package.entry};
  supervised.log_path = dir + "/zero-cache.log";
  supervised.print = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  auto supervisor = zero::ZeroSupervisor::make(std::move(supervised), logger_);
  if (!supervisor.ok()) return supervisor.error();
  zero_ = std::move(*supervisor);
  logger_.info("starting zero-cache", {{"package", zero.package.dir},
                                       {"version", zero.package.version},
                                       {"node", zero.node},
                                       {"log", dir + "/zero-cache.log"}});
  zero_->start();
  return {};
}

Status Relay::start_admin() {
  if (!plan_.admin) return {};
  AdminSources sources;
  sources.upstream = upstream_description();
  sources.capture_mode = plan_.follow ? "follower" : capture_mode(options_);
  sources.data_dir = options_.data_dir;
  sources.private_postgres = embedded_ != nullptr;
  sources.captures = captures_.get();
  sources.followed = followed_.get();
  sources.hubs = hubs_.get();
  sources.zero = zero_.get();
  sources.zero_replica_file = zero_replica_file_;
  sources.zero_app_id = zero_app_id_;
  sources.pgrelay_log = log_tail_;
  admin_view_ = std::make_unique<AdminView>(std::move(sources));
  admin_view_->sample();
  admin_sampler_.start("admin-sampler", [this] {
    while (!admin_sampler_.stopping()) {
      admin_sampler_.pause(std::chrono::seconds(1));
      admin_view_->sample();
    }
  });
  admin::AdminServerOptions server_options;
  server_options.host = plan_.admin->first;
  server_options.port = plan_.admin->second;
  server_options.token = options_.admin_token;
  auto server = admin::AdminServer::start(server_options, admin_view_->handlers(), logger_);
  if (!server.ok()) {
    // The page pgrelay zero offers by default is a convenience: a second pgrelay zero on the
    // same machine goes on without it. One asked for with --admin is not optional.
    if (options_.zero && options_.admin == "127.0.0.1:6477") {
      logger_.warning(server.error().message + "; going on without the admin page",
                      {{"hint", "Give --admin another HOST:PORT."}});
      return {};
    }
    return server.error();
  }
  admin_ = std::move(*server);
  std::string host = plan_.admin->first;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  const std::string url = "http://" + host + ":" + std::to_string(admin_->port()) + "/";
  (void)pid_file_->publish_admin_url(url);
  std::printf("admin page: %s\n", url.c_str());
  std::fflush(stdout);
  logger_.info("serving the admin page", {{"url", url}, {"token", !options_.admin_token.empty()}});
  return {};
}

int Relay::run() {
  io_.run();
  if (captures_) captures_->leave_loop();
  relay_loop_.stop();
  blocking_.join();
  io_.drop_pending_work();
  (void)slots_->flush();
  if (hop_trace_) {
    if (Status written = hop_trace_->write(options_.hop_trace); !written.ok()) {
      logger_.error(written.error());
    } else {
      logger_.info("wrote the hop trace", {{"file", options_.hop_trace},
                                           {"stamps", hop_trace_->size()},
                                           {"dropped", hop_trace_->dropped()}});
    }
  }
  logger_.info("stopped");
  return 0;
}

}  // namespace pgrelay::cli
