// The replication slot registry: validation, Postgres's slot errors, and its persisted file.
#include "log/slots.h"

#include <cstring>

#include "log/crc32c.h"
#include "log/file_util.h"
#include "wire/replication_frames.h"

namespace pgrelay::log {

namespace {

constexpr char kSlotsMagic[8] = {'P', 'G', 'R', 'S', 'L', 'O', 'T', 'S'};
constexpr std::uint32_t kSlotsVersion = 1;
constexpr std::uint8_t kFlagTwoPhase = 1;

// Postgres's codes that base/result.h does not (yet) name.
constexpr const char* kNameTooLong = "42622";
constexpr const char* kConfigurationLimitExceeded = "53400";

Error slots_file_error(const std::string& path, const std::string& why) {
  return Error::make(
      sqlstate::kDataCorrupted, "replication slot file \"" + path + "\" is invalid: " + why,
      "The file is written atomically, so it was edited or damaged. Restore it from a backup; or "
      "delete it to drop every persistent slot, after which consumers must re-create their slots "
      "and resynchronize.");
}

Error no_such_slot(std::string_view name) {
  return Error::make(sqlstate::kUndefinedObject,
                     "replication slot \"" + std::string(name) + "\" does not exist");
}

Error slot_active(const Slot& slot) {
  return Error::make(sqlstate::kObjectInUse, "replication slot \"" + slot.name +
                                                 "\" is active for PID " +
                                                 std::to_string(slot.active_pid));
}

void put_string(ByteWriter& out, std::string_view s) {
  out.u32(static_cast<std::uint32_t>(s.size()));
  out.raw(s);
}

std::string get_string(ByteReader& in) {
  return in.string(in.u32());
}

}  // namespace

Status validate_slot_name(std::string_view name) {
  std::string quoted = "replication slot name \"" + std::string(name) + "\"";
  if (name.empty()) return Error::make(sqlstate::kInvalidName, quoted + " is too short");
  if (name.size() > kMaxSlotNameLength) return Error::make(kNameTooLong, quoted + " is too long");
  for (char c : name) {
    bool allowed = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!allowed) {
      return Error::make(sqlstate::kInvalidName, quoted + " contains invalid character",
                         "Replication slot names may only contain lower case letters, numbers, "
                         "and the underscore character.");
    }
  }
  return {};
}

std::int64_t now_pg_micros() {
  return wire::to_pg_timestamp(std::chrono::system_clock::now());
}

Bytes serialize_slots(const std::vector<Slot>& persistent_slots) {
  ByteWriter out;
  out.raw(ByteView(reinterpret_cast<const std::uint8_t*>(kSlotsMagic), sizeof kSlotsMagic));
  out.u32(kSlotsVersion);
  out.u32(static_cast<std::uint32_t>(persistent_slots.size()));
  for (const Slot& s : persistent_slots) {
    put_string(out, s.name);
    put_string(out, s.plugin);
    put_string(out, s.database);
    out.u8(s.two_phase ? kFlagTwoPhase : 0);
    out.u64(s.confirmed_flush.value());
    out.u64(s.restart_lsn.value());
    out.i64(s.created_at);
    out.u8(static_cast<std::uint8_t>(s.lost));
    put_string(out, s.lost_reason);
  }
  out.u32(crc32c(out.bytes()));
  return std::move(out).take();
}

Result<std::vector<Slot>> parse_slots(ByteView data, const std::string& path) {
  constexpr std::size_t kHeader = sizeof kSlotsMagic + 8;
  if (data.size() < kHeader + 4) return slots_file_error(path, "file is too short");
  if (std::memcmp(data.data(), kSlotsMagic, sizeof kSlotsMagic) != 0) {
    return slots_file_error(path, "not a pgrelay slot file (bad magic)");
  }
  ByteView body = data.first(data.size() - 4);
  ByteReader crc_reader(data.last(4));
  if (crc32c(body) != crc_reader.u32()) return slots_file_error(path, "CRC mismatch");

  ByteReader in(body);
  (void)in.bytes(sizeof kSlotsMagic);
  std::uint32_t version = in.u32();
  if (version != kSlotsVersion) {
    return slots_file_error(path, "unsupported version " + std::to_string(version) +
                                      " (this pgrelay reads version " +
                                      std::to_string(kSlotsVersion) + ")");
  }
  std::uint32_t count = in.u32();
  std::vector<Slot> slots;
  for (std::uint32_t i = 0; i < count && in.ok(); ++i) {
    Slot s;
    s.name = get_string(in);
    s.plugin = get_string(in);
    s.database = get_string(in);
    std::uint8_t flags = in.u8();
    s.confirmed_flush = Lsn(in.u64());
    s.restart_lsn = Lsn(in.u64());
    s.created_at = in.i64();
    std::uint8_t lost = in.u8();
    s.lost_reason = get_string(in);
    if (!in.ok()) break;
    if ((flags & ~kFlagTwoPhase) != 0) {
      return slots_file_error(path, "unknown flags in slot \"" + s.name + "\"");
    }
    s.two_phase = (flags & kFlagTwoPhase) != 0;
    if (lost > static_cast<std::uint8_t>(LostCause::kMaxAge)) {
      return slots_file_error(path, "unknown lost cause in slot \"" + s.name + "\"");
    }
    s.lost = static_cast<LostCause>(lost);
    if (!validate_slot_name(s.name).ok()) {
      return slots_file_error(path, "invalid slot name \"" + s.name + "\"");
    }
    for (const Slot& other : slots) {
      if (other.name == s.name) return slots_file_error(path, "duplicate slot \"" + s.name + "\"");
    }
    slots.push_back(std::move(s));
  }
  if (!in.ok()) return slots_file_error(path, "truncated slot entry");
  if (!in.at_end()) return slots_file_error(path, "trailing bytes after the last slot");
  return slots;
}

// ---------------------------------------------------------------------------------------------
// SlotRegistry

SlotRegistry::SlotRegistry(std::string dir, SlotRegistryOptions options)
    : dir_(std::move(dir)),
      path_(dir_ + "/" + kSlotsFileName),
      options_(options),
      last_persist_(std::chrono::steady_clock::now()) {}

Result<std::unique_ptr<SlotRegistry>> SlotRegistry::open(std::string dir,
                                                         SlotRegistryOptions options) {
  PGRELAY_TRY(ensure_directory(dir));
  std::unique_ptr<SlotRegistry> registry(new SlotRegistry(std::move(dir), options));
  if (!path_exists(registry->path_)) return registry;
  auto data = read_whole_file(registry->path_);
  if (!data.ok()) return data.take_error();
  auto slots = parse_slots(*data, registry->path_);
  if (!slots.ok()) return slots.take_error();
  for (Slot& s : *slots) {
    Lsn confirmed = s.confirmed_flush;
    std::string name = s.name;
    registry->slots_.emplace(std::move(name), Entry{std::move(s), confirmed});
  }
  return registry;
}

Status SlotRegistry::persist_locked() {
  std::vector<Slot> persistent;
  for (const auto& [name, entry] : slots_) {
    if (!entry.slot.temporary) persistent.push_back(entry.slot);
  }
  PGRELAY_TRY(write_file_atomically(dir_, kSlotsFileName, serialize_slots(persistent)));
  for (auto& [name, entry] : slots_) entry.persisted_confirmed = entry.slot.confirmed_flush;
  unpersisted_confirms_ = 0;
  last_persist_ = std::chrono::steady_clock::now();
  return {};
}

Status SlotRegistry::persist_if_due_locked() {
  if (unpersisted_confirms_ == 0) return {};
  bool due = options_.persist_every != 0 && unpersisted_confirms_ >= options_.persist_every;
  if (!due && options_.persist_interval.count() > 0) {
    due = std::chrono::steady_clock::now() - last_persist_ >= options_.persist_interval;
  }
  return due ? persist_locked() : Status();
}

Status SlotRegistry::create(Slot slot) {
  PGRELAY_TRY(validate_slot_name(slot.name));
  std::lock_guard lock(mu_);
  if (slots_.contains(slot.name)) {
    return Error::make(sqlstate::kDuplicateObject,
                       "replication slot \"" + slot.name + "\" already exists");
  }
  if (slots_.size() >= options_.max_slots) {
    return Error::make(kConfigurationLimitExceeded, "all replication slots are in use",
                       "Free one or increase \"max_replication_slots\".");
  }
  slot.lost = LostCause::kNone;
  slot.lost_reason.clear();
  if (slot.created_at == 0) slot.created_at = now_pg_micros();
  if (slot.restart_lsn < slot.confirmed_flush) slot.restart_lsn = slot.confirmed_flush;
  std::string name = slot.name;
  bool temporary = slot.temporary;
  Lsn confirmed = slot.confirmed_flush;
  auto [it, inserted] = slots_.emplace(name, Entry{std::move(slot), confirmed});
  if (!temporary) {
    if (Status st = persist_locked(); !st.ok()) {
      slots_.erase(it);
      return st;
    }
  }
  return {};
}

Status SlotRegistry::drop(std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(name);
  if (it == slots_.end()) return no_such_slot(name);
  if (it->second.slot.active_pid != 0) return slot_active(it->second.slot);
  Entry removed = std::move(it->second);
  slots_.erase(it);
  if (!removed.slot.temporary) {
    if (Status st = persist_locked(); !st.ok()) {
      std::string key = removed.slot.name;
      slots_.emplace(std::move(key), std::move(removed));
      return st;
    }
  }
  return {};
}

std::optional<Slot> SlotRegistry::get(std::string_view name) const {
  std::lock_guard lock(mu_);
  auto it = slots_.find(name);
  if (it == slots_.end()) return std::nullopt;
  return it->second.slot;
}

std::vector<Slot> SlotRegistry::list() const {
  std::lock_guard lock(mu_);
  std::vector<Slot> out;
  out.reserve(slots_.size());
  for (const auto& [name, entry] : slots_) out.push_back(entry.slot);
  return out;
}

std::size_t SlotRegistry::size() const {
  std::lock_guard lock(mu_);
  return slots_.size();
}

Status SlotRegistry::confirm(std::string_view name, Lsn lsn) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(name);
  if (it == slots_.end()) return no_such_slot(name);
  Slot& slot = it->second.slot;
  if (lsn <= slot.confirmed_flush) return {};
  slot.confirmed_flush = lsn;
  if (slot.restart_lsn < lsn) slot.restart_lsn = lsn;
  if (slot.temporary) return {};
  ++unpersisted_confirms_;
  return persist_if_due_locked();
}

Status SlotRegistry::flush() {
  std::lock_guard lock(mu_);
  if (unpersisted_confirms_ == 0) return {};
  return persist_locked();
}

Status SlotRegistry::acquire(std::string_view name, int pid) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(name);
  if (it == slots_.end()) return no_such_slot(name);
  Slot& slot = it->second.slot;
  if (slot.active_pid != 0 && slot.active_pid != pid) return slot_active(slot);
  slot.active_pid = pid;
  return {};
}

Status SlotRegistry::release(std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(name);
  if (it == slots_.end()) return no_such_slot(name);
  it->second.slot.active_pid = 0;
  return {};
}

Status SlotRegistry::check_usable(std::string_view name) const {
  std::lock_guard lock(mu_);
  auto it = slots_.find(name);
  if (it == slots_.end()) return no_such_slot(name);
  const Slot& slot = it->second.slot;
  switch (slot.lost) {
    case LostCause::kNone:
      return {};
    case LostCause::kMaxBytes:
      return Error::make(
          sqlstate::kObjectNotInPrerequisiteState,
          "can no longer get changes from replication slot \"" + slot.name + "\"",
          "Drop the slot and create it again; the consumer must then resynchronize.",
          "This slot has been invalidated because it exceeded the maximum reserved size.");
    case LostCause::kMaxAge:
      return Error::make(
          sqlstate::kObjectNotInPrerequisiteState,
          "can no longer get changes from replication slot \"" + slot.name + "\"",
          "Drop the slot and create it again; the consumer must then resynchronize.",
          "This slot has been invalidated because its unconfirmed changes exceeded the maximum "
          "retention age.");
  }
  return {};
}

Status SlotRegistry::mark_lost(const std::vector<std::string>& names, LostCause cause,
                               const std::string& reason) {
  std::lock_guard lock(mu_);
  std::vector<std::pair<Slot*, Slot>> previous;
  bool persistent_changed = false;
  for (const std::string& name : names) {
    auto it = slots_.find(name);
    if (it == slots_.end() || it->second.slot.is_lost()) continue;
    Slot& slot = it->second.slot;
    previous.emplace_back(&slot, slot);
    slot.lost = cause;
    slot.lost_reason = reason;
    persistent_changed = persistent_changed || !slot.temporary;
  }
  if (!persistent_changed) return {};
  if (Status st = persist_locked(); !st.ok()) {
    for (auto& [slot, before] : previous) {
      slot->lost = before.lost;
      slot->lost_reason = before.lost_reason;
    }
    return st;
  }
  return {};
}

std::vector<SlotHold> SlotRegistry::holds() const {
  std::lock_guard lock(mu_);
  std::vector<SlotHold> out;
  for (const auto& [name, entry] : slots_) {
    if (entry.slot.is_lost()) continue;
    out.push_back({name, entry.slot.database,
                   entry.slot.temporary ? entry.slot.confirmed_flush : entry.persisted_confirmed});
  }
  return out;
}

std::optional<Lsn> SlotRegistry::min_persisted_confirmed(const std::string& database) const {
  std::optional<Lsn> min;
  for (const SlotHold& hold : holds()) {
    if (!database.empty() && hold.database != database) continue;
    if (!min || hold.position < *min) min = hold.position;
  }
  return min;
}

}  // namespace pgrelay::log
