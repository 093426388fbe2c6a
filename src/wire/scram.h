// SCRAM-SHA-256 (RFC 5802, RFC 7677) as Postgres speaks it: stored secrets, server and client
// exchanges.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"

namespace pgrelay::wire {

inline constexpr std::string_view kScramSha256 = "SCRAM-SHA-256";
inline constexpr std::string_view kScramSha256Plus = "SCRAM-SHA-256-PLUS";
// The only channel-binding type Postgres supports (RFC 5929).
inline constexpr std::string_view kTlsServerEndPoint = "tls-server-end-point";

inline constexpr std::size_t kScramKeyLen = 32;       // SHA-256 output
inline constexpr std::size_t kScramSaltLen = 16;      // Postgres's SCRAM_DEFAULT_SALT_LEN
inline constexpr std::size_t kScramRawNonceLen = 18;  // Postgres's SCRAM_RAW_NONCE_LEN
inline constexpr int kScramDefaultIterations = 4096;  // Postgres's SCRAM_DEFAULT_ITERATIONS
// The client refuses a server-first-message asking for more PBKDF2 iterations than this, so a
// hostile server cannot make it burn CPU. One million is above every recommended setting (OWASP
// suggests 600,000 for PBKDF2-HMAC-SHA256) and costs well under a second.
inline constexpr int kScramDefaultMaxIterations = 1'000'000;

// Postgres's error when the SCRAM client proof is wrong (the same for every password method).
Error password_auth_failed(std::string_view user);

using ScramKey = std::array<std::uint8_t, kScramKeyLen>;

// Fills `out` with unpredictable bytes; returns false on failure. Empty means OpenSSL's CSPRNG.
using RandomSource = std::function<bool(std::span<std::uint8_t> out)>;
// Produces one nonce: printable ASCII without ','. Empty means base64 of kScramRawNonceLen
// CSPRNG bytes, as Postgres does. Tests inject fixed nonces (e.g. RFC 7677's).
using NonceSource = std::function<std::string()>;

// `n` bytes from `source` (the CSPRNG when empty); XX000 if the source fails.
Result<Bytes> random_bytes(std::size_t n, const RandomSource& source = {});

// Standard base64 with padding and no whitespace (Postgres's pg_b64_encode/pg_b64_decode).
std::string base64_encode(ByteView data);
// nullopt for anything that is not canonical-length padded base64 (no whitespace, no data after
// padding).
std::optional<Bytes> base64_decode(std::string_view text);

// The mechanism names a server offers in AuthenticationSASL, most preferred first: the -PLUS
// variant only when the connection has TLS channel-binding data.
std::vector<std::string_view> scram_mechanisms(bool channel_binding_available);

// A role's SCRAM secret as stored in pg_authid.rolpassword:
//   SCRAM-SHA-256$<iterations>:<salt base64>$<StoredKey base64>:<ServerKey base64>
struct ScramVerifier {
  int iterations = kScramDefaultIterations;
  Bytes salt;
  ScramKey stored_key{};
  ScramKey server_key{};

  // 22023 "invalid SCRAM secret" (with a detail) for anything malformed.
  static Result<ScramVerifier> parse(std::string_view secret);
  // From a password (SASLprep'd, or raw if SASLprep refuses it) with a random salt.
  static Result<ScramVerifier> from_password(std::string_view password,
                                             int iterations = kScramDefaultIterations,
                                             const RandomSource& random = {});
  // Deterministic variant with a given salt.
  static Result<ScramVerifier> from_password(std::string_view password, ByteView salt,
                                             int iterations);

  std::string to_string() const;

  // Postgres's check for cleartext `password` authentication against a SCRAM secret: recompute
  // ServerKey and compare in constant time.
  bool verify_password(std::string_view password) const;

  bool operator==(const ScramVerifier&) const = default;
};

struct ScramServerOptions {
  // tls-server-end-point data (hash of the server certificate) when the connection uses TLS and
  // channel binding is available; empty otherwise, and then SCRAM-SHA-256-PLUS is refused.
  Bytes channel_binding_data;
  // A secret generated once per server (Postgres's mock_authentication_nonce): mock salts are
  // SHA-256(user || mock_secret), so they are stable per user yet unpredictable. Required for
  // mock exchanges.
  Bytes mock_secret;
  int mock_iterations = kScramDefaultIterations;
  NonceSource nonce;
};

// The server side of one SCRAM exchange. Single use: a call out of order, after an error or after
// completion fails with XX000 "invalid SCRAM exchange state" (a moved-from object is not to be
// used at all). No I/O: the caller moves the
// messages (the data of SASLInitialResponse/SASLResponse and AuthenticationSASLContinue/Final).
// A SASLInitialResponse without initial response (length -1) is the caller's to answer with an
// empty AuthenticationSASLContinue; the client then sends the client-first-message.
class ScramServer {
 public:
  // `user` is the user name of the startup packet (the one inside SCRAM is ignored, as Postgres
  // does); `mechanism` is the one the client selected. 08P01 "client selected an invalid SASL
  // authentication mechanism" for an unknown name, or -PLUS without channel-binding data.
  static Result<ScramServer> begin(std::string_view user, std::string_view mechanism,
                                   const ScramVerifier& verifier, ScramServerOptions options);
  // A doomed exchange that looks like a real one (deterministic fake salt) and fails with
  // 28P01 at the end, so that a client cannot learn whether `user` exists.
  static Result<ScramServer> begin_mock(std::string_view user, std::string_view mechanism,
                                        ScramServerOptions options, std::string log_detail = {});
  // Postgres's scram_init: `shadow_pass` is pg_authid.rolpassword, nullopt for an unknown user
  // or no password; a secret that is not a valid SCRAM secret (md5, plaintext) leads to a mock
  // exchange with a log detail.
  static Result<ScramServer> begin_with_secret(std::string_view user, std::string_view mechanism,
                                               std::optional<std::string_view> shadow_pass,
                                               ScramServerOptions options);

  ScramServer(ScramServer&&) = default;
  ScramServer& operator=(ScramServer&&) = default;
  ScramServer(const ScramServer&) = delete;
  ScramServer& operator=(const ScramServer&) = delete;
  ~ScramServer();

  // client-first-message -> server-first-message.
  Result<std::string> handle_client_first(std::string_view message);
  // client-final-message -> server-final-message "v=<ServerSignature>". A wrong proof (or a mock
  // exchange) gives 28P01 "password authentication failed for user ..."; like Postgres the
  // server then sends that ErrorResponse rather than an "e=" server-final-message.
  Result<std::string> handle_client_final(std::string_view message);

  // True once the client proved knowledge of the password.
  bool succeeded() const { return state_ == State::kFinished; }
  bool channel_bound() const { return succeeded() && use_channel_binding_; }
  // Why a mock exchange is doomed, for the server log only (Postgres's errdetail_log); never
  // send it to the client, it would reveal whether the user exists.
  const std::string& log_detail() const { return log_detail_; }

 private:
  enum class State { kInit, kSaltSent, kFinished, kFailed };

  ScramServer() = default;
  static Result<ScramServer> make(std::string_view user, std::string_view mechanism,
                                  ScramServerOptions options);
  Error fail(Error error);
  Status read_client_first(std::string_view message);
  Status read_client_final(std::string_view message);
  bool verify_client_proof() const;

  State state_ = State::kInit;
  std::string user_;
  bool use_channel_binding_ = false;
  Bytes channel_binding_data_;
  NonceSource nonce_;
  bool doomed_ = false;
  std::string log_detail_;

  int iterations_ = 0;
  Bytes salt_;
  ScramKey stored_key_{};
  ScramKey server_key_{};

  char cbind_flag_ = 0;
  std::string client_first_bare_;
  std::string client_nonce_;
  std::string server_nonce_;
  std::string server_first_;
  std::string client_final_without_proof_;
  std::string client_final_nonce_;
  ScramKey client_proof_{};
};

// How the client's gs2 header treats channel binding (libpq's channel_binding setting).
enum class ScramChannelBinding {
  kNone,               // "n": no TLS, or channel_binding=disable
  kServerNotOffering,  // "y": the client could bind, but the server offered no -PLUS mechanism
  kPlus,               // "p=tls-server-end-point": SCRAM-SHA-256-PLUS
};

struct ScramClientOptions {
  ScramChannelBinding channel_binding = ScramChannelBinding::kNone;
  // Hash of the server certificate (tls-server-end-point); required with kPlus.
  Bytes channel_binding_data;
  // The SCRAM user name; libpq sends it empty (the startup packet names the user).
  std::string user;
  int max_iterations = kScramDefaultMaxIterations;
  NonceSource nonce;
};

// The client side of one SCRAM exchange, as libpq performs it. Single use, no I/O. Errors: 08P01
// for malformed server messages (libpq's texts), 28000 for a wrong server signature, an "e="
// server-final-message or an iteration count above the cap.
class ScramClient {
 public:
  explicit ScramClient(std::string_view password, ScramClientOptions options = {});
  ScramClient(ScramClient&&) = default;
  ScramClient& operator=(ScramClient&&) = default;
  ScramClient(const ScramClient&) = delete;
  ScramClient& operator=(const ScramClient&) = delete;
  ~ScramClient();

  // The mechanism to name in SASLInitialResponse.
  std::string_view mechanism() const;
  // The client-first-message (SASLInitialResponse data).
  Result<std::string> client_first();
  // server-first-message -> client-final-message.
  Result<std::string> handle_server_first(std::string_view message);
  // Verifies the server-final-message (AuthenticationSASLFinal data).
  Status handle_server_final(std::string_view message);

  // True once the server proved knowledge of the secret.
  bool succeeded() const { return state_ == State::kFinished; }
  bool channel_bound() const {
    return succeeded() && options_.channel_binding == ScramChannelBinding::kPlus;
  }

 private:
  enum class State { kInit, kNonceSent, kProofSent, kFinished, kFailed };

  Error fail(Error error);
  Result<std::string> read_server_first(std::string_view message);
  Status read_server_final(std::string_view message);

  State state_ = State::kInit;
  std::string password_;  // SASLprep'd; wiped once the salted password is derived
  ScramClientOptions options_;
  std::string gs2_header_;
  std::string client_nonce_;
  std::string client_first_bare_;
  std::string server_first_;
  std::string client_final_without_proof_;
  ScramKey salted_password_{};
};

}  // namespace pgrelay::wire
