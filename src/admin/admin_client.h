// Asks a running pgrelay's admin API (GET /api/status, POST /api/zero/reset) over HTTP.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace pgrelay::admin {

class AdminClient {
 public:
  // `base_url`: the admin page as pgrelay printed it, http://HOST:PORT/. `token`: the
  // --admin-token pgrelay runs with, empty for none.
  static Result<AdminClient> connect_to(const std::string& base_url, std::string token);

  // The JSON of GET /api/status.
  Result<nlohmann::json> status() const;
  // POST /api/zero/reset: zero-cache stopped, its slots and replica gone, started again.
  Result<nlohmann::json> reset_zero() const;

 private:
  AdminClient(std::string host, int port, std::string token)
      : host_(std::move(host)), port_(port), token_(std::move(token)) {}
  Result<nlohmann::json> request(const char* method, const std::string& path) const;

  std::string host_;
  int port_ = 0;
  std::string token_;
};

}  // namespace pgrelay::admin
