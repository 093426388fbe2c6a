// The primary's server facts message: what a follower answers sessions with in place of the
// upstream (the ParameterStatus values a session starts with, the publications), as JSON.
//
// The publisher sends it on Subjects::server_facts() when it starts publishing and the facts
// differ from the stream's last ones. `catalog` is the publications catalog
// (pgoutput/publication_catalog.h) read at the moment the log's end was `as_of`; from there
// on, the publications markers in the log (capture/publication_marker.h) carry every change,
// so a follower's current catalog is that of the last marker after `as_of`, else this one.
//
//   {"parameters": {"server_version": "15.10", ...}, "catalog": "<JSON text>" or null,
//    "as_of": "X/Y"}
//
// The catalog is null before PostgreSQL 15, whose catalog the markers do not carry either.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "wire/lsn.h"

namespace pgrelay::nats {

struct ServerFacts {
  std::vector<std::pair<std::string, std::string>> parameters;  // in the upstream's order
  std::optional<std::string> catalog;
  wire::Lsn as_of;

  // Whether two facts say the same of the server, wherever the log stood when read.
  bool same_server(const ServerFacts& other) const {
    return parameters == other.parameters && catalog == other.catalog;
  }
};

std::string encode_server_facts(const ServerFacts& facts);
// 22P02 on a payload encode_server_facts() did not make.
Result<ServerFacts> parse_server_facts(std::string_view payload);

}  // namespace pgrelay::nats
