// Decodes pgoutput message payloads, tracking the stream state and relations they depend on.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "base/bytes.h"
#include "base/result.h"
#include "pgoutput/messages.h"

namespace pgrelay::pgoutput {

// The START_REPLICATION options that change what is on the wire.
struct DecoderOptions {
  int protocol_version = 1;  // proto_version, 1-4
  // streaming = parallel (protocol 4): Stream Abort then carries abort lsn and abort time.
  bool parallel_streaming = false;
};

// Decodes the messages of one replication stream, in order. It is stateful because the wire
// format is: inside a Stream Start..Stream Stop block, changes carry the transaction's xid, and
// tuples can only be checked against the Relation message sent before them.
class Decoder {
 public:
  explicit Decoder(DecoderOptions options) : options_(options) {}

  // Decodes one payload (what follows the XLogData header). Errors are 08P01 protocol
  // violations (0A000 for options no protocol version supports); a failed message leaves the
  // decoder's state unchanged.
  Result<Message> decode(ByteView payload);

  // The Relation a change for `oid` decoded next is checked against, or nullptr: inside a
  // stream block the one the streamed transaction sent, if any, else the last one outside.
  const Relation* relation(Oid oid) const;

  // Whether the decoder is between Stream Start and Stream Stop (changes carry an xid).
  bool in_stream() const { return in_stream_; }
  const DecoderOptions& options() const { return options_; }

 private:
  using RelationMap = std::unordered_map<Oid, Relation>;

  void remember(const Relation& rel);
  void end_streamed_transaction(Xid xid, bool applied);

  DecoderOptions options_;
  bool in_stream_ = false;
  Xid stream_xid_ = 0;
  RelationMap relations_;
  // Relations sent inside the stream blocks of a streamed transaction. Like a subscriber, which
  // applies them only when the transaction commits (or is prepared), they stay private to it
  // until then: pgoutput re-sends a relation to concurrent transactions that need it.
  std::unordered_map<Xid, RelationMap> streamed_relations_;
};

}  // namespace pgrelay::pgoutput
