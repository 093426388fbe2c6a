// Starts trigger capture for `serve` and presents it to the server as a CaptureLink.
#pragma once

#include <memory>
#include <string>

#include "base/result.h"
#include "log/change_log.h"
#include "server/replication_hub.h"
#include "upstream/upstream_config.h"

namespace pgrelay::cli {

// Installs capture in `schema` upstream (every table of every publication) and starts polling
// into `log`; stops when the returned object is destroyed.
Result<std::unique_ptr<server::CaptureLink>> start_capture(const upstream::UpstreamConfig& upstream,
                                                           const std::string& schema,
                                                           const std::string& data_dir,
                                                           log::ChangeLog& log);

}  // namespace pgrelay::cli
