// What a pass-through session reads of the frames it relays: replies owed, catalog rewrites, drops.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "server/server_context.h"
#include "wire/backend_stream_filter.h"
#include "wire/frame_reader.h"
#include "wire/frontend_messages.h"

namespace pgrelay::server {

// Client frames go upstream in batches of up to about this many bytes.
inline constexpr std::size_t kClientBatchBytes = 64 * 1024;

// The buffer upstream bytes are read into, given `held` bytes the filter kept from the last read
// at its front: room for a whole held notice and more after it.
inline std::size_t upstream_buffer_bytes(std::size_t held) {
  constexpr std::size_t kBytes = 64 * 1024;
  static_assert(kBytes > 2 * wire::BackendStreamFilter::kMaxHeldMessage);
  return std::max(kBytes, held + kBytes / 2);
}

// The protocol state of one session's two directions, whichever loop moves its bytes.
struct RelayState {
  RelayState();

  wire::BackendStreamFilter from_upstream;
  std::uint64_t replies_expected = 0;  // Query, Sync and FunctionCall frames forwarded
  bool unsynced = false;               // extended-protocol frames forwarded since the last Sync

  // No reply the client waits for is still to come.
  bool idle() const {
    return !unsynced && from_upstream.ready_for_query_count() >= replies_expected &&
           from_upstream.at_message_boundary();
  }
  void count_client_frame(char tag);
  // The client may leave now without its backend's session ending: no reply is owed and the
  // last ReadyForQuery said idle, outside a transaction.
  bool reusable_after_terminate() const;

  // The client sent Terminate, which was not forwarded, when reusable_after_terminate() held:
  // its upstream backend goes to the BackendPool instead of ending.
  bool client_left = false;
};

// One client frame, with the statement of a Query or Parse parsed once: both the DROP DATABASE
// check and the catalog rewrite read it.
struct ClientFrame {
  explicit ClientFrame(wire::FrameView view);
  const std::string* sql() const {
    if (query) return &query->sql;
    if (parse) return &parse->sql;
    return nullptr;
  }

  char tag;
  ByteView body;  // borrows the reader's buffer: valid until its next read
  std::optional<wire::Query> query;
  std::optional<wire::Parse> parse;
};

// Appends the frame to send upstream for one client frame: rewritten if it is a Query or Parse
// whose SQL names a virtualized object, else the original bytes.
void append_client_frame(ClientFrame& frame, const SqlRewrite& rewrite,
                         const StatementSource& source, Bytes& out);

// The databases a Query or Parse needs no other session in (see databases_used_alone): pgrelay
// lets go of them before the frame goes upstream.
std::vector<DatabaseUsedAlone> databases_used_alone_in(const ClientFrame& frame);

}  // namespace pgrelay::server
