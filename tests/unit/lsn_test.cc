// Tests LSN parsing, formatting and arithmetic against Postgres's pg_lsn behaviour.
#include "wire/lsn.h"

#include <gtest/gtest.h>

namespace pgrelay::wire {
namespace {

TEST(Lsn, ParsesWithAndWithoutPadding) {
  EXPECT_EQ(Lsn::parse("0/16B3748")->value(), 0x16B3748u);
  EXPECT_EQ(Lsn::parse("00000000/016B3748")->value(), 0x16B3748u);
  EXPECT_EQ(Lsn::parse("1/0")->value(), 0x100000000u);
  EXPECT_EQ(Lsn::parse("FFFFFFFF/FFFFFFFF")->value(), 0xFFFFFFFFFFFFFFFFu);
  EXPECT_EQ(Lsn::parse("a/b")->value(), 0xA0000000Bu);
}

TEST(Lsn, RejectsMalformed) {
  for (const char* bad : {"", "/", "0/", "/0", "0", "0/1/2", "123456789/0", "0/123456789", "g/0",
                          " 0/0", "0/0 ", "-1/0", "0x1/0"}) {
    EXPECT_FALSE(Lsn::parse(bad).has_value()) << bad;
  }
}

TEST(Lsn, FormatsAsPostgres) {
  EXPECT_EQ(Lsn(0).to_string(), "0/0");
  EXPECT_EQ(Lsn(0x16B3748).to_string(), "0/16B3748");
  EXPECT_EQ(Lsn(0x1000000AB).to_string(), "1/AB");
  EXPECT_EQ(Lsn(~0ull).to_string(), "FFFFFFFF/FFFFFFFF");
}

TEST(Lsn, RoundTripsAndCompares) {
  for (std::uint64_t v : {0ull, 1ull, 0xFFFFFFFFull, 0x100000000ull, 0x123456789ABCDEFull}) {
    EXPECT_EQ(Lsn::parse(Lsn(v).to_string())->value(), v);
  }
  EXPECT_LT(Lsn(1), Lsn(2));
  EXPECT_EQ(Lsn(5) + 3, Lsn(8));
  EXPECT_EQ(Lsn(8) - Lsn(5), 3u);
  EXPECT_FALSE(Lsn::invalid().is_valid());
}

}  // namespace
}  // namespace pgrelay::wire
