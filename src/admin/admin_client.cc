// Asks a running pgrelay's admin API (GET /api/status, POST /api/zero/reset) over HTTP.
#include "admin/admin_client.h"

#include <httplib.h>

#include <charconv>

namespace pgrelay::admin {
namespace {

// A reset waits for zero-cache to stop and start again.
constexpr int kReadTimeoutSeconds = 120;

}  // namespace

Result<AdminClient> AdminClient::connect_to(const std::string& base_url, std::string token) {
  constexpr std::string_view kScheme = "http://";
  std::string_view rest(base_url);
  auto invalid = [&] {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "\"" + base_url + "\" is not an admin page address",
                       "Give it as http://HOST:PORT/, as pgrelay prints it at start.");
  };
  if (!rest.starts_with(kScheme)) return invalid();
  rest.remove_prefix(kScheme.size());
  rest = rest.substr(0, rest.find('/'));
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return invalid();
  std::string host(rest.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  const std::string_view digits = rest.substr(colon + 1);
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc() || end != digits.data() + digits.size() || port <= 0 || port > 65535) {
    return invalid();
  }
  return AdminClient(std::move(host), port, std::move(token));
}

Result<nlohmann::json> AdminClient::status() const {
  return request("GET", "/api/status");
}

Result<nlohmann::json> AdminClient::reset_zero() const {
  return request("POST", "/api/zero/reset");
}

Result<nlohmann::json> AdminClient::request(const char* method, const std::string& path) const {
  httplib::Client client(host_, port_);
  client.set_connection_timeout(5);
  client.set_read_timeout(kReadTimeoutSeconds);
  httplib::Headers headers{{"X-Pgrelay-Admin", "1"}};
  if (!token_.empty()) headers.emplace("Authorization", "Bearer " + token_);
  const std::string where =
      "pgrelay's admin page at http://" + host_ + ":" + std::to_string(port_) + path;
  auto response = std::string_view(method) == "POST" ? client.Post(path, headers, "", "text/plain")
                                                     : client.Get(path, headers);
  if (!response) {
    return Error::make(sqlstate::kConnectionFailure,
                       "could not reach " + where + ": " + httplib::to_string(response.error()),
                       "Is pgrelay still running with its admin page (--admin)?");
  }
  nlohmann::json body = nlohmann::json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (response->status != 200) {
    std::string message = where + " answered " + std::to_string(response->status);
    std::string hint;
    if (body.is_object() && body.contains("error")) {
      message += ": " + body["error"].get<std::string>();
      if (body.contains("hint") && body["hint"].is_string()) hint = body["hint"].get<std::string>();
    }
    if (response->status == 401 && hint.empty()) {
      hint = "Give the --admin-token pgrelay runs with (PGRELAY_ADMIN_TOKEN).";
    }
    return Error::make(response->status == 401 ? sqlstate::kInvalidPassword
                                               : sqlstate::kObjectNotInPrerequisiteState,
                       message, hint);
  }
  if (body.is_discarded()) {
    return Error::make(sqlstate::kProtocolViolation, where + " answered with no JSON");
  }
  return body;
}

}  // namespace pgrelay::admin
