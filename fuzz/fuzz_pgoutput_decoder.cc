// Fuzzes the stateful pgoutput Decoder: each decode re-encodes to its bytes, state stays coherent.
//
// Input layouts:
//  - first byte < 0x20: an options byte (bits 0-1: protocol version - 1, bit 2: parallel
//    streaming), then messages, each a big-endian u16 length and that many bytes (the last one
//    takes whatever is left), all fed to one Decoder so relation and stream state carry over;
//  - anything else (every pgoutput tag is a letter): one raw message, as the golden streams
//    recorded by the test suite store them, decoded by a fresh decoder of every version.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <variant>
#include <vector>

#include "base/bytes.h"
#include "pgoutput/decoder.h"
#include "pgoutput/encoder.h"
#include "pgoutput/messages.h"

namespace {

using namespace pgrelay;
using namespace pgrelay::pgoutput;

void check(bool condition) {
  if (!condition) std::abort();
}

const std::optional<Xid>* streamed_xid(const Message& m) {
  return std::visit(
      [](const auto& v) -> const std::optional<Xid>* {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Relation> || std::is_same_v<T, Type> ||
                      std::is_same_v<T, Insert> || std::is_same_v<T, Update> ||
                      std::is_same_v<T, Delete> || std::is_same_v<T, Truncate> ||
                      std::is_same_v<T, LogicalMessage>) {
          return &v.xid;
        } else {
          return nullptr;
        }
      },
      m);
}

// Invariants every successful decode must satisfy, whatever the decoder state.
void check_decoded(const Message& m, ByteView bytes, const DecoderOptions& options) {
  check(!bytes.empty());
  check(static_cast<char>(tag_of(m)) == static_cast<char>(bytes[0]));
  check(min_protocol_version(static_cast<char>(bytes[0])) <= options.protocol_version);
  const Bytes again = encode(m);
  check(again.size() == bytes.size());
  check(std::equal(again.begin(), again.end(), bytes.begin()));
  check(encoded_size(m) == bytes.size());
  ByteWriter w;
  w.u8(0xAA);  // encode() appends: whatever is already in the buffer stays
  encode(m, w);
  check(w.size() == bytes.size() + 1 && w.bytes()[0] == 0xAA);
  check(!describe(m).empty());
  if (const auto* abort = std::get_if<StreamAbort>(&m)) {
    check(abort->abort_info.has_value() ==
          (options.protocol_version >= 4 && options.parallel_streaming));
  }
}

// Many messages through one decoder: relation cache, stream blocks and streamed transactions.
// A shadow decoder sees only the messages the main one accepted: a failed message must leave
// the main decoder's state unchanged, so both must keep agreeing on everything that follows.
void fuzz_stream(const std::uint8_t* data, std::size_t size) {
  DecoderOptions options;
  options.protocol_version = 1 + (data[0] & 3);
  options.parallel_streaming = (data[0] & 4) != 0 && options.protocol_version == 4;
  Decoder decoder(options);
  Decoder shadow(options);
  ByteView rest(data + 1, size - 1);
  while (!rest.empty()) {
    std::size_t len = rest.size();
    if (rest.size() >= 2) {
      len = std::min<std::size_t>((std::size_t{rest[0]} << 8) | rest[1], rest.size() - 2);
      rest = rest.subspan(2);
    }
    const ByteView message = rest.first(len);
    rest = rest.subspan(len);

    const bool was_in_stream = decoder.in_stream();
    check(shadow.in_stream() == was_in_stream);
    Result<Message> decoded = decoder.decode(message);
    if (!decoded.ok()) {
      check(!decoded.error().message.empty());
      check(decoded.error().sqlstate == sqlstate::kProtocolViolation);
      check(decoder.in_stream() == was_in_stream);
      // The shadow, in the state the main decoder had before, fails the same way.
      Decoder probe = shadow;
      Result<Message> expected = probe.decode(message);
      check(!expected.ok() && expected.error().message == decoded.error().message &&
            expected.error().detail == decoded.error().detail);
      continue;
    }
    Result<Message> again = shadow.decode(message);
    check(again.ok() && *again == *decoded);
    const Message& m = *decoded;
    check_decoded(m, message, options);

    // Streamed changes carry an xid exactly inside a stream block.
    if (const std::optional<Xid>* xid = streamed_xid(m)) check(xid->has_value() == was_in_stream);

    switch (tag_of(m)) {
      case Tag::kStreamStart:
        check(!was_in_stream && decoder.in_stream());
        break;
      case Tag::kStreamStop:
        check(was_in_stream && !decoder.in_stream());
        break;
      case Tag::kStreamCommit:
      case Tag::kStreamAbort:
      case Tag::kStreamPrepare:
        check(!was_in_stream && !decoder.in_stream());
        break;
      case Tag::kRelation: {
        const Relation& rel = std::get<Relation>(m);
        const Relation* cached = decoder.relation(rel.oid);
        check(cached != nullptr && *cached == rel);
        const Relation* shadowed = shadow.relation(rel.oid);
        check(shadowed != nullptr && *shadowed == rel);
        break;
      }
      case Tag::kInsert: {
        const Insert& ins = std::get<Insert>(m);
        const Relation* rel = decoder.relation(ins.relation_oid);
        check(rel != nullptr && rel->columns.size() == ins.new_tuple.columns.size());
        check(decoder.in_stream() == was_in_stream);
        break;
      }
      case Tag::kUpdate: {
        const Update& upd = std::get<Update>(m);
        const Relation* rel = decoder.relation(upd.relation_oid);
        check(rel != nullptr && rel->columns.size() == upd.new_tuple.columns.size());
        if (upd.old) check(upd.old->tuple.columns.size() == rel->columns.size());
        break;
      }
      case Tag::kDelete: {
        const Delete& del = std::get<Delete>(m);
        const Relation* rel = decoder.relation(del.relation_oid);
        check(rel != nullptr && rel->columns.size() == del.old.tuple.columns.size());
        break;
      }
      case Tag::kTruncate:
        for (Oid oid : std::get<Truncate>(m).relation_oids) check(decoder.relation(oid) != nullptr);
        break;
      default:
        check(decoder.in_stream() == was_in_stream);
        break;
    }
  }
}

// One message through fresh decoders of every version: the version only gates which message
// types exist (and Stream Abort's layout under parallel streaming), nothing else.
void fuzz_single(const std::uint8_t* data, std::size_t size) {
  const ByteView message(data, size);
  const int needed = min_protocol_version(static_cast<char>(data[0]));
  std::optional<Result<Message>> reference;
  for (int version = 4; version >= 1; --version) {
    DecoderOptions options;
    options.protocol_version = version;
    Decoder decoder(options);
    Result<Message> decoded = decoder.decode(message);
    if (decoded.ok()) check_decoded(*decoded, message, options);
    if (needed == 0 || needed > version) {
      check(!decoded.ok());
      continue;
    }
    if (!reference) {
      reference.emplace(std::move(decoded));
      continue;
    }
    check(decoded.ok() == reference->ok());
    if (decoded.ok()) {
      check(*decoded == **reference);
    } else {
      check(decoded.error().message == reference->error().message);
      check(decoded.error().detail == reference->error().detail);
    }
  }
  DecoderOptions parallel;
  parallel.protocol_version = 4;
  parallel.parallel_streaming = true;
  Decoder decoder(parallel);
  Result<Message> decoded = decoder.decode(message);
  if (decoded.ok()) check_decoded(*decoded, message, parallel);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  if (data[0] < 0x20) {
    fuzz_stream(data, size);
  } else {
    fuzz_single(data, size);
  }
  return 0;
}
