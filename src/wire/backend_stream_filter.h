// Follows a relayed stream of backend messages: boundaries, ReadyForQuery, notices, parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "base/bytes.h"
#include "wire/backend_messages.h"

namespace pgrelay::wire {

// A relay copies what the upstream sends to its client as it arrives, in chunks that cut
// messages anywhere. This walks those chunks without copying them, reading only message
// headers, so that the relay knows when a reply is complete (ReadyForQuery) and where a
// message starts, can drop a NoticeResponse it must not forward, and knows the parameter values
// the upstream reported (a backend kept for the next client tells it those at login).
//
// A NoticeResponse or ParameterStatus of up to kMaxHeldMessage bytes is held back until it is
// whole: the notice is then offered to the predicate, the parameter's value recorded. Larger
// ones, and everything else, pass as they come. A length below 4 (no Postgres server sends one)
// makes the filter give up tracking: from then on everything passes, and at_message_boundary()
// stays false.
class BackendStreamFilter {
 public:
  static constexpr std::size_t kMaxHeldMessage = 16 * 1024;
  // Receives a whole NoticeResponse body; true drops the message.
  using NoticePredicate = std::function<bool(ByteView body)>;

  explicit BackendStreamFilter(NoticePredicate drop_notice = {})
      : drop_notice_(std::move(drop_notice)) {}

  struct Pass {
    std::size_t send = 0;  // bytes at the front of the chunk to forward now
    std::size_t keep = 0;  // bytes right after them to put back in front of the next chunk
  };
  // Processes `chunk` (what was kept last time, followed by newly read bytes) in place: bytes
  // of dropped messages are removed by moving what follows them forward.
  Pass process(std::span<std::uint8_t> chunk);

  // ReadyForQuery messages forwarded so far.
  std::uint64_t ready_for_query_count() const { return ready_; }
  // Whether everything forwarded so far ends exactly at a message boundary.
  bool at_message_boundary() const { return tracking_ && body_left_ == 0; }
  // The transaction status of the last ReadyForQuery forwarded ('I', 'T' or 'E'; 0 before).
  char transaction_status() const { return status_; }
  // The last value of each parameter a ParameterStatus forwarded so far reported, in the order
  // each was first reported: the client's own SETs, and what the server changed by itself (a
  // configuration reload, a promotion's in_hot_standby).
  const ReportedParameters& reported_parameters() const { return reported_; }

 private:
  NoticePredicate drop_notice_;
  bool tracking_ = true;
  std::size_t body_left_ = 0;  // bytes of the current message still to pass
  bool in_ready_ = false;      // the current message is a ReadyForQuery
  std::uint64_t ready_ = 0;
  char status_ = 0;
  ReportedParameters reported_;
};

}  // namespace pgrelay::wire
