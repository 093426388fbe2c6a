// Tests SCRAM-SHA-256 secrets, server and client against RFC 7677 and Postgres's checks and texts.
#include "wire/scram.h"

#include <gtest/gtest.h>

#include <set>

namespace pgrelay::wire {
namespace {

// RFC 7677 section 3.
constexpr std::string_view kRfcClientNonce = "rOprNGfwEbeRWgbNEkqO";
constexpr std::string_view kRfcServerNonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
constexpr std::string_view kRfcSalt = "W22ZaJ0SNY7soEsUEjb6gQ==";
constexpr std::string_view kRfcClientFirst = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
constexpr std::string_view kRfcServerFirst =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
constexpr std::string_view kRfcClientFinal =
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
constexpr std::string_view kRfcServerFinal = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

// The RFC 7677 password as a Postgres secret. Derived with Python's hashlib:
//   sp = pbkdf2_hmac('sha256', b'pencil', b64decode(kRfcSalt), 4096)
//   StoredKey = sha256(hmac(sp, b'Client Key')), ServerKey = hmac(sp, b'Server Key')
constexpr std::string_view kPencilSecret =
    "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";

NonceSource fixed_nonce(std::string_view nonce) {
  return [n = std::string(nonce)] { return n; };
}

Bytes bytes_of(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

ScramVerifier pencil_verifier() {
  auto v = ScramVerifier::parse(kPencilSecret);
  EXPECT_TRUE(v.ok());
  return *v;
}

ScramServerOptions mock_options() {
  ScramServerOptions o;
  o.mock_secret = bytes_of("a server-lifetime secret");
  return o;
}

ScramServer server_for(const ScramVerifier& v, ScramServerOptions options = {},
                       std::string_view mechanism = kScramSha256) {
  auto s = ScramServer::begin("alice", mechanism, v, std::move(options));
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return std::move(s).value();
}

// Runs a full exchange; returns the first error, or an empty Status on success.
Status run_exchange(ScramClient& client, ScramServer& server) {
  auto first = client.client_first();
  PGRELAY_TRY(first);
  auto server_first = server.handle_client_first(*first);
  PGRELAY_TRY(server_first);
  auto final_message = client.handle_server_first(*server_first);
  PGRELAY_TRY(final_message);
  auto server_final = server.handle_client_final(*final_message);
  PGRELAY_TRY(server_final);
  return client.handle_server_final(*server_final);
}

void expect_error(const Error& e, std::string_view sqlstate, std::string_view message,
                  std::string_view detail = {}) {
  EXPECT_EQ(e.sqlstate, sqlstate);
  EXPECT_EQ(e.message, message);
  EXPECT_EQ(e.detail, detail);
}

// --- base64 ---

TEST(ScramBase64, EncodesAndDecodes) {
  EXPECT_EQ(base64_encode(bytes_of("")), "");
  EXPECT_EQ(base64_encode(bytes_of("n,,")), "biws");
  EXPECT_EQ(base64_encode(bytes_of("y,,")), "eSws");
  EXPECT_EQ(base64_encode(bytes_of("a")), "YQ==");
  EXPECT_EQ(base64_encode(bytes_of("ab")), "YWI=");
  EXPECT_EQ(base64_encode(Bytes{0xFB, 0xFF}), "+/8=");
  EXPECT_EQ(base64_decode("YWI="), bytes_of("ab"));
  EXPECT_EQ(base64_decode("YQ=="), bytes_of("a"));
  EXPECT_EQ(base64_decode(""), Bytes{});
  EXPECT_EQ(base64_decode("+/8="), (Bytes{0xFB, 0xFF}));
  Bytes all(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<std::uint8_t>(i);
  EXPECT_EQ(base64_decode(base64_encode(all)), all);
}

TEST(ScramBase64, RejectsMalformed) {
  for (std::string_view bad : {"Y", "YQ", "YQ=", "YWJj=", "Y===", "====", "YQ==YWJj",
                               "Y=Q=", "YW J", "YWJ\n", "YW-_", "YWJ\xc3", "@@@@"}) {
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
  }
}

// --- ScramVerifier ---

TEST(ScramVerifier, ParsesAndFormatsPostgresSecret) {
  auto v = ScramVerifier::parse(kPencilSecret);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->iterations, 4096);
  EXPECT_EQ(v->salt, *base64_decode(kRfcSalt));
  EXPECT_EQ(v->to_string(), kPencilSecret);
}

TEST(ScramVerifier, BuildsFromPasswordAndSalt) {
  auto v = ScramVerifier::from_password("pencil", *base64_decode(kRfcSalt), 4096);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->to_string(), kPencilSecret);
}

TEST(ScramVerifier, AppliesSaslprepOrRawBytes) {
  const Bytes salt = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  // Python: pbkdf2_hmac('sha256', b'IX', bytes(range(16)), 1000), keys as above.
  constexpr std::string_view kIx =
      "SCRAM-SHA-256$1000:AAECAwQFBgcICQoLDA0ODw==$a2UCuFx27kmNM4z8YO3XnJpcQ0DSyQ5EShct8llohKk=:"
      "AA5bpie1ZgBtG3OQ4AnrBA6xhO/M+sDZyt+Fc8Pamg0=";
  EXPECT_EQ(ScramVerifier::from_password("IX", salt, 1000)->to_string(), kIx);
  EXPECT_EQ(ScramVerifier::from_password("I\u00ADX", salt, 1000)->to_string(), kIx);
  EXPECT_EQ(ScramVerifier::from_password("\u2168", salt, 1000)->to_string(), kIx);
  // Not UTF-8: hashed as is. Python: pbkdf2_hmac('sha256', b'\xff\xfepass', bytes(range(16)),
  // 1000).
  EXPECT_EQ(
      ScramVerifier::from_password("\xff\xfepass", salt, 1000)->to_string(),
      "SCRAM-SHA-256$1000:AAECAwQFBgcICQoLDA0ODw==$ifd46/sP+gdRt4MQXmFr+QkLGAs2W1xgR7wVBaZYW7w=:"
      "Saj/kl6CBWR8KePKheQ9TjxBUoonP3zHbVHAGmwSr58=");
}

TEST(ScramVerifier, RandomSaltAndDefaults) {
  auto a = ScramVerifier::from_password("secret");
  auto b = ScramVerifier::from_password("secret");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->iterations, kScramDefaultIterations);
  EXPECT_EQ(a->salt.size(), kScramSaltLen);
  EXPECT_NE(a->salt, b->salt);
  EXPECT_NE(a->stored_key, b->stored_key);
  EXPECT_TRUE(a->verify_password("secret"));
  EXPECT_TRUE(b->verify_password("secret"));

  auto custom = ScramVerifier::from_password("secret", 10, [](std::span<std::uint8_t> out) {
    std::fill(out.begin(), out.end(), 0xAB);
    return true;
  });
  ASSERT_TRUE(custom.ok());
  EXPECT_EQ(custom->iterations, 10);
  EXPECT_EQ(custom->salt, Bytes(kScramSaltLen, 0xAB));

  auto broken =
      ScramVerifier::from_password("secret", 10, [](std::span<std::uint8_t>) { return false; });
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.error().sqlstate, sqlstate::kInternalError);
  EXPECT_FALSE(ScramVerifier::from_password("secret", 0).ok());
  EXPECT_FALSE(ScramVerifier::from_password("secret", Bytes{1}, -1).ok());
}

TEST(ScramVerifier, VerifiesCleartextPassword) {
  const ScramVerifier v = pencil_verifier();
  EXPECT_TRUE(v.verify_password("pencil"));
  EXPECT_FALSE(v.verify_password("Pencil"));
  EXPECT_FALSE(v.verify_password(""));
  EXPECT_FALSE(v.verify_password("pencil "));
}

TEST(ScramVerifier, RejectsMalformedSecrets) {
  const std::string good(kPencilSecret);
  const std::string keys =
      "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";
  const std::vector<std::string> bads = {
      std::string(""),
      std::string("md5ee69efad287c7423caf0b3229d71f567"),
      "SCRAM-SHA-1$4096:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
      "scram-sha-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
      "SCRAM-SHA-256$0:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
      "SCRAM-SHA-256$-1:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
      "SCRAM-SHA-256$40x:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
      "SCRAM-SHA-256$99999999999:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
      "SCRAM-SHA-256$:W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
      "SCRAM-SHA-256$4096:" + keys,
      "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ=" + keys,
      "SCRAM-SHA-256$4096W22ZaJ0SNY7soEsUEjb6gQ==" + keys,
      good.substr(0, good.size() - 1),
      good + "AAAA",
      good + ":x",
      "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$AAAA:"
      "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
      "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$"
      "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=",
  };
  for (const std::string& bad : bads) {
    auto r = ScramVerifier::parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.error().message, "invalid SCRAM secret");
    }
  }
}

// --- RFC 7677 test vector ---

TEST(ScramClient, Rfc7677Vector) {
  ScramClientOptions o;
  o.user = "user";
  o.nonce = fixed_nonce(kRfcClientNonce);
  ScramClient client("pencil", o);
  EXPECT_EQ(client.mechanism(), kScramSha256);
  EXPECT_EQ(*client.client_first(), kRfcClientFirst);
  auto final_message = client.handle_server_first(kRfcServerFirst);
  ASSERT_TRUE(final_message.ok()) << final_message.error().message;
  EXPECT_EQ(*final_message, kRfcClientFinal);
  EXPECT_FALSE(client.succeeded());
  EXPECT_TRUE(client.handle_server_final(kRfcServerFinal).ok());
  EXPECT_TRUE(client.succeeded());
  EXPECT_FALSE(client.channel_bound());
}

TEST(ScramServer, Rfc7677Vector) {
  ScramServerOptions o;
  o.nonce = fixed_nonce(kRfcServerNonce);
  ScramServer server = server_for(pencil_verifier(), o);
  auto server_first = server.handle_client_first(kRfcClientFirst);
  ASSERT_TRUE(server_first.ok()) << server_first.error().message;
  EXPECT_EQ(*server_first, kRfcServerFirst);
  auto server_final = server.handle_client_final(kRfcClientFinal);
  ASSERT_TRUE(server_final.ok()) << server_final.error().message << server_final.error().detail;
  EXPECT_EQ(*server_final, kRfcServerFinal);
  EXPECT_TRUE(server.succeeded());
  EXPECT_TRUE(server.log_detail().empty());
}

// --- Client against server ---

TEST(ScramExchange, ClientAgainstServerSucceeds) {
  auto v = ScramVerifier::from_password("correct horse");
  ASSERT_TRUE(v.ok());
  ScramClient client("correct horse");
  ScramServer server = server_for(*v);
  Status st = run_exchange(client, server);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(client.succeeded());
  EXPECT_TRUE(server.succeeded());
  EXPECT_FALSE(server.channel_bound());
}

TEST(ScramExchange, ClientSendsEmptyUserAndRandomNonce) {
  ScramClient a("x");
  ScramClient b("x");
  const std::string first_a = *a.client_first();
  const std::string first_b = *b.client_first();
  ASSERT_EQ(first_a.substr(0, 8), "n,,n=,r=");
  EXPECT_EQ(first_a.size(), 8 + 24u);  // base64 of 18 random bytes, as libpq
  EXPECT_NE(first_a, first_b);
}

TEST(ScramExchange, ServerNonceIsRandomAndExtendsClientNonce) {
  const ScramVerifier v = pencil_verifier();
  ScramServer a = server_for(v);
  ScramServer b = server_for(v);
  const std::string sa = *a.handle_client_first("n,,n=,r=abc");
  const std::string sb = *b.handle_client_first("n,,n=,r=abc");
  EXPECT_EQ(sa.substr(0, 5), "r=abc");
  EXPECT_EQ(sa.size(), std::string("r=abc,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096").size() + 24);
  EXPECT_NE(sa, sb);
}

TEST(ScramExchange, SaslprepMakesEquivalentPasswordsMatch) {
  auto v = ScramVerifier::from_password("I\u00ADX");
  ASSERT_TRUE(v.ok());
  ScramClient client("\u2168");  // NFKC: "IX"
  ScramServer server = server_for(*v);
  EXPECT_TRUE(run_exchange(client, server).ok());
}

TEST(ScramExchange, WrongPasswordFailsWith28P01) {
  ScramClient client("wrong");
  ScramServer server = server_for(pencil_verifier());
  Status st = run_exchange(client, server);
  ASSERT_FALSE(st.ok());
  expect_error(st.error(), "28P01", "password authentication failed for user \"alice\"");
  EXPECT_FALSE(server.succeeded());
  EXPECT_FALSE(client.succeeded());
}

TEST(ScramExchange, ChannelBindingPlus) {
  const Bytes cert_hash = bytes_of("0123456789abcdef0123456789abcdef");
  ScramServerOptions so;
  so.channel_binding_data = cert_hash;
  ScramClientOptions co;
  co.channel_binding = ScramChannelBinding::kPlus;
  co.channel_binding_data = cert_hash;
  ScramClient client("pencil", co);
  EXPECT_EQ(client.mechanism(), kScramSha256Plus);
  ScramServer server = server_for(pencil_verifier(), so, client.mechanism());
  auto first = client.client_first();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->substr(0, 28), "p=tls-server-end-point,,n=,r");
  auto server_first = server.handle_client_first(*first);
  ASSERT_TRUE(server_first.ok()) << server_first.error().message;
  auto final_message = client.handle_server_first(*server_first);
  ASSERT_TRUE(final_message.ok());
  std::string cbind = "p=tls-server-end-point,,";
  cbind.append(as_chars(cert_hash));
  EXPECT_EQ(final_message->substr(0, 2 + base64_encode(as_bytes(cbind)).size()),
            "c=" + base64_encode(as_bytes(cbind)));
  auto server_final = server.handle_client_final(*final_message);
  ASSERT_TRUE(server_final.ok()) << server_final.error().message;
  EXPECT_TRUE(client.handle_server_final(*server_final).ok());
  EXPECT_TRUE(server.channel_bound());
  EXPECT_TRUE(client.channel_bound());
}

TEST(ScramExchange, ChannelBindingDataMismatchFails) {
  ScramServerOptions so;
  so.channel_binding_data = bytes_of("server certificate hash");
  ScramClientOptions co;
  co.channel_binding = ScramChannelBinding::kPlus;
  co.channel_binding_data = bytes_of("a man-in-the-middle's hash");
  ScramClient client("pencil", co);
  ScramServer server = server_for(pencil_verifier(), so, kScramSha256Plus);
  Status st = run_exchange(client, server);
  ASSERT_FALSE(st.ok());
  expect_error(st.error(), "28000", "SCRAM channel binding check failed");
}

TEST(ScramExchange, ClientWithoutChannelBindingDataForPlusFails) {
  ScramClientOptions co;
  co.channel_binding = ScramChannelBinding::kPlus;
  ScramClient client("pencil", co);
  EXPECT_FALSE(client.client_first().ok());
}

TEST(ScramExchange, YFlagAcceptedOnlyWithoutServerChannelBinding) {
  ScramClientOptions co;
  co.channel_binding = ScramChannelBinding::kServerNotOffering;
  {
    ScramClient client("pencil", co);
    ScramServer server = server_for(pencil_verifier());
    EXPECT_TRUE(run_exchange(client, server).ok());
    EXPECT_FALSE(client.channel_bound());
  }
  {
    ScramServerOptions so;
    so.channel_binding_data = bytes_of("hash");
    ScramServer server = server_for(pencil_verifier(), so);
    auto r = server.handle_client_first("y,,n=,r=abc");
    ASSERT_FALSE(r.ok());
    expect_error(r.error(), "28000", "SCRAM channel binding negotiation error",
                 "The client supports SCRAM channel binding but thinks the server does not.  "
                 "However, this server does support channel binding.");
  }
}

TEST(ScramServer, MechanismSelection) {
  EXPECT_EQ(scram_mechanisms(false), std::vector<std::string_view>{kScramSha256});
  EXPECT_EQ(scram_mechanisms(true),
            (std::vector<std::string_view>{kScramSha256Plus, kScramSha256}));
  const ScramVerifier v = pencil_verifier();
  for (std::string_view bad : {"SCRAM-SHA-1", "", "scram-sha-256", "SCRAM-SHA-256-PLUS"}) {
    auto s = ScramServer::begin("alice", bad, v, {});  // no TLS: -PLUS is invalid too
    ASSERT_FALSE(s.ok()) << bad;
    expect_error(s.error(), "08P01", "client selected an invalid SASL authentication mechanism");
  }
}

TEST(ScramServer, FlagMustMatchMechanism) {
  ScramServerOptions so;
  so.channel_binding_data = bytes_of("hash");
  ScramServer plus = server_for(pencil_verifier(), so, kScramSha256Plus);
  auto r = plus.handle_client_first("n,,n=,r=abc");
  ASSERT_FALSE(r.ok());
  expect_error(r.error(), "08P01", "malformed SCRAM message",
               "The client selected SCRAM-SHA-256-PLUS, but the SCRAM message does not include "
               "channel binding data.");

  ScramServer plain = server_for(pencil_verifier(), so, kScramSha256);
  r = plain.handle_client_first("p=tls-server-end-point,,n=,r=abc");
  ASSERT_FALSE(r.ok());
  expect_error(r.error(), "08P01", "malformed SCRAM message",
               "The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message "
               "includes channel binding data.");

  ScramServer unique = server_for(pencil_verifier(), so, kScramSha256Plus);
  r = unique.handle_client_first("p=tls-unique,,n=,r=abc");
  ASSERT_FALSE(r.ok());
  expect_error(r.error(), "08P01", "unsupported SCRAM channel-binding type \"tls-unique\"");
}

// --- Server: malformed client-first-message ---

TEST(ScramServer, RejectsMalformedClientFirst) {
  struct Case {
    std::string message;
    std::string sqlstate;
    std::string text;
    std::string detail;
  };
  const std::vector<Case> cases = {
      {"", "08P01", "malformed SCRAM message", "The message is empty."},
      {std::string("n,,n=,r=a\0b", 11), "08P01", "malformed SCRAM message",
       "Message length does not match input length."},
      {"x,,n=,r=abc", "08P01", "malformed SCRAM message",
       "Unexpected channel-binding flag \"'x'\"."},
      {"\x01,,n=,r=abc", "08P01", "malformed SCRAM message",
       "Unexpected channel-binding flag \"0x01\"."},
      {"n", "08P01", "malformed SCRAM message", "Comma expected, but found character \"0x00\"."},
      {"n;,n=,r=abc", "08P01", "malformed SCRAM message",
       "Comma expected, but found character \"';'\"."},
      {"n,a=bob,n=,r=abc", "0A000", "client uses authorization identity, but it is not supported",
       ""},
      {"n,x,n=,r=abc", "08P01", "malformed SCRAM message",
       "Unexpected attribute \"'x'\" in client-first-message."},
      {"n,", "08P01", "malformed SCRAM message",
       "Unexpected attribute \"0x00\" in client-first-message."},
      {"n,,m=ext,n=,r=abc", "0A000", "client requires an unsupported SCRAM extension", ""},
      {"n,,r=abc", "08P01", "malformed SCRAM message",
       "Expected attribute \"n\" but found \"'r'\"."},
      {"n,,n", "08P01", "malformed SCRAM message", "Expected character \"=\" for attribute \"n\"."},
      {"n,,n=", "08P01", "malformed SCRAM message", "Expected attribute \"r\" but found \"0x00\"."},
      {"n,,n=,r=ab c", "08P01", "non-printable characters in SCRAM nonce", ""},
      {"n,,n=,r=ab\xc3\xa9", "08P01", "non-printable characters in SCRAM nonce", ""},
      {"n,,n=,r=abc,1=x", "08P01", "malformed SCRAM message",
       "Attribute expected, but found invalid character \"'1'\"."},
      {"n,,n=,r=abc,x", "08P01", "malformed SCRAM message",
       "Expected character \"=\" for attribute \"x\"."},
  };
  for (const Case& c : cases) {
    ScramServer server = server_for(pencil_verifier());
    auto r = server.handle_client_first(c.message);
    ASSERT_FALSE(r.ok()) << c.message;
    expect_error(r.error(), c.sqlstate, c.text, c.detail);
    // A failed exchange is dead.
    auto again = server.handle_client_first("n,,n=,r=abc");
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error().message, "invalid SCRAM exchange state");
  }
}

TEST(ScramServer, AcceptsIgnoredUserNameAndExtensions) {
  ScramServer server = server_for(pencil_verifier());
  auto r = server.handle_client_first("n,,n=somebody=2Celse,r=abc,x=1,y=2");
  ASSERT_TRUE(r.ok()) << r.error().detail;
  EXPECT_EQ(r->substr(0, 5), "r=abc");
}

// --- Server: malformed or tampered client-final-message ---

// A server that has answered the RFC client-first with the RFC server nonce.
ScramServer rfc_server_after_first() {
  ScramServerOptions o;
  o.nonce = fixed_nonce(kRfcServerNonce);
  ScramServer server = server_for(pencil_verifier(), o);
  EXPECT_TRUE(server.handle_client_first(kRfcClientFirst).ok());
  return server;
}

TEST(ScramServer, TamperedNonceFails) {
  ScramServer server = rfc_server_after_first();
  std::string msg(kRfcClientFinal);
  msg.replace(msg.find("k0,"), 2, "k1");
  auto r = server.handle_client_final(msg);
  ASSERT_FALSE(r.ok());
  expect_error(r.error(), "08P01", "invalid SCRAM response", "Nonce does not match.");
}

TEST(ScramServer, TamperedProofFails) {
  ScramServer server = rfc_server_after_first();
  std::string msg(kRfcClientFinal);
  msg[msg.find("p=") + 2] = 'e';  // "dHzb..." -> "eHzb...": valid base64, wrong proof
  auto r = server.handle_client_final(msg);
  ASSERT_FALSE(r.ok());
  expect_error(r.error(), "28P01", "password authentication failed for user \"alice\"");
  EXPECT_FALSE(server.succeeded());
}

TEST(ScramServer, RejectsMalformedClientFinal) {
  const std::string nonce = "r=" + std::string(kRfcClientNonce) + std::string(kRfcServerNonce);
  const std::string proof = "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
  struct Case {
    std::string message;
    std::string sqlstate;
    std::string text;
    std::string detail;
  };
  const std::vector<Case> cases = {
      {"", "08P01", "malformed SCRAM message", "The message is empty."},
      {"r=x", "08P01", "malformed SCRAM message", "Expected attribute \"c\" but found \"'r'\"."},
      {"c=eSws," + nonce + "," + proof, "08P01",
       "unexpected SCRAM channel-binding attribute in client-final-message", ""},
      {"c=," + nonce + "," + proof, "08P01",
       "unexpected SCRAM channel-binding attribute in client-final-message", ""},
      {"c=biws," + proof, "08P01", "malformed SCRAM message",
       "Expected attribute \"r\" but found \"'p'\"."},
      {"c=biws," + nonce, "08P01", "malformed SCRAM message",
       "Attribute expected, but found end of string."},
      {"c=biws," + nonce + ",", "08P01", "malformed SCRAM message",
       "Attribute expected, but found end of string."},
      {"c=biws," + nonce + ",p=not base64!", "08P01", "malformed SCRAM message",
       "Malformed proof in client-final-message."},
      {"c=biws," + nonce + ",p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndQ==", "08P01",
       "malformed SCRAM message", "Malformed proof in client-final-message."},  // 31 bytes
      {"c=biws," + nonce + ",p=", "08P01", "malformed SCRAM message",
       "Malformed proof in client-final-message."},
      {"c=biws," + nonce + "," + proof + ",x=1", "08P01", "malformed SCRAM message",
       "Garbage found at the end of client-final-message."},
  };
  for (const Case& c : cases) {
    ScramServer server = rfc_server_after_first();
    auto r = server.handle_client_final(c.message);
    ASSERT_FALSE(r.ok()) << c.message;
    expect_error(r.error(), c.sqlstate, c.text, c.detail);
    EXPECT_FALSE(server.handle_client_final(kRfcClientFinal).ok()) << "reusable after error";
  }
}

TEST(ScramServer, TrailingCommaAfterProofIsAcceptedAsInPostgres) {
  ScramServer server = rfc_server_after_first();
  auto r = server.handle_client_final(std::string(kRfcClientFinal) + ",");
  ASSERT_TRUE(r.ok()) << r.error().detail;
  EXPECT_EQ(*r, kRfcServerFinal);
}

TEST(ScramServer, ExtensionBeforeProofIsPartOfSignedMessage) {
  // Parsed and skipped, but it is part of client-final-message-without-proof, so the RFC
  // proof no longer matches: 28P01, not a parse error.
  ScramServer server = rfc_server_after_first();
  std::string msg(kRfcClientFinal);
  msg.insert(msg.find(",p="), ",x=ext");
  auto r = server.handle_client_final(msg);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, "28P01");
}

TEST(ScramServer, CallsOutOfOrderAndReuseFail) {
  {
    ScramServer server = server_for(pencil_verifier());
    auto r = server.handle_client_final(kRfcClientFinal);
    ASSERT_FALSE(r.ok());
    expect_error(r.error(), "XX000", "invalid SCRAM exchange state");
  }
  {
    ScramServer server = rfc_server_after_first();
    EXPECT_FALSE(server.handle_client_first(kRfcClientFirst).ok());
  }
  {
    ScramServer server = rfc_server_after_first();
    ASSERT_TRUE(server.handle_client_final(kRfcClientFinal).ok());
    auto again = server.handle_client_final(kRfcClientFinal);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error().message, "invalid SCRAM exchange state");
    EXPECT_FALSE(server.handle_client_first(kRfcClientFirst).ok());
    EXPECT_FALSE(server.succeeded());  // reuse poisons the exchange
  }
}

// --- Mock authentication ---

TEST(ScramServer, MockExchangeLooksRealAndFails) {
  auto begin = [](std::string_view user, ScramServerOptions o) {
    auto s = ScramServer::begin_mock(user, kScramSha256, std::move(o));
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  };
  ScramServer a = begin("ghost", mock_options());
  ScramServer b = begin("ghost", mock_options());
  ScramServer c = begin("other", mock_options());
  ScramServerOptions other_secret = mock_options();
  other_secret.mock_secret = bytes_of("another server");
  ScramServer d = begin("ghost", other_secret);

  auto salt_of = [](ScramServer& s) {
    std::string first = *s.handle_client_first("n,,n=,r=abc");
    const std::size_t at = first.find(",s=");
    const std::size_t end = first.find(",i=");
    EXPECT_EQ(first.substr(end), ",i=4096");
    return first.substr(at + 3, end - at - 3);
  };
  const std::string salt_a = salt_of(a);
  EXPECT_EQ(base64_decode(salt_a)->size(), kScramSaltLen);
  EXPECT_EQ(salt_a, salt_of(b));  // stable per user, so repeated probes see the same salt
  EXPECT_NE(salt_a, salt_of(c));
  EXPECT_NE(salt_a, salt_of(d));

  // Whatever the client answers, a mock exchange fails like a wrong password.
  ScramClient client("anything");
  ScramServer e = begin("ghost", mock_options());
  Status st = run_exchange(client, e);
  ASSERT_FALSE(st.ok());
  expect_error(st.error(), "28P01", "password authentication failed for user \"ghost\"");
  EXPECT_TRUE(e.log_detail().empty());
}

TEST(ScramServer, MockNeedsASecret) {
  auto s = ScramServer::begin_mock("ghost", kScramSha256, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().sqlstate, "XX000");
}

TEST(ScramServer, BeginWithStoredSecret) {
  {
    auto s = ScramServer::begin_with_secret("alice", kScramSha256, kPencilSecret, mock_options());
    ASSERT_TRUE(s.ok());
    ScramClient client("pencil");
    EXPECT_TRUE(run_exchange(client, *s).ok());
  }
  {
    auto s = ScramServer::begin_with_secret("bob", kScramSha256,
                                            "md5ee69efad287c7423caf0b3229d71f567", mock_options());
    ASSERT_TRUE(s.ok());
    ScramClient client("pencil");
    Status st = run_exchange(client, *s);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().sqlstate, "28P01");
    EXPECT_TRUE(st.error().detail.empty());  // the reason is for the log only
    EXPECT_EQ(s->log_detail(), "User \"bob\" does not have a valid SCRAM secret.");
  }
  {
    auto s = ScramServer::begin_with_secret("nobody", kScramSha256, std::nullopt, mock_options());
    ASSERT_TRUE(s.ok());
    ScramClient client("pencil");
    EXPECT_EQ(run_exchange(client, *s).error().sqlstate, "28P01");
    EXPECT_TRUE(s->log_detail().empty());
  }
}

// --- Client: server messages ---

// A client that has sent the RFC client-first-message.
ScramClient rfc_client_after_first(ScramClientOptions o = {}) {
  o.user = "user";
  o.nonce = fixed_nonce(kRfcClientNonce);
  ScramClient client("pencil", o);
  EXPECT_TRUE(client.client_first().ok());
  return client;
}

TEST(ScramClient, RejectsMalformedServerFirst) {
  struct Case {
    std::string message;
    std::string sqlstate;
    std::string text;
  };
  const std::string nonce = "r=" + std::string(kRfcClientNonce) + std::string(kRfcServerNonce);
  const std::vector<Case> cases = {
      {"", "08P01", "malformed SCRAM message (empty message)"},
      {std::string("r=a\0b", 5), "08P01", "malformed SCRAM message (length mismatch)"},
      {"s=abcd,i=1", "08P01", "malformed SCRAM message (attribute \"r\" expected)"},
      {"r", "08P01", "malformed SCRAM message (expected character \"=\" for attribute \"r\")"},
      {"r=rOprNGfwEbeRWgbNEkq,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "08P01",
       "invalid SCRAM response (nonce mismatch)"},
      {"r=XOprNGfwEbeRWgbNEkqOserver,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "08P01",
       "invalid SCRAM response (nonce mismatch)"},
      {nonce + ",i=4096", "08P01", "malformed SCRAM message (attribute \"s\" expected)"},
      {nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ=,i=4096", "08P01",
       "malformed SCRAM message (invalid salt)"},
      {nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ==", "08P01",
       "malformed SCRAM message (attribute \"i\" expected)"},
      {nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=0", "08P01",
       "malformed SCRAM message (invalid iteration count)"},
      {nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=-4096", "08P01",
       "malformed SCRAM message (invalid iteration count)"},
      {nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096x", "08P01",
       "malformed SCRAM message (invalid iteration count)"},
      {nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=99999999999", "08P01",
       "malformed SCRAM message (invalid iteration count)"},
      {nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=", "08P01",
       "malformed SCRAM message (invalid iteration count)"},
      {nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,x=1", "08P01",
       "malformed SCRAM message (garbage at end of server-first-message)"},
  };
  for (const Case& c : cases) {
    ScramClient client = rfc_client_after_first();
    auto r = client.handle_server_first(c.message);
    ASSERT_FALSE(r.ok()) << c.message;
    expect_error(r.error(), c.sqlstate, c.text);
    EXPECT_FALSE(client.handle_server_first(kRfcServerFirst).ok()) << "reusable after error";
  }
}

TEST(ScramClient, IterationCapIsCheckedBeforeHashing) {
  ScramClientOptions o;
  o.max_iterations = 4095;
  ScramClient client = rfc_client_after_first(o);
  auto r = client.handle_server_first(kRfcServerFirst);
  ASSERT_FALSE(r.ok());
  expect_error(r.error(), "28000",
               "SCRAM iteration count 4096 requested by the server exceeds the limit of 4095");

  // The default cap rejects an absurd count at once (2^31-1 PBKDF2 rounds would take minutes).
  ScramClient greedy = rfc_client_after_first();
  const std::string huge =
      "r=" + std::string(kRfcClientNonce) + "x,s=" + std::string(kRfcSalt) + ",i=2147483647";
  auto h = greedy.handle_server_first(huge);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().sqlstate, "28000");

  o.max_iterations = 4096;
  ScramClient exact = rfc_client_after_first(o);
  EXPECT_TRUE(exact.handle_server_first(kRfcServerFirst).ok());
}

TEST(ScramClient, HandlesServerFinal) {
  struct Case {
    std::string message;
    std::string sqlstate;
    std::string text;
  };
  const std::vector<Case> cases = {
      {"", "08P01", "malformed SCRAM message (empty message)"},
      {"e=invalid-proof", "28000", "error received from server in SCRAM exchange: invalid-proof"},
      {"e=other-error,x=1", "28000", "error received from server in SCRAM exchange: other-error"},
      {"e", "08P01", "malformed SCRAM message (expected character \"=\" for attribute \"e\")"},
      {"x=1", "08P01", "malformed SCRAM message (attribute \"v\" expected)"},
      {std::string(kRfcServerFinal) + ",x=1", "08P01",
       "malformed SCRAM message (garbage at end of server-final-message)"},
      {"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4", "08P01",
       "malformed SCRAM message (invalid server signature)"},
      {"v=YWJj", "08P01", "malformed SCRAM message (invalid server signature)"},
      {"v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=", "28000", "incorrect server signature"},
  };
  for (const Case& c : cases) {
    ScramClient client = rfc_client_after_first();
    ASSERT_TRUE(client.handle_server_first(kRfcServerFirst).ok());
    Status st = client.handle_server_final(c.message);
    ASSERT_FALSE(st.ok()) << c.message;
    expect_error(st.error(), c.sqlstate, c.text);
    EXPECT_FALSE(client.succeeded());
    EXPECT_FALSE(client.handle_server_final(kRfcServerFinal).ok()) << "reusable after error";
  }
}

TEST(ScramClient, CallsOutOfOrderAndReuseFail) {
  {
    ScramClient client("pencil");
    auto r = client.handle_server_first(kRfcServerFirst);
    ASSERT_FALSE(r.ok());
    expect_error(r.error(), "XX000", "invalid SCRAM exchange state");
  }
  {
    ScramClient client("pencil");
    ASSERT_TRUE(client.client_first().ok());
    EXPECT_FALSE(client.client_first().ok());
  }
  {
    ScramClient client = rfc_client_after_first();
    ASSERT_TRUE(client.handle_server_first(kRfcServerFirst).ok());
    ASSERT_TRUE(client.handle_server_final(kRfcServerFinal).ok());
    EXPECT_FALSE(client.handle_server_final(kRfcServerFinal).ok());
    EXPECT_FALSE(client.client_first().ok());
    EXPECT_FALSE(client.succeeded());
  }
}

TEST(ScramClient, EscapesUserName) {
  ScramClientOptions o;
  o.user = "a,b=c";
  o.nonce = fixed_nonce("xyz");
  ScramClient client("pencil", o);
  EXPECT_EQ(*client.client_first(), "n,,n=a=2Cb=3Dc,r=xyz");
}

TEST(ScramClient, RejectsUnprintableInjectedNonce) {
  for (std::string_view bad : {"", "a,b", "a b", "\xc3\xa9"}) {
    ScramClientOptions o;
    o.nonce = fixed_nonce(bad);
    ScramClient client("pencil", o);
    EXPECT_FALSE(client.client_first().ok()) << bad;
  }
}

TEST(ScramRandom, RandomBytes) {
  auto a = random_bytes(32);
  auto b = random_bytes(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(random_bytes(0)->size(), 0u);
  EXPECT_FALSE(random_bytes(4, [](std::span<std::uint8_t>) { return false; }).ok());
}

}  // namespace
}  // namespace pgrelay::wire
