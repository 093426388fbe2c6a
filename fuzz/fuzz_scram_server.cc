// Fuzzes SCRAM-SHA-256: server and client exchanges, stored secrets, base64 and SASLprep.
//
// Input: a mode byte, a flags byte, then the mode's data:
//  0  server fed fuzzer-chosen client-first/client-final messages (u16 length of the first,
//     the rest is the second), against a fixed secret or a mock exchange, in or out of order;
//  1  a full client/server exchange with fuzzer-chosen password, user, nonce and channel binding,
//     optionally one message corrupted in flight: success exactly when everything matches;
//  2  client fed fuzzer-chosen server-first/server-final messages; the client's proof is checked
//     and the right server signature computed here, independently, with OpenSSL;
//  3  the data as a stored secret, base64 text and a password for SASLprep.
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/bytes.h"
#include "wire/saslprep.h"
#include "wire/scram.h"

namespace {

using namespace pgrelay;
using namespace pgrelay::wire;

void check(bool condition) {
  if (!condition) std::abort();
}

constexpr std::string_view kServerNonce = "SrvN0nce+/=8Q";
constexpr std::string_view kClientNonce = "cN0nce";
constexpr int kMaxIterations = 16;

Bytes bytes_of(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

const ScramVerifier& fixed_verifier() {
  static const ScramVerifier verifier = [] {
    auto v = ScramVerifier::from_password("pencil", bytes_of("fixed-salt-16byt"), 4);
    check(v.ok());
    return *v;
  }();
  return verifier;
}

Bytes channel_binding_data(bool other) {
  return bytes_of(other ? "another certificate hash........" : "certificate hash (sha-256) 32 b.");
}

bool is_state_error(const Error& e) {
  return e.sqlstate == sqlstate::kInternalError && e.message == "invalid SCRAM exchange state";
}

// Reads the input as length-prefixed fields; a missing field is empty.
class Fields {
 public:
  explicit Fields(std::string_view data) : data_(data) {}
  std::string_view u8_field() {
    if (data_.empty()) return {};
    const std::size_t n =
        std::min<std::size_t>(static_cast<std::uint8_t>(data_[0]), data_.size() - 1);
    return take(1, n);
  }
  std::string_view u16_field() {
    if (data_.size() < 2) return take(data_.size(), 0);
    const std::size_t n =
        std::min<std::size_t>((std::size_t{static_cast<std::uint8_t>(data_[0])} << 8) |
                                  static_cast<std::uint8_t>(data_[1]),
                              data_.size() - 2);
    return take(2, n);
  }
  std::uint8_t byte() {
    if (data_.empty()) return 0;
    const auto b = static_cast<std::uint8_t>(data_[0]);
    data_.remove_prefix(1);
    return b;
  }
  std::string_view rest() {
    std::string_view r = data_;
    data_ = {};
    return r;
  }

 private:
  std::string_view take(std::size_t header, std::size_t n) {
    std::string_view out = data_.substr(header, n);
    data_.remove_prefix(header + n);
    return out;
  }
  std::string_view data_;
};

// The message with its last attribute's value (p= or v=, base64, which holds no comma) re-encoded
// canonically, or nullopt if that attribute is not `name` or does not decode: two messages equal
// after this carry the same proof or signature. The attribute is found by its comma, not by
// searching for "v=": a signature whose base64 ends in 'v' before its '=' pad holds "v=" too.
std::optional<std::string> canonical_tail(std::string_view message, char name) {
  const std::size_t comma = message.rfind(',');
  const std::size_t at = comma == std::string_view::npos ? 0 : comma + 1;
  if (message.size() < at + 2 || message[at] != name || message[at + 1] != '=') return std::nullopt;
  auto decoded = base64_decode(message.substr(at + 2));
  if (!decoded) return std::nullopt;
  return std::string(message.substr(0, at + 2)) + base64_encode(*decoded);
}

ScramKey hmac(const ScramKey& key, std::string_view data) {
  ScramKey out{};
  unsigned int len = 0;
  check(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(),
             &len) != nullptr &&
        len == out.size());
  return out;
}

ScramKey sha256(ByteView data) {
  ScramKey out{};
  unsigned int len = 0;
  check(EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr) == 1);
  return out;
}

// ---- mode 0: the server against arbitrary client messages ----

void server_messages(std::uint8_t flags, Fields in) {
  const bool plus = (flags & 1) != 0;
  const bool have_binding = (flags & 2) != 0;
  const bool mock = (flags & 4) != 0;
  const bool out_of_order = (flags & 8) != 0;
  const std::string_view mechanism = plus ? kScramSha256Plus : kScramSha256;
  ScramServerOptions options;
  if (have_binding) options.channel_binding_data = channel_binding_data(false);
  options.nonce = [] { return std::string(kServerNonce); };
  options.mock_secret = bytes_of("mock secret");
  options.mock_iterations = 7;
  Result<ScramServer> begun =
      mock ? ScramServer::begin_mock("alice", mechanism, options)
           : ScramServer::begin("alice", mechanism, fixed_verifier(), options);
  if (plus && !have_binding) {
    check(!begun.ok() && begun.error().sqlstate == sqlstate::kProtocolViolation);
    return;
  }
  check(begun.ok());
  ScramServer& server = *begun;
  const std::string_view client_first = in.u16_field();
  const std::string_view client_final = in.rest();

  Result<std::string> server_first = server.handle_client_first(client_first);
  if (!server_first.ok()) {
    check(!server.succeeded());
    auto after = server.handle_client_final(client_final);
    check(!after.ok() && is_state_error(after.error()));
    return;
  }
  // r=<client nonce><server nonce>,s=<salt>,i=<iterations>
  const std::string& sf = *server_first;
  check(sf.rfind("r=", 0) == 0);
  const std::size_t nonce_end = sf.find(std::string(kServerNonce) + ",s=");
  check(nonce_end != std::string::npos);
  for (char c : std::string_view(sf).substr(2, nonce_end - 2)) {
    check(c > 0x20 && c < 0x7F && c != ',');
  }
  const std::string tail = ",i=" + std::to_string(mock ? 7 : fixed_verifier().iterations);
  check(sf.size() > tail.size() && sf.compare(sf.size() - tail.size(), tail.size(), tail) == 0);
  if (!mock) {
    check(sf.find(",s=" + base64_encode(fixed_verifier().salt) + tail) != std::string::npos);
  }

  if (out_of_order) {
    auto again = server.handle_client_first(client_first);
    check(!again.ok() && is_state_error(again.error()));
    auto after = server.handle_client_final(client_final);
    check(!after.ok() && is_state_error(after.error()));
    check(!server.succeeded());
    return;
  }
  Result<std::string> server_final = server.handle_client_final(client_final);
  check(server_final.ok() == server.succeeded());
  if (mock) check(!server_final.ok());
  if (server_final.ok()) {
    // Only reachable with the password: the proof cannot be forged.
    check(server_final->rfind("v=", 0) == 0);
    check(server.channel_bound() == plus);
  } else {
    const std::string& code = server_final.error().sqlstate;
    check(code == sqlstate::kProtocolViolation || code == sqlstate::kInvalidPassword ||
          code == sqlstate::kInvalidAuthorization || code == sqlstate::kFeatureNotSupported);
  }
  auto again = server.handle_client_final(client_final);
  check(!again.ok() && is_state_error(again.error()));
}

// ---- mode 1: a whole exchange ----

struct Mutation {
  int message = -1;  // 0 client-first, 1 server-first, 2 client-final, 3 server-final
  std::size_t position = 0;
  std::uint8_t xor_mask = 1;
};

// Changes one byte (never to the same value) when this is the chosen message.
std::string mutate(std::string message, int index, const Mutation& m) {
  if (m.message != index || message.empty()) return message;
  message[m.position % message.size()] ^= static_cast<char>(m.xor_mask | 1);
  return message;
}

bool valid_nonce(std::string_view nonce) {
  if (nonce.empty()) return false;
  for (char c : nonce) {
    if (c < 0x21 || c > 0x7E || c == ',') return false;
  }
  return true;
}

void full_exchange(std::uint8_t flags, Fields in) {
  const int binding_mode = flags & 3;
  const bool server_binding = (flags & 4) != 0;
  const bool other_binding = (flags & 8) != 0;
  const bool other_password = (flags & 16) != 0;
  const bool corrupt = (flags & 32) != 0;
  const bool mock = (flags & 64) != 0;
  const std::string password(in.u8_field());
  const std::string user(in.u8_field());
  const std::string nonce(in.u8_field());
  const int iterations = 1 + in.byte() % 4;
  Mutation mutation;
  if (corrupt) {
    mutation.message = in.byte() % 4;
    mutation.position = in.byte();
    mutation.xor_mask = in.byte();
  }
  const std::string server_password = other_password ? password + "\x01" : password;

  ScramClientOptions client_options;
  client_options.channel_binding = binding_mode == 1   ? ScramChannelBinding::kServerNotOffering
                                   : binding_mode == 2 ? ScramChannelBinding::kPlus
                                                       : ScramChannelBinding::kNone;
  client_options.channel_binding_data = channel_binding_data(false);
  client_options.user = user;
  client_options.max_iterations = kMaxIterations;
  client_options.nonce = [nonce] { return nonce; };
  ScramClient client(password, client_options);
  const bool plus = client_options.channel_binding == ScramChannelBinding::kPlus;
  check(client.mechanism() == (plus ? kScramSha256Plus : kScramSha256));

  Result<std::string> first = client.client_first();
  if (!valid_nonce(nonce)) {
    check(!first.ok() && !client.succeeded());
    return;
  }
  check(first.ok());
  std::string escaped;
  for (char c : user) escaped += c == ',' ? "=2C" : c == '=' ? "=3D" : std::string(1, c);
  const std::string gs2 = binding_mode == 1 ? "y,," : plus ? "p=tls-server-end-point,," : "n,,";
  check(*first == gs2 + "n=" + escaped + ",r=" + nonce);

  ScramServerOptions server_options;
  if (server_binding) server_options.channel_binding_data = channel_binding_data(other_binding);
  server_options.nonce = [] { return std::string(kServerNonce); };
  server_options.mock_secret = bytes_of("mock secret");
  server_options.mock_iterations = iterations;
  auto verifier = ScramVerifier::from_password(server_password, bytes_of("salt"), iterations);
  check(verifier.ok());
  check(verifier->verify_password(server_password));
  Result<ScramServer> begun =
      mock ? ScramServer::begin_with_secret("bob", client.mechanism(), std::nullopt, server_options)
           : ScramServer::begin_with_secret("bob", client.mechanism(), verifier->to_string(),
                                            server_options);
  if (plus && !server_binding) {
    check(!begun.ok() && begun.error().sqlstate == sqlstate::kProtocolViolation);
    return;
  }
  check(begun.ok());
  ScramServer& server = *begun;

  const std::string msg1 = mutate(*first, 0, mutation);
  Result<std::string> server_first = server.handle_client_first(msg1);
  const bool binding_refused = binding_mode == 1 && server_binding;
  // A NUL in the user name makes the message malformed.
  const bool clean_first = msg1 == *first && user.find('\0') == std::string::npos;
  if (clean_first && binding_refused) {
    check(!server_first.ok() && server_first.error().sqlstate == sqlstate::kInvalidAuthorization);
  }
  if (clean_first && !binding_refused) check(server_first.ok());
  if (!server_first.ok()) return;

  const std::string msg2 = mutate(*server_first, 1, mutation);
  Result<std::string> client_final = client.handle_server_first(msg2);
  if (clean_first && msg2 == *server_first) check(client_final.ok());
  if (!client_final.ok()) return;

  const std::string msg3 = mutate(*client_final, 2, mutation);
  Result<std::string> server_final = server.handle_client_final(msg3);
  const bool same_password = saslprep_password(password) == saslprep_password(server_password);
  const bool binding_ok = !plus || !other_binding;
  const bool untouched = mutation.message < 0 || mutation.message == 3;
  const bool expect_success = same_password && binding_ok && !mock;
  if (untouched) {
    check(server_final.ok() == expect_success);
    if (!server_final.ok() && !binding_ok) {
      check(server_final.error().message == "SCRAM channel binding check failed");
    } else if (!server_final.ok()) {
      check(server_final.error().sqlstate == sqlstate::kInvalidPassword);
    }
  } else if (server_final.ok()) {
    // Only a re-spelling of the proof's base64 (unused low bits) can still pass.
    check(mutation.message == 2 && expect_success);
    check(canonical_tail(msg3, 'p') == canonical_tail(*client_final, 'p'));
  }
  check(server.succeeded() == server_final.ok());
  if (!server_final.ok()) return;
  check(server.channel_bound() == plus);

  const std::string msg4 = mutate(*server_final, 3, mutation);
  Status done = client.handle_server_final(msg4);
  if (msg4 == *server_final) {
    check(done.ok());
  } else if (done.ok()) {
    check(canonical_tail(msg4, 'v') == canonical_tail(*server_final, 'v'));
  }
  check(client.succeeded() == done.ok());
  if (done.ok()) check(client.channel_bound() == plus);
}

// ---- mode 2: the client against arbitrary server messages ----

void client_messages(std::uint8_t flags, Fields in) {
  const int binding_mode = flags & 3;
  const int final_kind = (flags >> 2) & 3;  // 0, 1: fuzzed; 2: the right one; 3: an error
  const std::string password(in.u8_field());
  const std::string_view server_first = in.u16_field();
  const std::string_view fuzzed_final = in.rest();

  ScramClientOptions options;
  options.channel_binding = binding_mode == 1   ? ScramChannelBinding::kServerNotOffering
                            : binding_mode == 2 ? ScramChannelBinding::kPlus
                                                : ScramChannelBinding::kNone;
  options.channel_binding_data = channel_binding_data(false);
  options.max_iterations = kMaxIterations;
  options.nonce = [] { return std::string(kClientNonce); };
  ScramClient client(password, options);
  Result<std::string> first = client.client_first();
  check(first.ok());
  const std::string gs2 = binding_mode == 1   ? "y,,"
                          : binding_mode == 2 ? "p=tls-server-end-point,,"
                                              : "n,,";
  check(first->rfind(gs2, 0) == 0);
  const std::string client_first_bare = first->substr(gs2.size());

  Result<std::string> client_final = client.handle_server_first(server_first);
  if (!client_final.ok()) {
    check(!client.succeeded());
    Status after = client.handle_server_final(fuzzed_final);
    check(!after.ok() && is_state_error(after.error()));
    return;
  }
  // Accepted: exactly r=<our nonce + more>,s=<salt>,i=<count>.
  check(server_first.rfind("r=" + std::string(kClientNonce), 0) == 0);
  const std::size_t s_at = server_first.find(",s=");
  check(s_at != std::string_view::npos);
  const std::size_t i_at = server_first.find(",i=", s_at + 3);
  check(i_at != std::string_view::npos);
  const std::string_view combined_nonce = server_first.substr(2, s_at - 2);
  auto salt = base64_decode(server_first.substr(s_at + 3, i_at - s_at - 3));
  check(salt.has_value());
  const std::string iterations_text(server_first.substr(i_at + 3));
  const int iterations = std::atoi(iterations_text.c_str());
  check(iterations >= 1 && iterations <= kMaxIterations);

  std::string cbind_input = gs2;
  if (binding_mode == 2) cbind_input += std::string(as_chars(options.channel_binding_data));
  const std::string without_proof =
      "c=" + base64_encode(as_bytes(cbind_input)) + ",r=" + std::string(combined_nonce);
  check(client_final->rfind(without_proof + ",p=", 0) == 0);
  auto proof = base64_decode(std::string_view(*client_final).substr(without_proof.size() + 3));
  check(proof && proof->size() == kScramKeyLen);

  // The server's side of the computation, done here from the secret.
  auto verifier = ScramVerifier::from_password(password, *salt, iterations);
  check(verifier.ok());
  const std::string auth_message =
      client_first_bare + "," + std::string(server_first) + "," + without_proof;
  const ScramKey client_signature = hmac(verifier->stored_key, auth_message);
  ScramKey client_key{};
  for (std::size_t i = 0; i < kScramKeyLen; ++i) client_key[i] = (*proof)[i] ^ client_signature[i];
  check(sha256(client_key) == verifier->stored_key);
  const std::string right_final = "v=" + base64_encode(hmac(verifier->server_key, auth_message));

  const std::string server_final = final_kind == 2   ? right_final
                                   : final_kind == 3 ? "e=" + std::string(fuzzed_final)
                                                     : std::string(fuzzed_final);
  Status done = client.handle_server_final(server_final);
  check(client.succeeded() == done.ok());
  if (final_kind == 2) check(done.ok());
  if (final_kind == 3 && server_final.find('\0') == std::string::npos) {
    check(!done.ok() && done.error().sqlstate == sqlstate::kInvalidAuthorization);
  }
  if (done.ok()) {
    check(canonical_tail(server_final, 'v') == canonical_tail(right_final, 'v'));
    check(client.channel_bound() == (binding_mode == 2));
  }
}

// ---- mode 3: secrets, base64, SASLprep ----

void texts(std::string_view text) {
  auto verifier = ScramVerifier::parse(text);
  if (verifier.ok()) {
    check(verifier->iterations >= 1 && !verifier->salt.empty());
    auto again = ScramVerifier::parse(verifier->to_string());
    check(again.ok() && *again == *verifier);
    if (verifier->iterations <= kMaxIterations) (void)verifier->verify_password(text);
  } else {
    check(verifier.error().sqlstate == sqlstate::kInvalidParameterValue);
  }
  ScramServerOptions options;
  options.mock_secret = bytes_of("mock");
  options.nonce = [] { return std::string(kServerNonce); };
  auto server = ScramServer::begin_with_secret("carol", kScramSha256, text, options);
  check(server.ok());
  check(server->log_detail().empty() == verifier.ok());
  check(server->handle_client_first("n,,n=,r=abc").ok());

  auto decoded = base64_decode(text);
  if (decoded) {
    const std::string encoded = base64_encode(*decoded);
    check(encoded.size() == text.size());
    check(base64_decode(encoded) == decoded);
  }
  const std::string encoded = base64_encode(as_bytes(text));
  check(encoded.size() % 4 == 0);
  auto round = base64_decode(encoded);
  check(round && as_chars(*round) == text);

  const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; });
  auto prepared = saslprep(text);
  if (prepared.ok()) {
    check(saslprep_password(text) == *prepared);
    if (ascii) check(*prepared == text);
    check(is_valid_utf8(*prepared));
  } else {
    check(!ascii);
    check(prepared.error().sqlstate == kSaslprepInvalidUtf8 ||
          prepared.error().sqlstate == kSaslprepProhibited);
    check((prepared.error().sqlstate == kSaslprepInvalidUtf8) == !is_valid_utf8(text));
    check(saslprep_password(text) == text);
  }
  // A secret made from a password verifies that password.
  auto made = ScramVerifier::from_password(text, bytes_of("s"), 1);
  check(made.ok() && made->verify_password(text));
  check(ScramVerifier::parse(made->to_string()).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::uint8_t flags = data[1];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 4) {
    case 0:
      server_messages(flags, Fields(rest));
      break;
    case 1:
      full_exchange(flags, Fields(rest));
      break;
    case 2:
      client_messages(flags, Fields(rest));
      break;
    default:
      texts(rest);
      break;
  }
  return 0;
}
