// Starts `serve`'s capture (trigger or native) and presents it to the server as a CaptureLink.
#include "cli/capture_link.h"

#include <filesystem>

namespace pgrelay::cli {
namespace {

std::string make_spill_dir(const std::string& data_dir) {
  std::string dir = data_dir + "/spill";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return dir;
}

server::ExportedSnapshot to_server(capture::ExportedSnapshot exported) {
  server::ExportedSnapshot out;
  out.holder = std::shared_ptr<capture::PgSession>(std::move(exported.holder));
  out.name = std::move(exported.snapshot_name);
  out.consistent_point = exported.consistent_point;
  return out;
}

}  // namespace

Result<std::unique_ptr<TriggerCaptureLink>> TriggerCaptureLink::start(
    const upstream::UpstreamConfig& upstream, const std::string& schema,
    const std::string& data_dir, log::ChangeLog& log) {
  capture::CaptureServiceOptions options;
  options.poller.conninfo = upstream.conninfo();
  options.poller.schema = schema;
  options.poller.spill_dir = make_spill_dir(data_dir);
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
  return to_server(std::move(*exported));
}

Result<wire::Lsn> TriggerCaptureLink::sync() {
  return service_->sync();
}

CaptureFigures TriggerCaptureLink::figures() const {
  auto stats = service_->stats();
  CaptureFigures figures{stats.transactions, stats.rows, stats.reconnects, stats.last_error, 0};
  if (stats.commit_times) {
    figures.last_commit_time = stats.last_commit_time;
    figures.last_appended_at = stats.last_appended_at;
  }
  return figures;
}

std::string native_slot_name(std::uint64_t system_id) {
  return "pgrelay_" + std::to_string(system_id);
}

Result<std::unique_ptr<NativeCaptureLink>> NativeCaptureLink::start(
    const upstream::UpstreamConfig& upstream, const std::string& schema,
    const std::string& data_dir, log::ChangeLog& log, log::InProgressTransactions& in_progress,
    Logger* logger, std::shared_ptr<capture::ReadingLoop> loop) {
  capture::NativeCaptureOptions options;
  options.loop = std::move(loop);
  options.in_progress = &in_progress;
  options.logger = logger;
  options.conninfo = upstream.conninfo();
  options.schema = schema;
  options.slot = native_slot_name(log.system_id());
  options.spill_dir = make_spill_dir(data_dir);
  auto capture = capture::NativeCapture::start(std::move(options), log);
  if (!capture.ok()) return capture.error();
  return std::unique_ptr<NativeCaptureLink>(new NativeCaptureLink(std::move(*capture)));
}

Result<server::ExportedSnapshot> NativeCaptureLink::export_snapshot() {
  auto exported = capture_->export_snapshot();
  if (!exported.ok()) return exported.error();
  return to_server(std::move(*exported));
}

Result<wire::Lsn> NativeCaptureLink::sync() {
  return capture_->sync();
}

CaptureFigures NativeCaptureLink::figures() const {
  auto stats = capture_->stats();
  CaptureFigures figures{stats.transactions, stats.rows, stats.reconnects, stats.last_error,
                         stats.streamed};
  figures.last_commit_time = stats.last_commit_time;
  figures.last_appended_at = stats.last_appended_at;
  return figures;
}

}  // namespace pgrelay::cli
