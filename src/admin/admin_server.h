// The admin page's HTTP server: the page, its JSON API under /api/, and who may use them.
// Each answer closes its connection (see start()).
//
//   GET  /                     the page (HTML, CSS and script in one, embedded in the binary)
//   GET  /api/status           upstream, capture mode, logs' heads and sizes, slots (lag in
//                              bytes and seconds, consumers), zero-cache's state
//   GET  /api/history          the last ten minutes, once a second: capture rate, slot lag
//   GET  /api/logs?source=S&lines=N&filter=TEXT
//                              the last N (default 200, at most 5000) lines of S: pgrelay,
//                              postgres or zero-cache, holding TEXT when given
//   POST /api/zero/restart     restarts zero-cache
//   POST /api/zero/reset       stops zero-cache, drops its slots and replica file, starts it
//
// Access: with a token, every request must carry it (Authorization: Bearer TOKEN, or
// ?token=TOKEN); without one the server listens on loopback only (the plan refuses anything
// else) and answers only requests addressed to a loopback name, against DNS rebinding. A POST
// must carry the header X-Pgrelay-Admin (a page of another origin cannot send it without a
// CORS preflight, which is never granted). Bad requests get 4xx with a JSON error.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/logger.h"
#include "base/result.h"

namespace pgrelay::admin {

struct AdminHandlers {
  std::function<nlohmann::json()> status;
  std::function<nlohmann::json()> history;
  // The last `lines` lines of `source` holding `filter`; nullopt for an unknown source.
  std::function<std::optional<std::vector<std::string>>(
      const std::string& source, std::size_t lines, const std::string& filter)>
      logs;
  // Empty when there is no zero-cache to act on (the endpoints then answer 409).
  std::function<Result<nlohmann::json>()> restart_zero;
  std::function<Result<nlohmann::json>()> reset_zero;
};

struct AdminServerOptions {
  std::string host = "127.0.0.1";
  int port = 6477;
  std::string token;  // empty: loopback only, no token
};

class AdminServer {
 public:
  // Binds HOST:PORT (58000 naming --admin when it cannot) and serves on its own threads.
  static Result<std::unique_ptr<AdminServer>> start(AdminServerOptions options,
                                                    AdminHandlers handlers, Logger& logger);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  int port() const { return port_; }
  void stop();

 private:
  struct Impl;
  explicit AdminServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  int port_ = 0;
};

// The page, as served at /.
const std::string& admin_page_html();

}  // namespace pgrelay::admin
