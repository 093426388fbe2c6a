// Fuzzes replication CopyData payloads: parses re-encode to the same bytes, parsers agree.
//
// The input is one CopyData payload, type byte first (the test suite records real XLogData
// frames as seeds). It goes through the server- and client-side dispatchers and each typed
// parser, through CopyData framing and the frame reader, and an XLogData's data goes through a
// pgoutput decoder.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <variant>

#include "base/bytes.h"
#include "pgoutput/decoder.h"
#include "pgoutput/encoder.h"
#include "wire/backend_messages.h"
#include "wire/frame_reader.h"
#include "wire/frontend_messages.h"
#include "wire/messages.h"
#include "wire/replication_frames.h"

namespace {

using namespace pgrelay;
using namespace pgrelay::wire;

void check(bool condition) {
  if (!condition) std::abort();
}

bool same_bytes(const Bytes& a, ByteView b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// The payload as encode() writes it back: a reply-requested byte reads as true when non-zero,
// so a canonical encoding has 1 there.
Bytes canonical(ByteView payload) {
  Bytes out(payload.begin(), payload.end());
  if (!out.empty() && (out[0] == 'k' || out[0] == 'r')) out.back() = out.back() != 0 ? 1 : 0;
  return out;
}

// Timestamps convert to Unix time and back without loss unless they saturate.
void check_timestamp(std::int64_t pg) {
  using Limits = std::numeric_limits<std::int64_t>;
  const std::int64_t unix_micros = pg_to_unix_micros(pg);
  if (unix_micros != Limits::max()) {
    check(unix_micros - kPostgresEpochUnixMicros == pg);
    check(unix_micros_to_pg(unix_micros) == pg);
  }
  const auto t = from_pg_timestamp(pg);
  using Clock = std::chrono::system_clock;
  if (t != Clock::time_point::max() && t != Clock::time_point::min()) {
    check(to_pg_timestamp(t) == pg);
  }
}

template <typename T>
bool equal_result(const Result<T>& a, const Result<T>& b) {
  if (a.ok() != b.ok()) return false;
  if (a.ok()) return *a == *b;
  return a.error().sqlstate == b.error().sqlstate && a.error().message == b.error().message;
}

void check_server(ByteView payload) {
  Result<ServerReplicationFrame> frame = parse_from_server(payload);
  Result<XLogData> xlog = parse_xlog_data(payload);
  Result<PrimaryKeepalive> keepalive = parse_primary_keepalive(payload);
  check(!(xlog.ok() && keepalive.ok()));
  if (!payload.empty() && payload[0] == 'w') {
    check(frame.ok() == xlog.ok());
    if (xlog.ok()) check(std::get<XLogData>(*frame) == *xlog);
  } else if (!payload.empty() && payload[0] == 'k') {
    check(frame.ok() == keepalive.ok());
    if (keepalive.ok()) check(std::get<PrimaryKeepalive>(*frame) == *keepalive);
  } else {
    check(!frame.ok() && !xlog.ok() && !keepalive.ok());
  }
  if (!frame.ok()) {
    check(frame.error().sqlstate == sqlstate::kProtocolViolation);
    return;
  }
  const Bytes again = std::visit([](const auto& m) { return encode(m); }, *frame);
  check(again == canonical(payload));
  check(equal_result(parse_from_server(again), frame));

  if (xlog.ok()) {
    check(xlog->data.size() + 25 == payload.size());
    check(same_bytes(xlog->data, payload.subspan(25)));
    check_timestamp(xlog->send_time);
    // The data is a pgoutput message in a logical stream; a fresh decoder knows no relation,
    // but everything else decodes standalone and must re-encode exactly.
    pgoutput::DecoderOptions options;
    options.protocol_version = 4;
    pgoutput::Decoder decoder(options);
    auto decoded = decoder.decode(xlog->data);
    if (decoded.ok()) check(pgoutput::encode(*decoded) == xlog->data);
  } else {
    check(payload.size() == 18);
    check(keepalive->reply_requested == (payload[17] != 0));
    check_timestamp(keepalive->send_time);
  }
}

void check_client(ByteView payload) {
  Result<ClientReplicationFrame> frame = parse_from_client(payload);
  Result<StandbyStatusUpdate> status = parse_standby_status_update(payload);
  Result<HotStandbyFeedback> feedback = parse_hot_standby_feedback(payload);
  check(!(status.ok() && feedback.ok()));
  if (!payload.empty() && payload[0] == 'r') {
    check(frame.ok() == status.ok());
    if (status.ok()) check(std::get<StandbyStatusUpdate>(*frame) == *status);
  } else if (!payload.empty() && payload[0] == 'h') {
    check(frame.ok() == feedback.ok());
    if (feedback.ok()) check(std::get<HotStandbyFeedback>(*frame) == *feedback);
  } else {
    check(!frame.ok() && !status.ok() && !feedback.ok());
  }
  if (!frame.ok()) {
    check(frame.error().sqlstate == sqlstate::kProtocolViolation);
    return;
  }
  const Bytes again = std::visit([](const auto& m) { return encode(m); }, *frame);
  check(again == canonical(payload));
  check(equal_result(parse_from_client(again), frame));
  if (status.ok()) {
    check(payload.size() == 34);
    check_timestamp(status->send_time);
  } else {
    check(payload.size() == 25);
    check_timestamp(feedback->send_time);
  }
}

// The payload travels in a CopyData message in both directions.
void check_copy_data(ByteView payload) {
  const Bytes framed = encode(CopyData{Bytes(payload.begin(), payload.end())});
  check(framed.size() == payload.size() + 5);
  FrameReader reader(FrameReader::Phase::kRegular);
  reader.feed(framed);
  auto frame = reader.next();
  check(frame.ok() && frame->has_value());
  check((*frame)->tag == CopyData::kTag && same_bytes((*frame)->body, payload));
  check(reader.buffered() == 0 && reader.finish_at_eof().ok());
  auto backend = parse_backend('d', payload);
  check(backend.ok() && same_bytes(std::get<CopyData>(*backend).data, payload));
  check(encode(*backend) == framed);
  auto frontend = parse_frontend('d', payload);
  check(frontend.ok() && same_bytes(std::get<CopyData>(*frontend).data, payload));
  check(encode(*frontend) == framed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const ByteView payload(data, size);
  check_server(payload);
  check_client(payload);
  check_copy_data(payload);
  return 0;
}
