// A few idle libpq connections to the upstream, reused by blocking side queries.
#include "upstream/libpq_pool.h"

#include <poll.h>

#include <utility>

namespace pgrelay::upstream {

LibpqPool::Lease::Lease(Lease&& other) noexcept
    : pool_(other.pool_), conninfo_(std::move(other.conninfo_)), conn_(other.conn_) {
  other.conn_ = nullptr;
}

LibpqPool::Lease::~Lease() {
  if (conn_ != nullptr) pool_->give_back(conninfo_, conn_);
}

LibpqPool::~LibpqPool() {
  for (auto& [conninfo, conn] : idle_) PQfinish(conn);
}

Result<LibpqPool::Lease> LibpqPool::acquire(const std::string& conninfo) {
  for (;;) {
    PGconn* conn = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = idle_.find(conninfo);
      if (it == idle_.end()) break;
      conn = it->second;
      idle_.erase(it);
    }
    // A backend that was terminated (upstream restart, pg_terminate_backend, idle timeouts)
    // has sent its FATAL and closed. An idle backend has nothing else to say, so anything to
    // read means the connection is not worth keeping.
    pollfd readable{PQsocket(conn), POLLIN, 0};
    if (PQstatus(conn) == CONNECTION_OK && ::poll(&readable, 1, 0) == 0) {
      return Lease(this, conninfo, conn);
    }
    PQfinish(conn);
  }
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string message = PQerrorMessage(conn);
    PQfinish(conn);
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
      message.pop_back();
    }
    return Error::make("08006", "could not connect to the upstream: " + message);
  }
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  // pgrelay's side queries are short catalog reads, and PostgreSQL's JIT compiles a plan anew on
  // every execution once its estimated cost passes jit_above_cost: the publications catalog
  // query, read at each replication session's start, spent 127 ms of its 105-195 ms in LLVM.
  // (PostgreSQL 11 brought the setting; a failure leaves the default, which is only slower.)
  if (PQserverVersion(conn) >= 110000) PQclear(PQexec(conn, "SET jit TO off"));
  return Lease(this, conninfo, conn);
}

std::size_t LibpqPool::idle() const {
  std::lock_guard lock(mu_);
  return idle_.size();
}

void LibpqPool::give_back(const std::string& conninfo, PGconn* conn) {
  if (PQstatus(conn) == CONNECTION_OK && PQtransactionStatus(conn) == PQTRANS_IDLE) {
    std::lock_guard lock(mu_);
    if (idle_.count(conninfo) < max_idle_) {
      idle_.emplace(conninfo, conn);
      return;
    }
  }
  PQfinish(conn);
}

}  // namespace pgrelay::upstream
