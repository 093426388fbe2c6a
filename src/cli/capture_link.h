// Starts trigger capture for `serve` and presents it to the server as a CaptureLink.
#pragma once

#include <memory>
#include <string>

#include "base/result.h"
#include "capture/trigger/capture_service.h"
#include "log/change_log.h"
#include "server/replication_hub.h"
#include "upstream/upstream_config.h"

namespace pgrelay::cli {

class TriggerCaptureLink final : public server::CaptureLink {
 public:
  // Installs capture in `schema` upstream (every table of every publication) and starts
  // polling into `log`; stops when destroyed.
  static Result<std::unique_ptr<TriggerCaptureLink>> start(const upstream::UpstreamConfig& upstream,
                                                           const std::string& schema,
                                                           const std::string& data_dir,
                                                           log::ChangeLog& log);

  Result<server::ExportedSnapshot> export_snapshot() override;
  Result<wire::Lsn> sync() override;

  capture::CaptureService::Stats stats() const { return service_->stats(); }
  const capture::InstallReport& install_report() const { return service_->install_report(); }

 private:
  explicit TriggerCaptureLink(std::unique_ptr<capture::CaptureService> service)
      : service_(std::move(service)) {}
  std::unique_ptr<capture::CaptureService> service_;
};

}  // namespace pgrelay::cli
