// Tests MD5 password hashes, challenge responses and the server-side password checks.
#include "wire/md5_auth.h"

#include <gtest/gtest.h>

#include "wire/scram.h"

namespace pgrelay::wire {
namespace {

// Expected values computed with Python's hashlib:
//   "md5" + md5(b"secret" + b"postgres").hexdigest()
constexpr std::string_view kPostgresSecretHash = "md553f48b7c4b76a86ce72276c5755f217d";
//   "md5" + md5(b"pencil" + b"alice").hexdigest()
constexpr std::string_view kAlicePencilHash = "md5ee69efad287c7423caf0b3229d71f567";
//   h = md5(b"secret" + b"postgres").hexdigest()
//   "md5" + md5(h.encode() + bytes([1, 2, 3, 4])).hexdigest()
constexpr std::string_view kResponse01020304 = "md5bb41a296aab6baccb36ff243a562abff";
//   "md5" + md5(h.encode() + bytes([0, 0xff, 0, 0x80])).hexdigest()
constexpr std::string_view kResponse00ff0080 = "md54195eab9226eccf1d87e735b4693d1f1";
// SCRAM secret of "pencil" (see scram_test.cc for its derivation).
constexpr std::string_view kPencilScram =
    "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";

constexpr Md5Salt kSalt1{1, 2, 3, 4};
constexpr Md5Salt kSalt2{0, 0xff, 0, 0x80};

TEST(Md5Auth, PasswordHash) {
  EXPECT_EQ(md5_password_hash("postgres", "secret"), kPostgresSecretHash);
  EXPECT_EQ(md5_password_hash("alice", "pencil"), kAlicePencilHash);
  EXPECT_EQ(md5_password_hash("alice", "pencil").size(), kMd5PasswordLen);
}

TEST(Md5Auth, ClientResponse) {
  EXPECT_EQ(md5_client_response("postgres", "secret", kSalt1), kResponse01020304);
  EXPECT_EQ(md5_client_response("postgres", "secret", kSalt2), kResponse00ff0080);
  EXPECT_EQ(*md5_client_response_from_hash(kPostgresSecretHash, kSalt1), kResponse01020304);
  EXPECT_EQ(*md5_client_response_from_hash(kPostgresSecretHash, kSalt2), kResponse00ff0080);
}

TEST(Md5Auth, ResponseFromHashNeedsAStoredMd5Hash) {
  for (std::string_view bad :
       {"", "md5", "secret", "md553F48B7C4B76A86CE72276C5755F217D",
        "md553f48b7c4b76a86ce72276c5755f217", "md553f48b7c4b76a86ce72276c5755f217dd",
        "xyz53f48b7c4b76a86ce72276c5755f217d", "md553f48b7c4b76a86ce72276c5755f217g"}) {
    auto r = md5_client_response_from_hash(bad, kSalt1);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().sqlstate, "22023");
  }
}

TEST(Md5Auth, StoredPasswordType) {
  EXPECT_EQ(stored_password_type(kPostgresSecretHash), StoredPasswordType::kMd5);
  EXPECT_EQ(stored_password_type(kPencilScram), StoredPasswordType::kScramVerifier);
  EXPECT_EQ(stored_password_type("secret"), StoredPasswordType::kPlaintext);
  EXPECT_EQ(stored_password_type("md553F48B7C4B76A86CE72276C5755F217D"),
            StoredPasswordType::kPlaintext);
  EXPECT_EQ(stored_password_type("SCRAM-SHA-256$4096:bad"), StoredPasswordType::kPlaintext);
}

TEST(Md5Auth, VerifiesResponse) {
  std::string detail;
  EXPECT_TRUE(
      md5_verify_response("postgres", kPostgresSecretHash, kResponse01020304, kSalt1, &detail)
          .ok());
  EXPECT_TRUE(detail.empty());

  // Right response for another salt, a truncated one, an empty one: all wrong.
  for (std::string_view wrong : {kResponse00ff0080, kResponse01020304.substr(0, 34),
                                 std::string_view(""), std::string_view("secret")}) {
    Status st = md5_verify_response("postgres", kPostgresSecretHash, wrong, kSalt1, &detail);
    ASSERT_FALSE(st.ok()) << wrong;
    EXPECT_EQ(st.error().sqlstate, "28P01");
    EXPECT_EQ(st.error().message, "password authentication failed for user \"postgres\"");
    EXPECT_TRUE(st.error().detail.empty());
    EXPECT_EQ(detail, "Password does not match for user \"postgres\".");
  }
  // Without a log-detail sink it still fails.
  EXPECT_FALSE(
      md5_verify_response("postgres", kPostgresSecretHash, kResponse00ff0080, kSalt1).ok());
}

TEST(Md5Auth, Md5CannotVerifyAgainstScramOrPlaintext) {
  for (std::string_view shadow : {kPencilScram, std::string_view("secret")}) {
    std::string detail;
    Status st = md5_verify_response("alice", shadow, kResponse01020304, kSalt1, &detail);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().sqlstate, "28P01");
    EXPECT_EQ(st.error().message, "password authentication failed for user \"alice\"");
    EXPECT_EQ(detail, "User \"alice\" has a password that cannot be used with MD5 authentication.");
  }
}

TEST(Md5Auth, PlainPasswordAgainstMd5) {
  std::string detail;
  EXPECT_TRUE(plain_password_verify("postgres", kPostgresSecretHash, "secret").ok());
  Status st = plain_password_verify("postgres", kPostgresSecretHash, "Secret", &detail);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sqlstate, "28P01");
  EXPECT_EQ(detail, "Password does not match for user \"postgres\".");
  // The user name is part of the hash.
  EXPECT_FALSE(plain_password_verify("postgres2", kPostgresSecretHash, "secret").ok());
}

TEST(Md5Auth, PlainPasswordAgainstScram) {
  std::string detail;
  EXPECT_TRUE(plain_password_verify("alice", kPencilScram, "pencil").ok());
  Status st = plain_password_verify("alice", kPencilScram, "pencil2", &detail);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sqlstate, "28P01");
  EXPECT_EQ(detail, "Password does not match for user \"alice\".");
  // SASLprep applies as for SCRAM: a soft hyphen disappears.
  EXPECT_TRUE(plain_password_verify("alice", kPencilScram, "pen\u00ADcil").ok());
}

TEST(Md5Auth, PlainPasswordAgainstUnrecognizedFormat) {
  std::string detail;
  Status st = plain_password_verify("alice", "pencil", "pencil", &detail);
  ASSERT_FALSE(st.ok());  // a stored cleartext password is never compared
  EXPECT_EQ(st.error().sqlstate, "28P01");
  EXPECT_EQ(detail, "Password of user \"alice\" is in unrecognized format.");
}

}  // namespace
}  // namespace pgrelay::wire
