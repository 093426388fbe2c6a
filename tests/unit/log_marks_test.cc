// Tests for the marks file: what it lists across reopens, torn tails, older logs and retention.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "log/file_util.h"
#include "log/marks.h"
#include "log_test_util.h"

namespace pgrelay::log {
namespace {

using Lsns = std::vector<Lsn>;

std::string marks_path(const testing::TempDir& dir) {
  return dir.path() + "/" + kMarksName;
}

MarkFile open_marks(const testing::TempDir& dir, Lsn log_end = Lsn(), Lsn removed_through = Lsn()) {
  auto marks = MarkFile::open(dir.path(), log_end, removed_through, false, true);
  EXPECT_TRUE(marks.ok()) << marks.error().to_string();
  return std::move(*marks);
}

void append_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << bytes;
}

TEST(MarkFile, ListsWhatWasAddedSortedFromAStartAcrossReopens) {
  testing::TempDir dir;
  {
    MarkFile marks = open_marks(dir);
    EXPECT_FALSE(marks.unmarked_through().is_valid());  // a new log: every mark is listed
    EXPECT_EQ(marks.from(Lsn(0)), Lsns{});
    // A crash's leftover (900) before LSNs appended after it, and one marked twice.
    const Lsns first{Lsn(900), Lsn(300)};
    const Lsns second{Lsn(300), Lsn(500)};
    ASSERT_TRUE(marks.add(first).ok());
    ASSERT_TRUE(marks.add(second).ok());
    EXPECT_EQ(marks.from(Lsn(0)), (Lsns{Lsn(300), Lsn(500), Lsn(900)}));
    EXPECT_EQ(marks.from(Lsn(500)), (Lsns{Lsn(500), Lsn(900)}));
    EXPECT_EQ(marks.from(Lsn(901)), Lsns{});
  }
  MarkFile again = open_marks(dir, Lsn(5000));  // the log's end no longer matters
  EXPECT_FALSE(again.unmarked_through().is_valid());
  EXPECT_EQ(again.from(Lsn(301)), (Lsns{Lsn(500), Lsn(900)}));
}

TEST(MarkFile, ATornLastRecordIsDroppedAndWrittenOver) {
  testing::TempDir dir;
  {
    MarkFile marks = open_marks(dir);
    const Lsns lsns{Lsn(100), Lsn(200)};
    ASSERT_TRUE(marks.add(lsns).ok());
  }
  const auto whole = std::filesystem::file_size(marks_path(dir));
  append_bytes(marks_path(dir), std::string("\x00\x00\x00\x00\x00\x00\x01", 7));
  {
    MarkFile marks = open_marks(dir);
    EXPECT_EQ(marks.from(Lsn(0)), (Lsns{Lsn(100), Lsn(200)}));
    EXPECT_EQ(std::filesystem::file_size(marks_path(dir)), whole);  // the torn bytes are gone
    const Lsns more{Lsn(300)};
    ASSERT_TRUE(marks.add(more).ok());
  }
  EXPECT_EQ(open_marks(dir).from(Lsn(0)), (Lsns{Lsn(100), Lsn(200), Lsn(300)}));
}

TEST(MarkFile, ARecordWithABadChecksumEndsTheList) {
  testing::TempDir dir;
  {
    MarkFile marks = open_marks(dir);
    const Lsns lsns{Lsn(100), Lsn(200)};
    ASSERT_TRUE(marks.add(lsns).ok());
  }
  // Twelve bytes that look like a record but whose CRC does not match.
  append_bytes(marks_path(dir), std::string(12, '\x07'));
  EXPECT_EQ(open_marks(dir).from(Lsn(0)), (Lsns{Lsn(100), Lsn(200)}));
}

TEST(MarkFile, ALogOlderThanItsMarksFileSaysHowFarMarksAreUnknown) {
  testing::TempDir dir;
  {
    MarkFile marks = open_marks(dir, Lsn(4321));
    EXPECT_EQ(marks.unmarked_through(), Lsn(4321));
    const Lsns lsns{Lsn(5000)};
    ASSERT_TRUE(marks.add(lsns).ok());
  }
  MarkFile again = open_marks(dir, Lsn(9999));
  EXPECT_EQ(again.unmarked_through(), Lsn(4321));  // kept from when the file was made
  EXPECT_EQ(again.from(Lsn(0)), Lsns{Lsn(5000)});
}

TEST(MarkFile, OpeningDropsWhatRetentionRemoved) {
  testing::TempDir dir;
  {
    MarkFile marks = open_marks(dir, Lsn(1000));
    const Lsns lsns{Lsn(1500), Lsn(2500), Lsn(3500)};
    ASSERT_TRUE(marks.add(lsns).ok());
  }
  const auto before = std::filesystem::file_size(marks_path(dir));
  {
    MarkFile marks = open_marks(dir, Lsn(4000), /*removed_through=*/Lsn(999));
    EXPECT_EQ(marks.unmarked_through(), Lsn(1000));  // nothing removed reached it
    EXPECT_EQ(std::filesystem::file_size(marks_path(dir)), before);
  }
  {
    MarkFile marks = open_marks(dir, Lsn(4000), /*removed_through=*/Lsn(2500));
    EXPECT_FALSE(marks.unmarked_through().is_valid());
    EXPECT_EQ(marks.from(Lsn(0)), Lsns{Lsn(3500)});
    const Lsns more{Lsn(4500)};
    ASSERT_TRUE(marks.add(more).ok());
  }
  EXPECT_LT(std::filesystem::file_size(marks_path(dir)), before);
  EXPECT_EQ(open_marks(dir).from(Lsn(0)), (Lsns{Lsn(3500), Lsn(4500)}));
}

TEST(MarkFile, ReadOnlyNeverMakesTheFileAndRefusesToAdd) {
  testing::TempDir dir;
  auto marks = MarkFile::open(dir.path(), Lsn(700), Lsn(), /*read_only=*/true, false);
  ASSERT_TRUE(marks.ok()) << marks.error().to_string();
  EXPECT_FALSE(path_exists(marks_path(dir)));
  EXPECT_EQ(marks->unmarked_through(), Lsn(700));  // no list: every entry may be marked
  const Lsns lsns{Lsn(800)};
  Status refused = marks->add(lsns);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().sqlstate, sqlstate::kFeatureNotSupported);
}

TEST(MarkFile, ADamagedHeaderIsCorruptionThatSaysToRemoveTheFile) {
  testing::TempDir dir;
  { open_marks(dir); }
  {
    std::fstream f(marks_path(dir), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(10);
    f.put('\x55');
  }
  auto marks = MarkFile::open(dir.path(), Lsn(), Lsn(), false, true);
  ASSERT_FALSE(marks.ok());
  EXPECT_EQ(marks.error().sqlstate, sqlstate::kDataCorrupted);
  EXPECT_NE(marks.error().message.find("CRC"), std::string::npos) << marks.error().message;
  EXPECT_NE(marks.error().hint.find("Remove the file"), std::string::npos);

  ASSERT_EQ(::truncate(marks_path(dir).c_str(), 5), 0);  // shorter than a header
  auto shortened = MarkFile::open(dir.path(), Lsn(), Lsn(), false, true);
  ASSERT_FALSE(shortened.ok());
  EXPECT_EQ(shortened.error().sqlstate, sqlstate::kDataCorrupted);
}

}  // namespace
}  // namespace pgrelay::log
