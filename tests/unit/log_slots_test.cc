// Tests the slot registry: name rules, Postgres's errors, persistence, batching, damage, owners.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "log/crc32c.h"
#include "log/slots.h"
#include "log_test_util.h"

namespace pgrelay::log {
namespace {

using testing::TempDir;

Slot make_slot(std::string name, Lsn confirmed = Lsn(0x1000), bool temporary = false) {
  Slot s;
  s.name = std::move(name);
  s.plugin = "pgoutput";
  s.database = "app db";  // spaces and the like must survive the file
  s.temporary = temporary;
  s.confirmed_flush = confirmed;
  return s;
}

std::unique_ptr<SlotRegistry> open_registry(const std::string& dir,
                                            SlotRegistryOptions options = {}) {
  auto r = SlotRegistry::open(dir, options);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? std::move(*r) : nullptr;
}

void expect_error(const Status& st, const std::string& code, const std::string& message) {
  ASSERT_FALSE(st.ok()) << "expected " << code << " " << message;
  EXPECT_EQ(st.error().sqlstate, code);
  EXPECT_EQ(st.error().message, message);
}

// --- names ---------------------------------------------------------------------------------

TEST(SlotNameTest, AcceptsPostgresAlphabetUpToSixtyThreeBytes) {
  EXPECT_TRUE(validate_slot_name("a").ok());
  EXPECT_TRUE(validate_slot_name("sub_1_slot").ok());
  EXPECT_TRUE(validate_slot_name("_").ok());
  EXPECT_TRUE(validate_slot_name("0123456789").ok());
  EXPECT_TRUE(validate_slot_name(std::string(63, 'x')).ok());
}

TEST(SlotNameTest, RejectsEmptyAsTooShort) {
  expect_error(validate_slot_name(""), "42602", "replication slot name \"\" is too short");
}

TEST(SlotNameTest, RejectsSixtyFourBytesAsTooLong) {
  std::string name(64, 'x');
  Status st = validate_slot_name(name);
  // Postgres reports ERRCODE_NAME_TOO_LONG here, not invalid_name.
  expect_error(st, "42622", "replication slot name \"" + name + "\" is too long");
  EXPECT_TRUE(st.error().hint.empty());
}

TEST(SlotNameTest, RejectsOtherCharactersWithHint) {
  for (const std::string& bad : std::vector<std::string>{"Slot", "a-b", "a b", "a.b", "sl\xC3\xB8t",
                                                         "x$", std::string("a\0b", 3)}) {
    Status st = validate_slot_name(bad);
    expect_error(st, "42602", "replication slot name \"" + bad + "\" contains invalid character");
    if (!st.ok()) {
      EXPECT_EQ(st.error().hint,
                "Replication slot names may only contain lower case letters, numbers, and the "
                "underscore character.");
    }
  }
}

TEST(SlotNameTest, LengthIsCheckedBeforeCharacters) {
  // 64 upper-case letters: too long wins, as in Postgres.
  EXPECT_EQ(validate_slot_name(std::string(64, 'X')).error().sqlstate, "42622");
}

// --- create, drop, get, list ---------------------------------------------------------------

TEST(SlotRegistryTest, CreateGetAndList) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  Slot s = make_slot("beta", Lsn(0x2000));
  s.two_phase = true;
  ASSERT_TRUE(reg->create(s).ok());
  ASSERT_TRUE(reg->create(make_slot("alpha")).ok());

  auto got = reg->get("beta");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->plugin, "pgoutput");
  EXPECT_EQ(got->database, "app db");
  EXPECT_TRUE(got->two_phase);
  EXPECT_EQ(got->confirmed_flush, Lsn(0x2000));
  EXPECT_EQ(got->restart_lsn, Lsn(0x2000));
  EXPECT_GT(got->created_at, 0);  // filled in: µs since 2000 is positive today
  EXPECT_FALSE(got->is_lost());

  auto all = reg->list();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].name, "alpha");
  EXPECT_EQ(all[1].name, "beta");
  EXPECT_FALSE(reg->get("gamma").has_value());
}

TEST(SlotRegistryTest, CreateRejectsInvalidName) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  expect_error(reg->create(make_slot("Bad")), "42602",
               "replication slot name \"Bad\" contains invalid character");
  EXPECT_EQ(reg->size(), 0u);
}

TEST(SlotRegistryTest, CreateKeepsExplicitCreationTimeAndClearsLostState) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  Slot s = make_slot("s");
  s.created_at = 12345;
  s.lost = LostCause::kMaxBytes;
  s.lost_reason = "stale";
  ASSERT_TRUE(reg->create(s).ok());
  EXPECT_EQ(reg->get("s")->created_at, 12345);
  EXPECT_FALSE(reg->get("s")->is_lost());
  EXPECT_TRUE(reg->get("s")->lost_reason.empty());
}

TEST(SlotRegistryTest, DuplicateNameIsRejected) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  ASSERT_TRUE(reg->create(make_slot("dup")).ok());
  expect_error(reg->create(make_slot("dup", Lsn(5), true)), "42710",
               "replication slot \"dup\" already exists");
  EXPECT_EQ(reg->get("dup")->confirmed_flush, Lsn(0x1000));
}

TEST(SlotRegistryTest, LimitCountsTemporarySlotsAndFreesOnDrop) {
  TempDir dir;
  SlotRegistryOptions o;
  o.max_slots = 2;
  auto reg = open_registry(dir.path(), o);
  ASSERT_TRUE(reg->create(make_slot("one")).ok());
  ASSERT_TRUE(reg->create(make_slot("two", Lsn(1), true)).ok());
  Status st = reg->create(make_slot("three"));
  expect_error(st, "53400", "all replication slots are in use");
  if (!st.ok()) {
    EXPECT_EQ(st.error().hint, "Free one or increase \"max_replication_slots\".");
  }
  // A duplicate is reported as such even when full, as Postgres checks names first.
  EXPECT_EQ(reg->create(make_slot("one")).error().sqlstate, "42710");
  ASSERT_TRUE(reg->drop("two").ok());
  EXPECT_TRUE(reg->create(make_slot("three")).ok());
}

TEST(SlotRegistryTest, DropMissingAndActive) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  expect_error(reg->drop("nope"), "42704", "replication slot \"nope\" does not exist");
  ASSERT_TRUE(reg->create(make_slot("busy")).ok());
  ASSERT_TRUE(reg->acquire("busy", 4242).ok());
  expect_error(reg->drop("busy"), "55006", "replication slot \"busy\" is active for PID 4242");
  ASSERT_TRUE(reg->release("busy").ok());
  EXPECT_TRUE(reg->drop("busy").ok());
  EXPECT_FALSE(reg->get("busy").has_value());
}

// --- confirm -------------------------------------------------------------------------------

TEST(SlotRegistryTest, ConfirmMovesOnlyForward) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  ASSERT_TRUE(reg->create(make_slot("s", Lsn(100))).ok());
  ASSERT_TRUE(reg->confirm("s", Lsn(300)).ok());
  EXPECT_EQ(reg->get("s")->confirmed_flush, Lsn(300));
  EXPECT_EQ(reg->get("s")->restart_lsn, Lsn(300));
  EXPECT_TRUE(reg->confirm("s", Lsn(200)).ok());  // ignored, not an error
  EXPECT_EQ(reg->get("s")->confirmed_flush, Lsn(300));
  EXPECT_EQ(reg->get("s")->restart_lsn, Lsn(300));
  expect_error(reg->confirm("t", Lsn(1)), "42704", "replication slot \"t\" does not exist");
}

TEST(SlotRegistryTest, EveryConfirmPersistsByDefault) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  ASSERT_TRUE(reg->create(make_slot("s", Lsn(100))).ok());
  ASSERT_TRUE(reg->confirm("s", Lsn(500)).ok());
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(500));
  auto again = open_registry(dir.path());
  EXPECT_EQ(again->get("s")->confirmed_flush, Lsn(500));
}

TEST(SlotRegistryTest, BatchedConfirmsPersistOnFlush) {
  TempDir dir;
  SlotRegistryOptions o;
  o.persist_every = 0;
  auto reg = open_registry(dir.path(), o);
  ASSERT_TRUE(reg->create(make_slot("s", Lsn(100))).ok());
  ASSERT_TRUE(reg->confirm("s", Lsn(500)).ok());
  EXPECT_EQ(reg->get("s")->confirmed_flush, Lsn(500));
  // Retention must still see the position on disk.
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(100));
  EXPECT_EQ(open_registry(dir.path())->get("s")->confirmed_flush, Lsn(100));  // "crash"

  ASSERT_TRUE(reg->flush().ok());
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(500));
  EXPECT_EQ(open_registry(dir.path())->get("s")->confirmed_flush, Lsn(500));
}

TEST(SlotRegistryTest, PersistEveryNConfirms) {
  TempDir dir;
  SlotRegistryOptions o;
  o.persist_every = 3;
  auto reg = open_registry(dir.path(), o);
  ASSERT_TRUE(reg->create(make_slot("s", Lsn(100))).ok());
  ASSERT_TRUE(reg->confirm("s", Lsn(200)).ok());
  ASSERT_TRUE(reg->confirm("s", Lsn(150)).ok());  // ignored: does not count
  ASSERT_TRUE(reg->confirm("s", Lsn(300)).ok());
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(100));
  ASSERT_TRUE(reg->confirm("s", Lsn(400)).ok());
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(400));
  EXPECT_EQ(open_registry(dir.path())->get("s")->confirmed_flush, Lsn(400));
}

TEST(SlotRegistryTest, PersistAfterInterval) {
  TempDir dir;
  SlotRegistryOptions o;
  o.persist_every = 0;
  o.persist_interval = std::chrono::milliseconds(5);
  auto reg = open_registry(dir.path(), o);
  ASSERT_TRUE(reg->create(make_slot("s", Lsn(100))).ok());
  ASSERT_TRUE(reg->confirm("s", Lsn(200)).ok());
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(reg->confirm("s", Lsn(300)).ok());
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(300));
}

TEST(SlotRegistryTest, MinPersistedConfirmedSkipsLostAndUsesTemporaryMemory) {
  TempDir dir;
  SlotRegistryOptions o;
  o.persist_every = 0;
  auto reg = open_registry(dir.path(), o);
  EXPECT_FALSE(reg->min_persisted_confirmed().has_value());
  ASSERT_TRUE(reg->create(make_slot("p", Lsn(1000))).ok());
  ASSERT_TRUE(reg->create(make_slot("t", Lsn(500), true)).ok());
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(500));
  ASSERT_TRUE(reg->confirm("t", Lsn(2000)).ok());  // temporary: no crash can undo it
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(1000));
  ASSERT_TRUE(reg->mark_lost({"p"}, LostCause::kMaxBytes, "test").ok());
  EXPECT_EQ(reg->min_persisted_confirmed(), Lsn(2000));
  ASSERT_TRUE(reg->mark_lost({"t"}, LostCause::kMaxBytes, "test").ok());
  EXPECT_FALSE(reg->min_persisted_confirmed().has_value());
}

TEST(SlotRegistryTest, ConcurrentConfirmsKeepTheHighest) {
  TempDir dir;
  SlotRegistryOptions o;
  o.persist_every = 0;
  auto reg = open_registry(dir.path(), o);
  for (int t = 0; t < 4; ++t) ASSERT_TRUE(reg->create(make_slot("s" + std::to_string(t))).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&reg, t] {
      for (std::uint64_t i = 1; i <= 2000; ++i) {
        (void)reg->confirm("s" + std::to_string(t), Lsn(0x1000 + i));
        (void)reg->confirm("s0", Lsn(0x1000 + i));
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(reg->flush().ok());
  auto again = open_registry(dir.path());
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(again->get("s" + std::to_string(t))->confirmed_flush, Lsn(0x1000 + 2000));
  }
}

// --- persistence ---------------------------------------------------------------------------

TEST(SlotRegistryTest, PersistentSlotsSurviveReopenTemporaryVanish) {
  TempDir dir;
  {
    auto reg = open_registry(dir.path());
    Slot s = make_slot("keep", Lsn(0x5000));
    s.two_phase = true;
    s.created_at = 777;
    ASSERT_TRUE(reg->create(s).ok());
    ASSERT_TRUE(reg->create(make_slot("temp", Lsn(0x10), true)).ok());
    ASSERT_TRUE(reg->create(make_slot("gone")).ok());
    ASSERT_TRUE(reg->drop("gone").ok());
    ASSERT_TRUE(reg->acquire("keep", 99).ok());
    ASSERT_TRUE(reg->confirm("keep", Lsn(0x6000)).ok());
  }
  auto reg = open_registry(dir.path());
  ASSERT_EQ(reg->size(), 1u);
  auto keep = reg->get("keep");
  ASSERT_TRUE(keep.has_value());
  EXPECT_EQ(keep->plugin, "pgoutput");
  EXPECT_EQ(keep->database, "app db");
  EXPECT_TRUE(keep->two_phase);
  EXPECT_FALSE(keep->temporary);
  EXPECT_EQ(keep->confirmed_flush, Lsn(0x6000));
  EXPECT_EQ(keep->restart_lsn, Lsn(0x6000));
  EXPECT_EQ(keep->created_at, 777);
  EXPECT_EQ(keep->active_pid, 0);  // runtime only
  EXPECT_FALSE(reg->get("temp").has_value());
  EXPECT_FALSE(reg->get("gone").has_value());
}

TEST(SlotRegistryTest, OpenCreatesMissingDirectory) {
  TempDir dir;
  std::string sub = dir.path() + "/fresh";
  auto reg = open_registry(sub);
  ASSERT_NE(reg, nullptr);
  EXPECT_EQ(reg->size(), 0u);
  EXPECT_EQ(reg->path(), sub + "/slots");
  ASSERT_TRUE(reg->create(make_slot("x")).ok());
  EXPECT_TRUE(std::filesystem::exists(sub + "/slots"));
}

TEST(SlotRegistryTest, LostStateIsPersisted) {
  TempDir dir;
  {
    auto reg = open_registry(dir.path());
    ASSERT_TRUE(reg->create(make_slot("x")).ok());
    ASSERT_TRUE(reg->mark_lost({"x", "no_such"}, LostCause::kMaxAge, "too old").ok());
  }
  auto reg = open_registry(dir.path());
  EXPECT_EQ(reg->get("x")->lost, LostCause::kMaxAge);
  EXPECT_EQ(reg->get("x")->lost_reason, "too old");
}

// --- damaged files -------------------------------------------------------------------------

void write_file(const std::string& path, const Bytes& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Replaces the trailing CRC so only the deliberate damage remains.
Bytes with_fixed_crc(Bytes data) {
  std::uint32_t crc = crc32c(ByteView(data).first(data.size() - 4));
  for (int i = 0; i < 4; ++i)
    data[data.size() - 4 + i] = static_cast<std::uint8_t>(crc >> (24 - 8 * i));
  return data;
}

void expect_damaged(const std::string& dir, const std::string& why) {
  auto r = SlotRegistry::open(dir);
  ASSERT_FALSE(r.ok()) << why;
  EXPECT_EQ(r.error().sqlstate, "XX001");
  EXPECT_NE(r.error().message.find(dir + "/slots"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(why), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().hint.find("delete it"), std::string::npos) << r.error().hint;
}

class DamagedSlotsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto reg = open_registry(dir_.path());
    ASSERT_TRUE(reg->create(make_slot("a")).ok());
    ASSERT_TRUE(reg->create(make_slot("b")).ok());
    good_ = read_file(path());
    ASSERT_GT(good_.size(), 20u);
  }
  std::string path() const { return dir_.path() + "/slots"; }

  TempDir dir_;
  Bytes good_;
};

TEST_F(DamagedSlotsFileTest, FlippedByte) {
  Bytes bad = good_;
  bad[bad.size() / 2] ^= 0x40;
  write_file(path(), bad);
  expect_damaged(dir_.path(), "CRC mismatch");
}

TEST_F(DamagedSlotsFileTest, Truncated) {
  write_file(path(), Bytes(good_.begin(), good_.end() - 7));
  expect_damaged(dir_.path(), "CRC mismatch");
  write_file(path(), Bytes(good_.begin(), good_.begin() + 5));
  expect_damaged(dir_.path(), "too short");
  write_file(path(), Bytes());
  expect_damaged(dir_.path(), "too short");
}

TEST_F(DamagedSlotsFileTest, BadMagic) {
  Bytes bad = good_;
  bad[0] = 'X';
  write_file(path(), with_fixed_crc(bad));
  expect_damaged(dir_.path(), "bad magic");
}

TEST_F(DamagedSlotsFileTest, UnknownVersion) {
  Bytes bad = good_;
  bad[11] = 9;  // version is the u32 after the 8-byte magic
  write_file(path(), with_fixed_crc(bad));
  expect_damaged(dir_.path(), "unsupported version 9");
}

TEST_F(DamagedSlotsFileTest, CountLargerThanContent) {
  Bytes bad = good_;
  bad[15] = 3;  // count says three slots, two follow
  write_file(path(), with_fixed_crc(bad));
  expect_damaged(dir_.path(), "truncated");
}

TEST_F(DamagedSlotsFileTest, TrailingBytes) {
  Bytes bad = good_;
  bad[15] = 1;  // count says one slot, two follow
  write_file(path(), with_fixed_crc(bad));
  expect_damaged(dir_.path(), "trailing bytes");
}

TEST(SlotsFormatTest, RoundTrip) {
  Slot a = make_slot("a", Lsn(0x1234567890ull));
  a.restart_lsn = Lsn(0x1234567890ull);
  a.two_phase = true;
  a.created_at = -5;
  a.lost = LostCause::kMaxBytes;
  a.lost_reason = "reason";
  Slot b = make_slot("b");
  b.plugin.clear();
  auto parsed = parse_slots(serialize_slots({a, b}), "f");
  ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0], a);
  EXPECT_EQ((*parsed)[1], b);
  auto empty = parse_slots(serialize_slots({}), "f");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(SlotsFormatTest, RejectsInvalidContentEvenWithGoodCrc) {
  Slot bad_name = make_slot("ok");
  bad_name.name = "Not-Valid";
  auto r1 = parse_slots(serialize_slots({bad_name}), "f");
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.error().message.find("invalid slot name"), std::string::npos);

  auto r2 = parse_slots(serialize_slots({make_slot("d"), make_slot("d")}), "f");
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().message.find("duplicate slot \"d\""), std::string::npos);

  Slot lost = make_slot("l");
  lost.lost = static_cast<LostCause>(7);
  auto r3 = parse_slots(serialize_slots({lost}), "f");
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.error().message.find("unknown lost cause"), std::string::npos);

  // Flags byte follows magic(8) version(4) count(4) and three strings of 4+len bytes.
  Bytes data = serialize_slots({make_slot("f")});
  std::size_t flags_at = 16 + (4 + 1) + (4 + 8) + (4 + 6);
  data[flags_at] = 0x80;
  auto r4 = parse_slots(with_fixed_crc(data), "f");
  ASSERT_FALSE(r4.ok());
  EXPECT_NE(r4.error().message.find("unknown flags"), std::string::npos);

  // A string length far beyond the file must fail cleanly, not allocate or over-read.
  Bytes huge = serialize_slots({make_slot("h")});
  huge[16] = 0xFF;
  auto r5 = parse_slots(with_fixed_crc(huge), "f");
  ASSERT_FALSE(r5.ok());
  EXPECT_NE(r5.error().message.find("truncated"), std::string::npos);
}

// --- owners and lost slots -----------------------------------------------------------------

TEST(SlotRegistryTest, AcquireAndReleaseConflicts) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  ASSERT_TRUE(reg->create(make_slot("s")).ok());
  ASSERT_TRUE(reg->acquire("s", 10).ok());
  EXPECT_EQ(reg->get("s")->active_pid, 10);
  EXPECT_TRUE(reg->acquire("s", 10).ok());  // same owner again
  expect_error(reg->acquire("s", 11), "55006", "replication slot \"s\" is active for PID 10");
  EXPECT_EQ(reg->get("s")->active_pid, 10);
  ASSERT_TRUE(reg->release("s").ok());
  EXPECT_EQ(reg->get("s")->active_pid, 0);
  EXPECT_TRUE(reg->acquire("s", 11).ok());
  expect_error(reg->acquire("x", 1), "42704", "replication slot \"x\" does not exist");
  expect_error(reg->release("x"), "42704", "replication slot \"x\" does not exist");
}

TEST(SlotRegistryTest, CreateMayAcquire) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  Slot s = make_slot("s");
  s.active_pid = 7;
  ASSERT_TRUE(reg->create(s).ok());
  EXPECT_EQ(reg->acquire("s", 8).error().sqlstate, "55006");
}

TEST(SlotRegistryTest, LostSlotRefusesToStreamButCanBeDropped) {
  TempDir dir;
  auto reg = open_registry(dir.path());
  ASSERT_TRUE(reg->create(make_slot("s")).ok());
  ASSERT_TRUE(reg->create(make_slot("t")).ok());
  EXPECT_TRUE(reg->check_usable("s").ok());
  expect_error(reg->check_usable("nope"), "42704", "replication slot \"nope\" does not exist");

  ASSERT_TRUE(reg->mark_lost({"s"}, LostCause::kMaxBytes, "r").ok());
  Status st = reg->check_usable("s");
  expect_error(st, "55000", "can no longer get changes from replication slot \"s\"");
  if (!st.ok()) {
    EXPECT_EQ(st.error().detail,
              "This slot has been invalidated because it exceeded the maximum reserved size.");
  }
  ASSERT_TRUE(reg->mark_lost({"t"}, LostCause::kMaxAge, "r").ok());
  Status age = reg->check_usable("t");
  ASSERT_FALSE(age.ok());
  EXPECT_EQ(age.error().sqlstate, "55000");
  EXPECT_NE(age.error().detail.find("maximum retention age"), std::string::npos);

  // Marking again keeps the first cause.
  ASSERT_TRUE(reg->mark_lost({"s"}, LostCause::kMaxAge, "other").ok());
  EXPECT_EQ(reg->get("s")->lost, LostCause::kMaxBytes);
  EXPECT_EQ(reg->get("s")->lost_reason, "r");

  ASSERT_TRUE(reg->acquire("s", 5).ok());
  ASSERT_TRUE(reg->release("s").ok());
  EXPECT_TRUE(reg->drop("s").ok());
}

TEST(SlotRegistryTest, FailedPersistRollsBack) {
  TempDir dir;
  std::string sub = dir.path() + "/d";
  auto reg = open_registry(sub);
  ASSERT_TRUE(reg->create(make_slot("a")).ok());
  // A directory where the temp file should go makes the atomic write fail.
  std::filesystem::create_directory(sub + "/slots.tmp");
  Status st = reg->create(make_slot("b"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("slots.tmp"), std::string::npos) << st.error().message;
  EXPECT_FALSE(reg->get("b").has_value());
  EXPECT_FALSE(reg->drop("a").ok());
  EXPECT_TRUE(reg->get("a").has_value());
  EXPECT_FALSE(reg->mark_lost({"a"}, LostCause::kMaxBytes, "r").ok());
  EXPECT_FALSE(reg->get("a")->is_lost());
  // Temporary slots need no write.
  EXPECT_TRUE(reg->create(make_slot("t", Lsn(1), true)).ok());
}

}  // namespace
}  // namespace pgrelay::log
