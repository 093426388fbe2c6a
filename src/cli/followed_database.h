// What a follower serves: the log it rebuilds from the primary's stream, that log shown to the
// replication hubs as the database's capture, and the primary's facts its sessions answer with.
#pragma once

#include <memory>
#include <string>

#include "base/logger.h"
#include "base/result.h"
#include "capture/follower/stream_follower.h"
#include "log/change_log.h"
#include "server/primary_facts.h"
#include "server/replication_hub.h"
#include "server/replication_hubs.h"

namespace pgrelay::cli {

// The capture as a follower's replication sessions see it. A follower's log lags the upstream
// by however far the stream is behind, so no upstream snapshot matches a position in it: slots
// are created without one (NOEXPORT_SNAPSHOT), at the log's head.
class FollowerLink final : public server::CaptureLink {
 public:
  explicit FollowerLink(log::ChangeLog& log) : log_(log) {}
  // 0A000, naming NOEXPORT_SNAPSHOT and the primary, which can export one.
  Result<server::ExportedSnapshot> export_snapshot() override;
  // The log's head: every later entry a slot created now streams comes after it.
  Result<wire::Lsn> sync() override;

 private:
  log::ChangeLog& log_;
};

class FollowedDatabase final : public server::PrimaryFacts {
 public:
  // Opens DATA_DIR/log (a follower's, or empty) and starts following into it.
  static Result<std::shared_ptr<FollowedDatabase>> start(const std::string& data_dir,
                                                         capture::FollowerOptions options,
                                                         Logger& logger);
  ~FollowedDatabase() override;
  FollowedDatabase(const FollowedDatabase&) = delete;
  FollowedDatabase& operator=(const FollowedDatabase&) = delete;

  const std::string& database() const { return database_; }
  log::ChangeLog& log() { return *log_; }
  capture::FollowerFigures figures() const { return follower_->figures(); }
  // For the hubs' CaptureStarter: the log and link, kept alive by `self`.
  server::CapturedParts parts(std::shared_ptr<FollowedDatabase> self);

  // The primary's facts, as the stream last gave them.
  std::optional<server::StartupParameters> parameters() const override;
  // The facts' catalog, or that of the last publications marker the log holds after them.
  Result<std::optional<std::string>> catalog() override;

 private:
  FollowedDatabase() = default;
  std::string database_;
  std::unique_ptr<log::ChangeLog> log_;
  std::unique_ptr<FollowerLink> link_;
  std::unique_ptr<capture::StreamFollower> follower_;  // writes to log_: stops first
};

}  // namespace pgrelay::cli
