// What a pass-through session reads of the frames it relays: replies owed, catalog rewrites, drops.
#include "server/relay_protocol.h"

#include "server/sql_rewrite.h"
#include "wire/backend_messages.h"
#include "wire/messages.h"

namespace pgrelay::server {
namespace {

// CREATE PUBLICATION warns "wal_level is insufficient to publish logical changes" on an
// upstream without wal_level=logical. Through pgrelay, publications do work and wal_level
// reads 'logical', so the warning would be false: it is dropped. Matched on the fields that
// are not translated (severity, SQLSTATE, routine), so lc_messages does not matter.
bool is_false_wal_level_warning(ByteView body) {
  auto notice = wire::parse_notice_response(body);
  return notice.ok() && notice->severity() == "WARNING" && notice->sqlstate() == "55000" &&
         notice->find(wire::error_field::kRoutine) == std::string_view("CreatePublication");
}

}  // namespace

RelayState::RelayState() : from_upstream(is_false_wal_level_warning) {}

void RelayState::count_client_frame(char tag) {
  switch (tag) {
    case 'Q':
    case 'F':
      ++replies_expected;
      break;
    case 'S':
      ++replies_expected;
      unsynced = false;
      break;
    case 'P':
    case 'B':
    case 'E':
    case 'D':
    case 'C':
    case 'H':
      unsynced = true;
      break;
    default:
      break;
  }
}

ClientFrame::ClientFrame(wire::FrameView view) : tag(view.tag), body(view.body) {
  if (tag == 'Q') {
    if (auto parsed = wire::parse_query(body); parsed.ok()) query = std::move(*parsed);
  } else if (tag == 'P') {
    if (auto parsed = wire::parse_parse(body); parsed.ok()) parse = std::move(*parsed);
  }
}

void append_client_frame(ClientFrame& frame, const SqlRewrite& rewrite,
                         const StatementSource& source, Bytes& out) {
  if (rewrite && frame.sql()) {
    if (auto sql = rewrite(*frame.sql(), source)) {
      Bytes encoded;
      if (frame.query) {
        encoded = wire::encode(wire::Query{*sql});
      } else {
        frame.parse->sql = *sql;
        encoded = wire::encode(*frame.parse);
      }
      out.insert(out.end(), encoded.begin(), encoded.end());
      return;
    }
  }
  wire::append_frame(out, frame.tag, frame.body);
}

std::vector<DatabaseUsedAlone> databases_used_alone_in(const ClientFrame& frame) {
  return frame.sql() ? databases_used_alone(*frame.sql()) : std::vector<DatabaseUsedAlone>();
}

bool RelayState::reusable_after_terminate() const {
  // 0: no ReadyForQuery since the backend was logged in or reset, which left it idle.
  const char status = from_upstream.transaction_status();
  return idle() && (status == 'I' || status == 0);
}

}  // namespace pgrelay::server
