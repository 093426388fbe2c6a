// Tests SASLprep against RFC 4013's examples and Postgres's pg_saslprep behaviour.
#include "wire/saslprep.h"

#include <gtest/gtest.h>

namespace pgrelay::wire {
namespace {

std::string prep(std::string_view s) {
  auto r = saslprep(s);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : std::string("<error>");
}

void expect_prohibited(std::string_view s) {
  auto r = saslprep(s);
  ASSERT_FALSE(r.ok()) << "accepted: " << *r;
  EXPECT_EQ(r.error().sqlstate, kSaslprepProhibited);
}

void expect_invalid_utf8(std::string_view s) {
  auto r = saslprep(s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, kSaslprepInvalidUtf8);
  EXPECT_FALSE(is_valid_utf8(s));
}

// RFC 4013 section 3.
TEST(Saslprep, Rfc4013Examples) {
  EXPECT_EQ(prep("I\u00ADX"), "IX");  // SOFT HYPHEN mapped to nothing
  EXPECT_EQ(prep("user"), "user");    // no transformation
  EXPECT_EQ(prep("USER"), "USER");    // case preserved
  EXPECT_EQ(prep("\u00AA"), "a");     // NFKC
  EXPECT_EQ(prep("\u2168"), "IX");    // NFKC
  expect_prohibited(
      "\u0627"
      "1");  // bidi: RandALCat string must end with RandALCat
}

// The RFC's "<U+0007> -> error" does not hold in Postgres: pure ASCII skips every step.
TEST(Saslprep, PureAsciiPassesThroughUnchanged) {
  EXPECT_EQ(prep("\x07"), "\x07");
  EXPECT_EQ(prep(""), "");
  EXPECT_EQ(prep(" a\tb,=\x7f"), " a\tb,=\x7f");
  // Once a non-ASCII character is present, the same control character is prohibited.
  expect_prohibited("\x07\u00E9");
}

TEST(Saslprep, MapsNonAsciiSpacesAndDeletesMappedToNothing) {
  EXPECT_EQ(prep("a\u00A0b"), "a b");
  EXPECT_EQ(prep("a\u3000b\u2003c"), "a b c");
  // U+200B is in both C.1.2 and B.1; Postgres tests C.1.2 first, so it becomes a space.
  EXPECT_EQ(prep("a\u200Bb"), "a b");
  EXPECT_EQ(prep("\uFEFFp\u00E9\u200Dss\uFE0F"), "p\u00E9ss");
}

TEST(Saslprep, EmptyAfterMappingIsProhibited) {
  expect_prohibited("\u00AD");
  expect_prohibited("\u200D\uFEFF");
}

TEST(Saslprep, NormalizesNfkc) {
  EXPECT_EQ(prep("\uFB01x"), "fix");                            // ligature
  EXPECT_EQ(prep("\uFF50\uFF41\uFF53\uFF53"), "pass");          // full-width
  EXPECT_EQ(prep("e\u0301"), "\u00E9");                         // composition
  EXPECT_EQ(prep("\u00C5ngstr\u00F6m"), "\u00C5ngstr\u00F6m");  // already normalized
}

TEST(Saslprep, ProhibitsOutputCharacters) {
  expect_prohibited("\u00E9\u0085");      // C.2.2 non-ASCII control
  expect_prohibited("\u00E9\uE000");      // C.3 private use
  expect_prohibited("\u00E9\uFDD0");      // C.4 non-character
  expect_prohibited("\u00E9\uFFFD");      // C.6 inappropriate for plain text
  expect_prohibited("\u00E9\u2FF0");      // C.7
  expect_prohibited("\u00E9\u200E");      // C.8 (LRM)
  expect_prohibited("\u00E9\U000E0001");  // C.9 tagging
  // Checked before normalization as in Postgres: U+0340 would normalize to U+0300.
  expect_prohibited("a\u0340");
}

TEST(Saslprep, ProhibitsCodePointsUnassignedInUnicode32) {
  expect_prohibited("\u0221");      // assigned only after Unicode 3.2
  expect_prohibited("\U0001F600");  // emoji
  EXPECT_EQ(prep("\u0220"), "\u0220");
}

TEST(Saslprep, ChecksBidi) {
  EXPECT_EQ(prep("\u0627"
                 "1"
                 "\u0628"),
            "\u0627"
            "1"
            "\u0628");
  expect_prohibited("\u0627a\u0628");  // RandALCat mixed with LCat
  expect_prohibited("1\u0627");        // must start with RandALCat
  EXPECT_EQ(prep("\u05D0"), "\u05D0");
}

TEST(Saslprep, RejectsInvalidUtf8) {
  expect_invalid_utf8("\xff");
  expect_invalid_utf8("\x80");              // lone continuation byte
  expect_invalid_utf8("\xc3");              // truncated
  expect_invalid_utf8("\xc3\x28");          // bad continuation
  expect_invalid_utf8("\xc0\xaf");          // overlong '/'
  expect_invalid_utf8("\xe0\x80\xaf");      // overlong
  expect_invalid_utf8("\xed\xa0\x80");      // surrogate
  expect_invalid_utf8("\xf4\x90\x80\x80");  // above U+10FFFF
  expect_invalid_utf8("\xf5\x80\x80\x80");
  expect_invalid_utf8("ok\xe2\x82");  // truncated at the end
  EXPECT_TRUE(is_valid_utf8("\u00E9\u20AC\U0001F600"));
}

TEST(Saslprep, PasswordFallsBackToRawBytes) {
  EXPECT_EQ(saslprep_password("I\u00ADX"), "IX");
  EXPECT_EQ(saslprep_password("\xff\xfepass"), "\xff\xfepass");  // not UTF-8
  EXPECT_EQ(saslprep_password("\u00E9\uE000"), "\u00E9\uE000");  // prohibited
  EXPECT_EQ(saslprep_password("\u00AD"), "\u00AD");              // empty after mapping
}

// Postgres accepts passwords up to 64 kB. Many compositions in one string once cost seconds (a
// quadratic NFKC); this must stay fast and correct.
TEST(Saslprep, LongInputIsHandled) {
  std::string hangul;
  std::string decomposed;
  std::string composed;
  for (int i = 0; i < 21845; ++i) hangul += "\uAC01";  // 3 bytes, decomposes to 3 jamo
  for (int i = 0; i < 10000; ++i) {
    decomposed += "e\u0301";
    composed += "\u00E9";
  }
  EXPECT_EQ(prep(hangul), hangul);
  EXPECT_EQ(prep(decomposed), composed);
}

}  // namespace
}  // namespace pgrelay::wire
