// What a follower serves: the log it rebuilds from the primary's stream, that log shown to the
// replication hubs as the database's capture, and the primary's facts its sessions answer with.
#include "cli/followed_database.h"

#include "log/change_view.h"

namespace pgrelay::cli {

Result<server::ExportedSnapshot> FollowerLink::export_snapshot() {
  return Error::make(sqlstate::kFeatureNotSupported, "a pgrelay follower cannot export a snapshot",
                     "Its log trails the upstream by the stream's delay, so no snapshot of the "
                     "upstream matches a position in it. Create the slot with NOEXPORT_SNAPSHOT "
                     "(pg_recvlogical does), or create it on the primary pgrelay, which exports "
                     "one; a consumer may move to a follower later and resume at its LSN.");
}

Result<wire::Lsn> FollowerLink::sync() {
  return log_.last_end_lsn();
}

Result<std::shared_ptr<FollowedDatabase>> FollowedDatabase::start(const std::string& data_dir,
                                                                  capture::FollowerOptions options,
                                                                  Logger& logger) {
  std::shared_ptr<FollowedDatabase> out(new FollowedDatabase());
  out->database_ = options.database;
  log::LogOptions log_options;
  log_options.dir = data_dir + "/log";
  auto opened = log::ChangeLog::open(log_options);
  if (!opened.ok()) return opened.error();
  out->log_ = std::move(*opened);
  out->link_ = std::make_unique<FollowerLink>(*out->log_);
  auto follower = capture::StreamFollower::make(std::move(options), *out->log_, logger);
  if (!follower.ok()) return follower.error();
  out->follower_ = std::move(*follower);
  out->follower_->start();
  return out;
}

FollowedDatabase::~FollowedDatabase() {
  if (follower_) follower_->stop();
}

server::CapturedParts FollowedDatabase::parts(std::shared_ptr<FollowedDatabase> self) {
  server::CapturedParts parts;
  parts.log = log_.get();
  parts.capture = link_.get();
  parts.owner = std::move(self);
  return parts;
}

std::optional<server::StartupParameters> FollowedDatabase::parameters() const {
  auto facts = follower_->server_facts();
  if (!facts) return std::nullopt;
  return facts->parameters;
}

Result<std::optional<std::string>> FollowedDatabase::catalog() {
  auto facts = follower_->server_facts();
  if (!facts) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "the follower has not read its primary's server facts from the stream",
                       "Wait until it has connected to NATS (pgrelay status), or give it "
                       "--upstream URL to read publications there.");
  }
  // The primary read them when its log ended at as_of; its markers carry every change since.
  auto marker = log::last_publications_change(*log_, facts->as_of + 1);
  if (!marker.ok()) return marker.error();
  if (*marker && (*marker)->after) return std::optional<std::string>(*(*marker)->after);
  return facts->catalog;
}

}  // namespace pgrelay::cli
