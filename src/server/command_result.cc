// Small text result sets the server answers itself (replication commands, SHOW).
#include "server/command_result.h"

#include "wire/backend_messages.h"

namespace pgrelay::server {
namespace {
void append(Bytes& out, const Bytes& message) {
  out.insert(out.end(), message.begin(), message.end());
}
}  // namespace

void append_result(Bytes& out, const std::vector<ResultColumn>& columns,
                   const std::vector<std::vector<std::optional<std::string>>>& rows,
                   const std::string& tag) {
  wire::RowDescription description;
  for (const auto& column : columns) {
    wire::FieldDescription field;
    field.name = column.name;
    field.type_oid = column.type;
    field.type_size = column.size;
    field.type_modifier = -1;
    description.fields.push_back(std::move(field));
  }
  append(out, wire::encode(description));
  for (const auto& row : rows) {
    wire::DataRow data;
    for (const auto& value : row) {
      if (value) {
        data.values.emplace_back(Bytes(value->begin(), value->end()));
      } else {
        data.values.emplace_back(std::nullopt);
      }
    }
    append(out, wire::encode(data));
  }
  append_command_complete(out, tag);
}

void append_command_complete(Bytes& out, const std::string& tag) {
  append(out, wire::encode(wire::CommandComplete{tag}));
}

void append_ready(Bytes& out, char status) {
  append(out, wire::encode(wire::ReadyForQuery{static_cast<wire::TransactionStatus>(status)}));
}

void append_error(Bytes& out, const Error& error) {
  append(out, wire::encode(wire::make_error_response(error)));
}

void append_notice(Bytes& out, const Error& notice) {
  append(out, wire::encode(wire::make_notice_response(notice)));
}

}  // namespace pgrelay::server
