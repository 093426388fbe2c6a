// Starts trigger capture for `serve` and presents it to the server as a CaptureLink.
#include "cli/capture_link.h"

#include <filesystem>

namespace pgrelay::cli {

Result<std::unique_ptr<TriggerCaptureLink>> TriggerCaptureLink::start(
    const upstream::UpstreamConfig& upstream, const std::string& schema,
    const std::string& data_dir, log::ChangeLog& log) {
  capture::CaptureServiceOptions options;
  options.poller.conninfo = upstream.conninfo();
  options.poller.schema = schema;
  options.poller.spill_dir = data_dir + "/spill";
  std::error_code ec;
  std::filesystem::create_directories(options.poller.spill_dir, ec);
  options.install.schema = schema;
  // Every publication of the database, now and later: consumers pick theirs when they start.
  options.install.all_publications = true;
  auto service = capture::CaptureService::start(std::move(options), log);
  if (!service.ok()) return service.error();
  return std::unique_ptr<TriggerCaptureLink>(new TriggerCaptureLink(std::move(*service)));
}

Result<server::ExportedSnapshot> TriggerCaptureLink::export_snapshot() {
  auto exported = service_->export_snapshot();
  if (!exported.ok()) return exported.error();
  server::ExportedSnapshot out;
  out.holder = std::shared_ptr<capture::PgSession>(std::move(exported->holder));
  out.name = std::move(exported->snapshot_name);
  out.consistent_point = exported->consistent_point;
  return out;
}

Result<wire::Lsn> TriggerCaptureLink::sync() {
  return service_->sync();
}

}  // namespace pgrelay::cli
