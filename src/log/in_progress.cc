// Transactions capture is still receiving: the writer's and readers' sides of their spill files.
#include "log/in_progress.h"

#include <algorithm>

#include "log/spill_file.h"
#include "log/transaction_builder.h"

namespace pgrelay::log {
namespace in_progress_detail {

struct ReaderState {
  std::uint64_t position = 0;  // what the reader has taken, as of its last read
  std::optional<InProgressReader::Cut> cut;
};

struct Shared {
  std::uint64_t id = 0;
  std::uint32_t xid = 0;
  Lsn begin_lsn;

  mutable std::mutex mu;
  std::string origin;
  std::shared_ptr<const FileHandle> file;  // null until the transaction spills
  std::uint64_t data_start = 0;
  std::string name;
  std::uint64_t readable = 0;
  std::uint64_t rewinds = 0;  // a read overlapped by a rewind is thrown away
  std::vector<XidRun> runs;
  InProgressPhase phase = InProgressPhase::kOpen;
  std::optional<InProgressCommit> commit;
  std::vector<std::shared_ptr<ReaderState>> readers;
};

}  // namespace in_progress_detail

using in_progress_detail::ReaderState;
using in_progress_detail::Shared;

// --- InProgressWriter ---

InProgressWriter& InProgressWriter::operator=(InProgressWriter&& other) noexcept {
  if (this != &other) {
    if (shared_) end(InProgressPhase::kAborted, nullptr);
    shared_ = std::move(other.shared_);
    owner_ = other.owner_;
    attached_ = other.attached_;
    shown_ = other.shown_;
  }
  return *this;
}

InProgressWriter::~InProgressWriter() {
  if (shared_) end(InProgressPhase::kAborted, nullptr);
}

void InProgressWriter::note_xid(std::uint64_t offset, std::uint32_t xid) {
  if (!shared_) return;
  std::lock_guard lock(shared_->mu);
  auto& runs = shared_->runs;
  if (!runs.empty() && runs.back().xid == xid) return;
  if (!runs.empty() && runs.back().offset == offset) {
    runs.back().xid = xid;  // the previous run never got a change
  } else {
    runs.push_back({offset, xid});
  }
}

void InProgressWriter::set_origin(std::string name) {
  if (!shared_) return;
  std::lock_guard lock(shared_->mu);
  shared_->origin = std::move(name);
}

void InProgressWriter::attach(FileHandle file, std::uint64_t data_start, std::string name) {
  if (!shared_) return;
  {
    std::lock_guard lock(shared_->mu);
    shared_->file = std::make_shared<const FileHandle>(std::move(file));
    shared_->data_start = data_start;
    shared_->name = std::move(name);
  }
  owner_->notify();
}

void InProgressWriter::set_readable(std::uint64_t readable) {
  if (!shared_) return;
  {
    std::lock_guard lock(shared_->mu);
    if (shared_->readable == readable || !shared_->file) return;
    shared_->readable = readable;
  }
  owner_->notify();
}

void InProgressWriter::rewind(std::uint64_t size, std::uint32_t subxid) {
  if (!shared_) return;
  {
    std::lock_guard lock(shared_->mu);
    ++shared_->rewinds;
    shared_->readable = std::min(shared_->readable, spill_data_kept_in_records(size));
    shown_ = shared_->readable;
    auto& runs = shared_->runs;
    runs.erase(
        std::find_if(runs.begin(), runs.end(), [&](const XidRun& r) { return r.offset >= size; }),
        runs.end());
    for (auto& reader : shared_->readers) {
      if (reader->position <= size) continue;
      if (!reader->cut || reader->cut->offset > size)
        reader->cut = InProgressReader::Cut{size, subxid};
    }
  }
  owner_->notify();
}

Status InProgressWriter::show(const TransactionBuilder& builder) {
  if (!shared_ || !builder.spilled()) return {};
  if (!attached_) {
    auto file = builder.spill_for_reading();
    if (!file.ok()) return file.error();
    attach(std::move(file->file), file->data_start, std::move(file->name));
    attached_ = true;
  }
  // Called once per change: the lock is taken only when a record was written.
  const std::uint64_t readable = builder.spill_readable();
  if (readable != shown_) {
    set_readable(readable);
    shown_ = readable;
  }
  return {};
}

void InProgressWriter::finish(const InProgressCommit& commit) {
  if (shared_) end(InProgressPhase::kFinished, &commit);
}

void InProgressWriter::abort() {
  if (shared_) end(InProgressPhase::kAborted, nullptr);
}

void InProgressWriter::end(InProgressPhase phase, const InProgressCommit* commit) {
  {
    std::lock_guard lock(shared_->mu);
    shared_->phase = phase;
    if (commit != nullptr) {
      shared_->commit = *commit;
      if (shared_->file) shared_->readable = commit->size;
    }
  }
  owner_->remove(shared_.get());
  shared_.reset();
  owner_->notify();
}

// --- InProgressSource ---

std::uint64_t InProgressSource::id() const {
  return shared_->id;
}
std::uint32_t InProgressSource::xid() const {
  return shared_->xid;
}
Lsn InProgressSource::begin_lsn() const {
  return shared_->begin_lsn;
}

// --- InProgressReader ---

InProgressReader::InProgressReader(const InProgressSource& source)
    : shared_(source.shared_), state_(std::make_shared<ReaderState>()) {
  std::lock_guard lock(shared_->mu);
  shared_->readers.push_back(state_);
}

InProgressReader::~InProgressReader() {
  std::lock_guard lock(shared_->mu);
  auto& readers = shared_->readers;
  readers.erase(std::remove(readers.begin(), readers.end(), state_), readers.end());
}

std::uint64_t InProgressReader::id() const {
  return shared_->id;
}
std::uint32_t InProgressReader::xid() const {
  return shared_->xid;
}
Lsn InProgressReader::begin_lsn() const {
  return shared_->begin_lsn;
}

InProgressPhase InProgressReader::phase() const {
  std::lock_guard lock(shared_->mu);
  return shared_->phase;
}

std::string InProgressReader::origin() const {
  std::lock_guard lock(shared_->mu);
  return shared_->origin;
}

std::optional<InProgressCommit> InProgressReader::commit() const {
  std::lock_guard lock(shared_->mu);
  return shared_->commit;
}

std::optional<InProgressReader::Cut> InProgressReader::take_cut() {
  std::lock_guard lock(shared_->mu);
  auto cut = std::exchange(state_->cut, std::nullopt);
  if (cut) {
    position_ = cut->offset;
    state_->position = cut->offset;
  }
  return cut;
}

std::uint64_t InProgressReader::available() const {
  std::lock_guard lock(shared_->mu);
  if (state_->cut) return 0;  // take the cut first
  return shared_->readable > position_ ? shared_->readable - position_ : 0;
}

Result<InProgressReader::Piece> InProgressReader::read(std::size_t max_bytes) {
  Piece piece;
  piece.offset = position_;
  std::shared_ptr<const FileHandle> file;
  std::uint64_t data_start = 0, rewinds = 0, end = 0;
  std::string name;
  {
    std::lock_guard lock(shared_->mu);
    if (state_->cut || !shared_->file || shared_->readable <= position_) return piece;
    end = position_ + std::min<std::uint64_t>(max_bytes, shared_->readable - position_);
    file = shared_->file;
    data_start = shared_->data_start;
    rewinds = shared_->rewinds;
    name = shared_->name;
    const auto& runs = shared_->runs;
    auto first = std::upper_bound(runs.begin(), runs.end(), position_,
                                  [](std::uint64_t at, const XidRun& r) { return at < r.offset; });
    if (first != runs.begin()) --first;
    for (auto it = first; it != runs.end() && it->offset < end; ++it) piece.runs.push_back(*it);
  }
  piece.data.resize(static_cast<std::size_t>(end - position_));
  Status st = read_spill_data(file->get(), data_start, position_, piece.data, name);
  std::lock_guard lock(shared_->mu);
  if (shared_->rewinds != rewinds) {
    // The file was cut (and perhaps written again) while it was read.
    piece.data.clear();
    piece.runs.clear();
    return piece;
  }
  if (!st.ok()) return st.error();
  position_ = end;
  state_->position = end;
  return piece;
}

// --- InProgressTransactions ---

InProgressWriter InProgressTransactions::open(std::uint32_t xid, Lsn begin_lsn) {
  auto shared = std::make_shared<Shared>();
  shared->xid = xid;
  shared->begin_lsn = begin_lsn;
  {
    std::lock_guard lock(mu_);
    shared->id = next_id_++;
    open_.push_back(shared);
    ++generation_;
  }
  notify();
  return InProgressWriter(std::move(shared), this);
}

std::vector<InProgressSource> InProgressTransactions::list() const {
  std::lock_guard lock(mu_);
  std::vector<InProgressSource> out;
  out.reserve(open_.size());
  for (const auto& shared : open_) out.push_back(InProgressSource(shared));
  return out;
}

std::uint64_t InProgressTransactions::generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

void InProgressTransactions::on_change(std::function<void()> listener) {
  std::lock_guard lock(mu_);
  listeners_.push_back(std::move(listener));
}

void InProgressTransactions::remove(const Shared* shared) {
  std::lock_guard lock(mu_);
  open_.erase(
      std::remove_if(open_.begin(), open_.end(), [&](const auto& s) { return s.get() == shared; }),
      open_.end());
  ++generation_;
}

void InProgressTransactions::notify() const {
  std::vector<std::function<void()>> listeners;
  {
    std::lock_guard lock(mu_);
    listeners = listeners_;
  }
  for (const auto& listener : listeners) listener();
}

}  // namespace pgrelay::log
