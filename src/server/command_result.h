// Small text result sets the server answers itself (replication commands, SHOW).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "wire/messages.h"

namespace pgrelay::server {

struct ResultColumn {
  std::string name;
  wire::Oid type = 25;  // text
  std::int16_t size = -1;
};

// RowDescription, one DataRow per row (nullopt = NULL), CommandComplete `tag`, appended to
// `out`, all in text format as walsender results are.
void append_result(Bytes& out, const std::vector<ResultColumn>& columns,
                   const std::vector<std::vector<std::optional<std::string>>>& rows,
                   const std::string& tag);
void append_command_complete(Bytes& out, const std::string& tag);
void append_ready(Bytes& out, char status = 'I');
void append_error(Bytes& out, const Error& error);
void append_notice(Bytes& out, const Error& notice);

inline constexpr wire::Oid kTextOid = 25;
inline constexpr wire::Oid kInt4Oid = 23;
inline constexpr wire::Oid kInt8Oid = 20;

}  // namespace pgrelay::server
