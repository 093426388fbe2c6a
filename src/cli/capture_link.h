// Starts `serve`'s capture (trigger or native) and presents it to the server as a CaptureLink.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/result.h"
#include "capture/native/native_capture.h"
#include "capture/trigger/capture_service.h"
#include "log/change_log.h"
#include "server/replication_hub.h"
#include "upstream/upstream_config.h"

namespace pgrelay::cli {

// What /metrics and the startup log report of either capture.
struct CaptureFigures {
  std::uint64_t transactions = 0, rows = 0, reconnects = 0;
  std::string last_error;
  // Of `transactions`, those native capture took in while they still ran upstream.
  std::uint64_t streamed = 0;
  // Of the last transaction appended to the log (microseconds since 2000-01-01; 0 before the
  // first): its upstream commit time, and when it was appended. Known only where the commit
  // time is the upstream's: always with native capture, with trigger capture only where the
  // upstream has track_commit_timestamp on (otherwise both stay 0).
  std::int64_t last_commit_time = 0, last_appended_at = 0;
};

class ServeCapture : public server::CaptureLink {
 public:
  virtual CaptureFigures figures() const = 0;
  // The io_context no longer runs: a capture that read on it reads on its own thread.
  virtual void leave_loop() {}
  // "trigger" or "native".
  virtual const char* mode() const = 0;
};

class TriggerCaptureLink final : public ServeCapture {
 public:
  // Installs capture in `schema` upstream (every table of every publication) and starts
  // polling into `log`; stops when destroyed.
  static Result<std::unique_ptr<TriggerCaptureLink>> start(const upstream::UpstreamConfig& upstream,
                                                           const std::string& schema,
                                                           const std::string& data_dir,
                                                           log::ChangeLog& log);

  Result<server::ExportedSnapshot> export_snapshot() override;
  Result<wire::Lsn> sync() override;
  CaptureFigures figures() const override;
  const char* mode() const override { return "trigger"; }

  const capture::InstallReport& install_report() const { return service_->install_report(); }

 private:
  explicit TriggerCaptureLink(std::unique_ptr<capture::CaptureService> service)
      : service_(std::move(service)) {}
  std::unique_ptr<capture::CaptureService> service_;
};

class NativeCaptureLink final : public ServeCapture {
 public:
  // Mirrors the upstream's publications into pgrelay's own, creates the upstream slot named
  // after the log's system id on first start, and streams it into `log`, reading it on `loop`
  // (the walsenders' event loop; null: on the capture's own thread).
  static Result<std::unique_ptr<NativeCaptureLink>> start(const upstream::UpstreamConfig& upstream,
                                                          const std::string& schema,
                                                          const std::string& data_dir,
                                                          log::ChangeLog& log,
                                                          log::InProgressTransactions& in_progress,
                                                          Logger* logger,
                                                          std::shared_ptr<capture::ReadingLoop> loop);

  Result<server::ExportedSnapshot> export_snapshot() override;
  Result<wire::Lsn> sync() override;
  CaptureFigures figures() const override;
  const char* mode() const override { return "native"; }
  void leave_loop() override { capture_->leave_loop(); }

  const capture::NativeSetupReport& setup_report() const { return capture_->setup_report(); }

 private:
  explicit NativeCaptureLink(std::unique_ptr<capture::NativeCapture> capture)
      : capture_(std::move(capture)) {}
  std::unique_ptr<capture::NativeCapture> capture_;
};

// The upstream slot native capture uses for the log with this system id.
std::string native_slot_name(std::uint64_t system_id);

}  // namespace pgrelay::cli
