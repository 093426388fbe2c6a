// Encodes pgoutput messages to exactly the bytes Postgres's pgoutput plugin writes.
#pragma once

#include <cstddef>

#include "base/bytes.h"
#include "pgoutput/messages.h"

namespace pgrelay::pgoutput {

// Appends the message payload (what follows the XLogData header; no CopyData framing).
// Optional fields are written exactly when present: `xid` on streamed changes, `abort_info`
// on Stream Abort. The caller keeps the model consistent with the negotiated protocol and
// within the wire's limits, as Postgres's own values always are: names and prefixes without
// NUL bytes, at most 65535 columns, values and message contents under 2 GiB.
void encode(const Message& message, ByteWriter& out);

// The payload in a buffer of exactly the right size.
Bytes encode(const Message& message);

// The number of bytes encode() appends, so callers can size buffers up front.
std::size_t encoded_size(const Message& message);

}  // namespace pgrelay::pgoutput
