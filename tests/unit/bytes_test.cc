// Tests the big-endian ByteReader/ByteWriter, including that a short read fails instead of over-reading.
#include "base/bytes.h"

#include <gtest/gtest.h>

namespace pgrelay {
namespace {

TEST(Bytes, WritesBigEndianAndReadsBack) {
  ByteWriter w;
  w.u8(0x01);
  w.i16(-2);
  w.u32(0xDEADBEEF);
  w.i64(-3);
  w.cstr("hi");
  ByteReader r(w.bytes());
  EXPECT_EQ(r.u8(), 0x01);
  EXPECT_EQ(r.i16(), -2);
  EXPECT_EQ(r.u32(), 0xDEADBEEFu);
  EXPECT_EQ(r.i64(), -3);
  EXPECT_EQ(r.cstr(), "hi");
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.at_end());
  EXPECT_EQ(w.bytes()[1], 0xFF);
  EXPECT_EQ(w.bytes()[2], 0xFE);
}

TEST(Bytes, ShortReadFailsAndSticks) {
  const Bytes data{0x00, 0x01, 0x02};
  ByteReader r(data);
  EXPECT_EQ(r.u32(), 0u);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.u8(), 0u);  // stays failed even though a byte is available
  EXPECT_FALSE(r.ok());
}

TEST(Bytes, CstrWithoutTerminatorFails) {
  const Bytes data{'a', 'b'};
  ByteReader r(data);
  EXPECT_EQ(r.cstr(), "");
  EXPECT_FALSE(r.ok());
  ByteReader empty(ByteView{});
  EXPECT_EQ(empty.cstr(), "");
  EXPECT_FALSE(empty.ok());
}

TEST(Bytes, PatchU32) {
  ByteWriter w;
  w.u8('X');
  w.u32(0);
  w.raw(std::string_view("abc"));
  w.patch_u32(1, 7);
  ByteReader r(w.bytes());
  r.u8();
  EXPECT_EQ(r.u32(), 7u);
}

}  // namespace
}  // namespace pgrelay
