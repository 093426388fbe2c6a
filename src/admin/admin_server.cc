// The admin page's HTTP server: the page, its JSON API under /api/, and who may use them.
#include "admin/admin_server.h"

#include <openssl/crypto.h>

#include <httplib.h>

#include <charconv>

#include "base/thread_name.h"

namespace pgrelay::admin {
namespace {

constexpr std::size_t kDefaultLines = 200;
constexpr std::size_t kMaxLines = 5000;

void reply_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(), "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& message,
                 const std::string& hint = {}) {
  nlohmann::json body = {{"error", message}};
  if (!hint.empty()) body["hint"] = hint;
  reply_json(res, status, body);
}

bool same_secret(const std::string& given, const std::string& token) {
  return given.size() == token.size() &&
         CRYPTO_memcmp(given.data(), token.data(), token.size()) == 0;
}

// The host part of a Host header: "127.0.0.1:6477" -> "127.0.0.1", "[::1]:6477" -> "::1".
std::string host_name(const std::string& header) {
  if (header.starts_with("[")) {
    const auto close = header.find(']');
    return close == std::string::npos ? header : header.substr(1, close - 1);
  }
  return header.substr(0, header.find(':'));
}

bool loopback_name(const std::string& host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

}  // namespace

struct AdminServer::Impl {
  AdminServerOptions options;
  AdminHandlers handlers;
  Logger& logger;
  httplib::Server server;

  Impl(AdminServerOptions o, AdminHandlers h, Logger& l)
      : options(std::move(o)), handlers(std::move(h)), logger(l) {}

  // Whether the request may go on; answers it when not.
  bool admitted(const httplib::Request& req, httplib::Response& res) const {
    if (options.token.empty()) {
      if (!loopback_name(host_name(req.get_header_value("Host")))) {
        reply_error(res, 403, "the admin page answers only requests addressed to loopback",
                    "Open it as http://127.0.0.1:PORT/, or give pgrelay --admin-token.");
        return false;
      }
    } else {
      std::string given;
      const std::string auth = req.get_header_value("Authorization");
      if (auth.starts_with("Bearer ")) given = auth.substr(7);
      if (given.empty() && req.has_param("token")) given = req.get_param_value("token");
      if (!same_secret(given, options.token)) {
        res.set_header("WWW-Authenticate", "Bearer");
        reply_error(res, 401, "the admin page needs its token",
                    "Open it as http://HOST:PORT/?token=TOKEN, or send Authorization: Bearer "
                    "TOKEN (the --admin-token pgrelay was started with).");
        return false;
      }
    }
    if (req.method == "POST" && !req.has_header("X-Pgrelay-Admin")) {
      reply_error(res, 403, "an action needs the header X-Pgrelay-Admin",
                  "Use the admin page's buttons, or send X-Pgrelay-Admin: 1 with the POST.");
      return false;
    }
    return true;
  }

  void action(const char* name, const std::function<Result<nlohmann::json>()>& act,
              httplib::Response& res) const {
    if (!act) {
      reply_error(res, 409, "no zero-cache runs here", "Start pgrelay with `pgrelay zero`.");
      return;
    }
    logger.info(std::string("admin page: ") + name);
    auto done = act();
    if (!done.ok()) {
      reply_error(res, 500, done.error().message, done.error().hint);
      return;
    }
    reply_json(res, 200, *done);
  }

  void routes() {
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return admitted(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                : httplib::Server::HandlerResponse::Handled;
    });
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_header("Content-Security-Policy",
                     "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                     "connect-src 'self'; img-src data:");
      res.set_content(admin_page_html(), "text/html; charset=utf-8");
    });
    server.Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
      reply_json(res, 200, handlers.status());
    });
    server.Get("/api/history", [this](const httplib::Request&, httplib::Response& res) {
      reply_json(res, 200, handlers.history());
    });
    server.Get("/api/logs", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string source = req.get_param_value("source");
      std::size_t lines = kDefaultLines;
      if (req.has_param("lines")) {
        const std::string text = req.get_param_value("lines");
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), lines);
        if (ec != std::errc() || end != text.data() + text.size() || lines == 0 ||
            lines > kMaxLines) {
          reply_error(res, 400, "lines=" + text + " is not a number of lines from 1 to 5000");
          return;
        }
      }
      auto got = handlers.logs(source, lines, req.get_param_value("filter"));
      if (!got) {
        reply_error(res, 400, "source=" + source + " is not a log pgrelay shows",
                    "Ask for source=pgrelay, source=postgres or source=zero-cache.");
        return;
      }
      reply_json(res, 200, {{"source", source}, {"lines", *got}});
    });
    server.Post("/api/zero/restart", [this](const httplib::Request&, httplib::Response& res) {
      action("restart zero-cache", handlers.restart_zero, res);
    });
    server.Post("/api/zero/reset", [this](const httplib::Request&, httplib::Response& res) {
      action("reset zero", handlers.reset_zero, res);
    });
    // Anything else (routes match in the order they were added).
    auto not_found = [](const httplib::Request& req, httplib::Response& res) {
      reply_error(res, 404, "no such page: " + req.path, "The API is under /api/ (see /).");
    };
    server.Get(".*", not_found);
    server.Post(".*", not_found);
    server.Put(".*", not_found);
    server.Delete(".*", not_found);
    server.set_exception_handler(
        [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
          logger.warning("admin page: a request failed", {{"path", req.path}});
          reply_error(res, 500, "the request failed; pgrelay's log says why");
        });
  }
};

Result<std::unique_ptr<AdminServer>> AdminServer::start(AdminServerOptions options,
                                                        AdminHandlers handlers, Logger& logger) {
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handlers), logger);
  impl->routes();
  // cpp-httplib gives a connection a thread for as long as it is kept alive, and a browser
  // keeps up to six open: with keep-alive, one open page held every thread and other clients
  // (a second tab, curl) waited for its connections to idle out. Each answer closes its
  // connection instead (three a second on loopback cost nothing), and a slow reader holds a
  // thread for at most the read timeout.
  impl->server.new_task_queue = [] { return new httplib::ThreadPool(4); };
  impl->server.set_keep_alive_max_count(1);
  impl->server.set_payload_max_length(64 * 1024);
  impl->server.set_read_timeout(5, 0);
  impl->server.set_write_timeout(5, 0);
  const std::string host = impl->options.host;
  int port = impl->options.port;
  const bool bound = port == 0 ? (port = impl->server.bind_to_any_port(host.c_str())) > 0
                               : impl->server.bind_to_port(host.c_str(), port);
  if (!bound) {
    return Error::make(sqlstate::kSystemError,
                       "could not serve the admin page on " + host + ":" + std::to_string(port),
                       "Give --admin another HOST:PORT (that one is taken, or not this "
                       "machine's).");
  }
  std::unique_ptr<AdminServer> out(new AdminServer(std::move(impl)));
  out->port_ = port;
  out->thread_ = start_named_thread(
      "admin-http", [server = &out->impl_->server] { server->listen_after_bind(); });
  return out;
}

AdminServer::AdminServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AdminServer::~AdminServer() {
  stop();
}

void AdminServer::stop() {
  if (!thread_.joinable()) return;
  impl_->server.stop();
  thread_.join();
}

}  // namespace pgrelay::admin
