// The Nats-Msg-Id of each message pgrelay publishes, and where a stream's last one leaves off.
//
// Each log entry is published as one sequence of messages, always the same for the same entry:
// its change messages first, then the parts of its log entry on the _tx subject.
//
//   change i of the entry committed at LSN X/Y   Nats-Msg-Id "X/Y/i"      (i from 0)
//   part k of that entry's log bytes             Nats-Msg-Id "X/Y/tx/k"   (k from 0)
//
// The ids are stable across restarts, so JetStream's duplicate window drops a copy published
// again; and a stream's last message says where its publisher stopped (resume_after()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "wire/lsn.h"

namespace pgrelay::nats {

struct MessageId {
  wire::Lsn commit_lsn;
  bool tx_part = false;      // a part of the log entry, else a change message
  std::uint32_t number = 0;  // the change's index, or the part's

  bool operator==(const MessageId&) const = default;
};

std::string format_message_id(const MessageId& id);
std::optional<MessageId> parse_message_id(std::string_view text);

// The Pgrelay-Part header of a _tx message, "k/n/S": part k of n, each S bytes but the last.
struct PartHeader {
  std::uint32_t number = 0;
  std::uint32_t count = 0;
  std::uint64_t size = 0;
  bool operator==(const PartHeader&) const = default;
};
std::string format_part_header(const PartHeader& part);
// nullopt unless it is one format_part_header() writes (n and S above 0, k below n).
std::optional<PartHeader> parse_part_header(std::string_view text);

// Where publishing goes on after a stream whose last message is `last`, the last of
// `parts_of_last` parts when it is a part: with the entry committed at `commit_lsn`, leaving
// out its first `skip` messages, or (whole) with the first entry committed after it.
struct ResumePoint {
  wire::Lsn commit_lsn;
  bool whole = false;           // the entry at commit_lsn was published whole
  std::uint64_t skip = 0;       // when not whole: its messages already in the stream
  std::uint32_t changes = 0;    // when not whole: its change messages (the count it was sent with)
  std::uint64_t part_size = 0;  // when the last was a part: the size its entry is cut into
  wire::Lsn previous;           // when not whole: the entry's Pgrelay-Previous-Lsn (invalid: none)
};
ResumePoint resume_after(const MessageId& last, std::uint32_t count_of_last,
                         std::uint32_t parts_of_last);

}  // namespace pgrelay::nats
