// Renders decoded pgoutput changes and logical messages as JSON lines (`pgrelay recv`, NATS).
#pragma once

#include <string>
#include <string_view>

#include "pgoutput/messages.h"

namespace pgrelay::pgoutput {

// What a change line carries from its transaction's Begin (no buffering until Commit needed).
struct TransactionInfo {
  Xid xid = 0;
  Timestamp commit_time = 0;
};

// Looks up the Relation a change refers to (the decoder keeps them); nullptr when unknown.
class RelationLookup {
 public:
  virtual ~RelationLookup() = default;
  virtual const Relation* find(Oid oid) const = 0;
};

// Appends the JSON line(s), each ending in '\n', for one Insert, Update, Delete, Truncate (one
// line per truncated table) or LogicalMessage to `out`; other messages append nothing.
// `lsn` is the message's XLogData start; `txn` is null outside a transaction.
void append_json_lines(const Message& message, wire::Lsn lsn, const TransactionInfo* txn,
                       const RelationLookup& relations, std::string& out);

}  // namespace pgrelay::pgoutput
