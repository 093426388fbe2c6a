// Streams transactions in progress to a consumer that asked for streaming, as stream blocks.
//
// pgoutput with `streaming` (protocol 2+) sends a large transaction before it commits:
// Stream Start .. its changes, each naming its (sub)transaction .. Stream Stop, as often as
// needed, then Stream Commit once it commits, or Stream Abort (of the whole transaction, or of
// one subtransaction, whose changes the subscriber drops). pgrelay does the same with what
// native capture shows of a transaction while it arrives (log/in_progress.h):
//  - Only once the walsender has sent everything the log holds, so blocks come after every
//    transaction committed before them, as Postgres sends them. A block is ended before
//    anything else is sent (a committed transaction, another transaction's block, shutdown).
//  - Through its own copy of the session's view (publications, row filters, column lists), so
//    each streamed transaction describes its tables afresh, as pgoutput does per streamed
//    transaction; after its Stream Commit, the consumer knows those Relations.
//  - When the log reaches the committed transaction, what was not streamed yet goes out in a
//    last block, then Stream Commit with the log's LSNs. The log's entry and the spill file
//    read here are the same bytes: the log takes that file.
//  - A subtransaction rolled back after some of its changes were sent gets Stream Abort with
//    the first (sub)transaction whose change was sent past the cut; what follows is read again.
//  - Where a stream cannot go on (capture marked a change of the publications inside it, or the
//    transaction never reaches the log), it is aborted for this consumer with Stream Abort, and
//    the log sends the transaction whole at its commit, as Begin .. Commit, which a streaming
//    consumer accepts as well.
// Binary mode is not streamed (its values are converted through the upstream, per entry).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>

#include "base/bytes.h"
#include "base/result.h"
#include "log/change_view.h"
#include "log/in_progress.h"
#include "pgoutput/options.h"

namespace pgrelay::server {

using wire::Lsn;

class InProgressStreamer {
 public:
  // Streams only when `registry` is set and `options` ask for it (protocol 2+, streaming on
  // or parallel, not binary).
  InProgressStreamer(log::InProgressTransactions* registry,
                     const pgoutput::PgoutputOptions& options);
  ~InProgressStreamer();
  InProgressStreamer(const InProgressStreamer&) = delete;
  InProgressStreamer& operator=(const InProgressStreamer&) = delete;

  bool enabled() const { return registry_ != nullptr; }

  // The walsender has sent what the log holds: streams what transactions in progress hold
  // now, through copies of the session's view (`view`, known as `view_id` in the encoded-entry
  // cache: when it changes, the publications changed, and every stream goes on through the new
  // one, describing its tables again, as pgoutput does after an invalidation), appending frames
  // to `out` until it passes `budget`. True when more could be streamed at once.
  Result<bool> stream(const log::ViewOptions& view, std::uint64_t view_id, Bytes& out,
                      std::size_t budget);
  // Ends the open stream block, if any: call before anything else is appended to `out`.
  void end_block(Bytes& out);

  // For a log entry about to be sent: whether this consumer was streamed part of it (then
  // send it with finish()). Streams the log has passed without their entry, and those rolled
  // back, are aborted here first.
  bool streamed(const log::EntryMeta& meta, Bytes& out);
  enum class Finished { kMore, kDone, kSendWhole };
  // Sends the rest of a streamed transaction, then its Stream Commit: call until it is not
  // kMore, writing `out` between calls. The Relations it sent join `known` (by OID, as they
  // are sent outside streams), as the consumer knows them after the commit. kSendWhole: the
  // stream was aborted instead (see above); send the entry as usual.
  Result<Finished> finish(const log::EntryMeta& meta, Bytes& out, std::size_t budget,
                          std::unordered_map<pgoutput::Oid, Bytes>& known);

 private:
  struct Stream;
  // Reads and sends what `s` holds now, until `out` passes `budget` or it holds less than a
  // block's worth (`at_least`, 0 for anything).
  Status pump(Stream& s, Bytes& out, std::size_t budget, std::uint64_t at_least);
  Status send_change(Stream& s, std::uint64_t offset, log::Change change, Bytes& out);
  void begin_block(Stream& s, Lsn lsn, Bytes& out);
  void apply_cut(Stream& s, const log::InProgressReader::Cut& cut, Bytes& out);
  // Stream Abort of the whole transaction to the consumer, if it was sent any of it.
  void abort_stream(Stream& s, Bytes& out);
  void refresh(const log::ViewOptions& view, std::uint64_t view_id, Bytes& out);

  log::InProgressTransactions* registry_;
  bool parallel_;
  std::uint64_t generation_ = ~0ull;
  std::uint64_t last_id_ = 0;                                 // highest registry id followed
  std::map<std::uint64_t, std::unique_ptr<Stream>> streams_;  // by registry id
  Stream* open_block_ = nullptr;                              // the stream whose block is open
  Lsn block_lsn_;                                             // the last change it sent
};

}  // namespace pgrelay::server
