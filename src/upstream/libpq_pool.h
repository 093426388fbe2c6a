// A few idle libpq connections to the upstream, reused by blocking side queries.
//
// Replication sessions read publications from the upstream at every START_REPLICATION. A new
// connection each time costs the upstream a backend start and a cold catalog cache: with 32
// consumers starting at once that was most of the upstream's CPU while they streamed.
#pragma once

#include <libpq-fe.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>

#include "base/result.h"

namespace pgrelay::upstream {

class LibpqPool {
 public:
  // A connection lent out; given back when the lease ends, unless it broke or was left in a
  // transaction.
  class Lease {
   public:
    Lease(LibpqPool* pool, std::string conninfo, PGconn* conn)
        : pool_(pool), conninfo_(std::move(conninfo)), conn_(conn) {}
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease();
    PGconn* get() const { return conn_; }

   private:
    LibpqPool* pool_;
    std::string conninfo_;
    PGconn* conn_;
  };

  explicit LibpqPool(std::size_t max_idle_per_conninfo = 4) : max_idle_(max_idle_per_conninfo) {}
  ~LibpqPool();
  LibpqPool(const LibpqPool&) = delete;
  LibpqPool& operator=(const LibpqPool&) = delete;

  // An idle connection for `conninfo` that is still up, or a new one (08006 when connecting
  // fails, with libpq's message). Thread-safe.
  Result<Lease> acquire(const std::string& conninfo);
  std::size_t idle() const;

 private:
  void give_back(const std::string& conninfo, PGconn* conn);

  const std::size_t max_idle_;
  mutable std::mutex mu_;
  std::multimap<std::string, PGconn*> idle_;
};

}  // namespace pgrelay::upstream
