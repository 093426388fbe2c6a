// SCRAM-SHA-256 secrets and exchanges with Postgres's message grammar, error texts and checks.
#include "wire/scram.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdio>
#include <utility>

#include "wire/saslprep.h"

namespace pgrelay::wire {
namespace {

constexpr std::string_view kBase64Alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr std::string_view kClientKeyName = "Client Key";
constexpr std::string_view kServerKeyName = "Server Key";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// --- Crypto primitives (false only if OpenSSL itself fails). ---

bool salted_password(std::string_view password, ByteView salt, int iterations, ScramKey& out) {
  // A non-null pointer even for empty inputs: OpenSSL treats null specially.
  static constexpr char kEmpty[1] = {0};
  static constexpr unsigned char kEmptySalt[1] = {0};
  return PKCS5_PBKDF2_HMAC(password.empty() ? kEmpty : password.data(),
                           static_cast<int>(password.size()),
                           salt.empty() ? kEmptySalt : salt.data(), static_cast<int>(salt.size()),
                           iterations, EVP_sha256(), static_cast<int>(out.size()), out.data()) == 1;
}

bool hmac_sha256(const ScramKey& key, std::string_view data, ScramKey& out) {
  unsigned int len = 0;
  return HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
              reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(),
              &len) != nullptr &&
         len == out.size();
}

bool sha256(ByteView data, ScramKey& out) {
  unsigned int len = 0;
  return EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr) == 1 &&
         len == out.size();
}

bool keys_equal(const ScramKey& a, const ScramKey& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void wipe(std::string& s) {
  if (!s.empty()) OPENSSL_cleanse(s.data(), s.size());
  s.clear();
}

Error internal(std::string message) {
  return Error::make(sqlstate::kInternalError, std::move(message));
}

Result<std::string> make_nonce(const NonceSource& source) {
  if (!source) {
    auto raw = random_bytes(kScramRawNonceLen);
    if (!raw.ok()) return internal("could not generate random nonce");
    return base64_encode(*raw);
  }
  std::string nonce = source();
  // The nonce goes verbatim into "r=" and must be SCRAM "printable" (RFC 5802).
  for (char c : nonce) {
    if (c < 0x21 || c > 0x7E || c == ',') return internal("could not generate random nonce");
  }
  if (nonce.empty()) return internal("could not generate random nonce");
  return nonce;
}

// Strict decimal int in [1, INT_MAX].
std::optional<int> parse_positive_int(std::string_view s) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || s[0] == '-' || s[0] == '+' || ec != std::errc() || ptr != s.data() + s.size() ||
      value < 1) {
    return std::nullopt;
  }
  return value;
}

// Walks a SCRAM message the way Postgres walks its NUL-terminated copy: peek() gives '\0' at the
// end, and callers have already refused messages with embedded NULs.
class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void advance() {
    if (pos_ < s_.size()) ++pos_;
  }
  bool at_end() const { return pos_ >= s_.size(); }
  std::size_t pos() const { return pos_; }
  std::string_view rest() const { return s_.substr(pos_); }
  // The value up to the next ',' (consumed) or the end.
  std::string_view take_value() {
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != ',') ++pos_;
    std::string_view value = s_.substr(start, pos_ - start);
    if (pos_ < s_.size()) ++pos_;
    return value;
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
};

// --- Server-side parsing helpers with Postgres's (auth-scram.c) error texts. ---

// A byte as Postgres's sanitize_char shows it: 'c' when printable, else 0xNN.
std::string sanitize_char(char c) {
  char buf[8];
  if (c >= 0x21 && c <= 0x7E) {
    std::snprintf(buf, sizeof buf, "'%c'", c);
  } else {
    std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned char>(c));
  }
  return buf;
}

// Postgres's sanitize_str: at most 30 characters, non-printable ones as '?'.
std::string sanitize_str(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 30)) out.push_back(c >= 0x21 && c <= 0x7E ? c : '?');
  return out;
}

Error malformed(std::string detail) {
  return Error::make(sqlstate::kProtocolViolation, "malformed SCRAM message", {},
                     std::move(detail));
}

Status check_message_shape(std::string_view message) {
  if (message.empty()) return malformed("The message is empty.");
  if (message.find('\0') != std::string_view::npos) {
    return malformed("Message length does not match input length.");
  }
  return {};
}

Result<std::string_view> server_read_attr(Cursor& in, char attr) {
  if (in.peek() != attr) {
    return malformed("Expected attribute \"" + std::string(1, attr) + "\" but found \"" +
                     sanitize_char(in.peek()) + "\".");
  }
  in.advance();
  if (in.peek() != '=') {
    return malformed("Expected character \"=\" for attribute \"" + std::string(1, attr) + "\".");
  }
  in.advance();
  return in.take_value();
}

struct Attribute {
  char name;
  std::string_view value;
};

// attr-val = ALPHA "=" value
Result<Attribute> server_read_any_attr(Cursor& in) {
  const char attr = in.peek();
  if (attr == '\0') return malformed("Attribute expected, but found end of string.");
  if (!((attr >= 'A' && attr <= 'Z') || (attr >= 'a' && attr <= 'z'))) {
    return malformed("Attribute expected, but found invalid character \"" + sanitize_char(attr) +
                     "\".");
  }
  in.advance();
  if (in.peek() != '=') {
    return malformed("Expected character \"=\" for attribute \"" + std::string(1, attr) + "\".");
  }
  in.advance();
  return Attribute{attr, in.take_value()};
}

bool is_scram_printable(std::string_view s) {
  for (char c : s) {
    if (c < 0x21 || c > 0x7E || c == ',') return false;
  }
  return true;
}

// --- Client-side parsing helpers with libpq's (fe-auth-scram.c) error texts. ---

Error client_malformed(std::string what) {
  return Error::protocol("malformed SCRAM message (" + std::move(what) + ")");
}

Result<std::string_view> client_read_attr(Cursor& in, char attr) {
  if (in.peek() != attr) {
    return client_malformed("attribute \"" + std::string(1, attr) + "\" expected");
  }
  in.advance();
  if (in.peek() != '=') {
    return client_malformed("expected character \"=\" for attribute \"" + std::string(1, attr) +
                            "\"");
  }
  in.advance();
  return in.take_value();
}

Error state_error() {
  return internal("invalid SCRAM exchange state");
}

}  // namespace

Error password_auth_failed(std::string_view user) {
  return Error::make(sqlstate::kInvalidPassword,
                     "password authentication failed for user \"" + std::string(user) + "\"");
}

Result<Bytes> random_bytes(std::size_t n, const RandomSource& source) {
  if (n > static_cast<std::size_t>(INT_MAX)) return internal("could not generate random bytes");
  Bytes out(n);
  bool ok = false;
  if (source) {
    ok = source(out);
  } else {
    ok = n == 0 || RAND_bytes(out.data(), static_cast<int>(n)) == 1;
  }
  if (!ok) return internal("could not generate random bytes");
  return out;
}

std::string base64_encode(ByteView data) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    const std::uint32_t v =
        (std::uint32_t{data[i]} << 16) | (std::uint32_t{data[i + 1]} << 8) | data[i + 2];
    out.push_back(kBase64Alphabet[(v >> 18) & 0x3F]);
    out.push_back(kBase64Alphabet[(v >> 12) & 0x3F]);
    out.push_back(kBase64Alphabet[(v >> 6) & 0x3F]);
    out.push_back(kBase64Alphabet[v & 0x3F]);
  }
  const std::size_t left = data.size() - i;
  if (left > 0) {
    std::uint32_t v = std::uint32_t{data[i]} << 16;
    if (left == 2) v |= std::uint32_t{data[i + 1]} << 8;
    out.push_back(kBase64Alphabet[(v >> 18) & 0x3F]);
    out.push_back(kBase64Alphabet[(v >> 12) & 0x3F]);
    out.push_back(left == 2 ? kBase64Alphabet[(v >> 6) & 0x3F] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<Bytes> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  Bytes out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int padding = 0;
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      int value = 0;
      if (c == '=') {
        // Padding only in the last two places of the last quantum, and nothing after it.
        if (!last || k < 2) return std::nullopt;
        ++padding;
      } else {
        if (padding > 0) return std::nullopt;
        value = base64_value(c);
        if (value < 0) return std::nullopt;
      }
      v = (v << 6) | static_cast<std::uint32_t>(value);
    }
    out.push_back(static_cast<std::uint8_t>(v >> 16));
    if (padding < 2) out.push_back(static_cast<std::uint8_t>(v >> 8));
    if (padding < 1) out.push_back(static_cast<std::uint8_t>(v));
  }
  return out;
}

std::vector<std::string_view> scram_mechanisms(bool channel_binding_available) {
  if (channel_binding_available) return {kScramSha256Plus, kScramSha256};
  return {kScramSha256};
}

// --- ScramVerifier ---

Result<ScramVerifier> ScramVerifier::parse(std::string_view secret) {
  auto invalid = [](std::string detail) {
    return Error::make(sqlstate::kInvalidParameterValue, "invalid SCRAM secret", {},
                       std::move(detail));
  };
  const std::size_t dollar1 = secret.find('$');
  if (dollar1 == std::string_view::npos || secret.substr(0, dollar1) != kScramSha256) {
    return invalid("The secret does not start with \"SCRAM-SHA-256$\".");
  }
  std::string_view rest = secret.substr(dollar1 + 1);
  const std::size_t colon1 = rest.find(':');
  const std::size_t dollar2 = rest.find('$');
  if (colon1 == std::string_view::npos || dollar2 == std::string_view::npos || dollar2 < colon1) {
    return invalid("Expected <iterations>:<salt>$<StoredKey>:<ServerKey>.");
  }
  const std::string_view iterations_text = rest.substr(0, colon1);
  const std::string_view salt_text = rest.substr(colon1 + 1, dollar2 - colon1 - 1);
  rest = rest.substr(dollar2 + 1);
  const std::size_t colon2 = rest.find(':');
  if (colon2 == std::string_view::npos) {
    return invalid("Expected <iterations>:<salt>$<StoredKey>:<ServerKey>.");
  }
  const std::string_view stored_text = rest.substr(0, colon2);
  const std::string_view server_text = rest.substr(colon2 + 1);

  ScramVerifier v;
  auto iterations = parse_positive_int(iterations_text);
  if (!iterations) return invalid("Invalid iteration count.");
  v.iterations = *iterations;
  auto salt = base64_decode(salt_text);
  if (!salt || salt->empty()) return invalid("Invalid salt.");
  v.salt = std::move(*salt);
  auto stored = base64_decode(stored_text);
  if (!stored || stored->size() != kScramKeyLen) return invalid("Invalid StoredKey.");
  std::copy(stored->begin(), stored->end(), v.stored_key.begin());
  auto server = base64_decode(server_text);
  if (!server || server->size() != kScramKeyLen) return invalid("Invalid ServerKey.");
  std::copy(server->begin(), server->end(), v.server_key.begin());
  return v;
}

Result<ScramVerifier> ScramVerifier::from_password(std::string_view password, int iterations,
                                                   const RandomSource& random) {
  auto salt = random_bytes(kScramSaltLen, random);
  if (!salt.ok()) return internal("could not generate random salt");
  return from_password(password, *salt, iterations);
}

Result<ScramVerifier> ScramVerifier::from_password(std::string_view password, ByteView salt,
                                                   int iterations) {
  if (iterations < 1) {
    return Error::make(sqlstate::kInvalidParameterValue, "SCRAM iteration count must be positive");
  }
  std::string prepared = saslprep_password(password);
  ScramVerifier v;
  v.iterations = iterations;
  v.salt.assign(salt.begin(), salt.end());
  ScramKey salted{};
  ScramKey client_key{};
  const bool ok = salted_password(prepared, salt, iterations, salted) &&
                  hmac_sha256(salted, kClientKeyName, client_key) &&
                  sha256(client_key, v.stored_key) &&
                  hmac_sha256(salted, kServerKeyName, v.server_key);
  wipe(prepared);
  OPENSSL_cleanse(salted.data(), salted.size());
  OPENSSL_cleanse(client_key.data(), client_key.size());
  if (!ok) return internal("could not compute SCRAM secret");
  return v;
}

std::string ScramVerifier::to_string() const {
  return std::string(kScramSha256) + "$" + std::to_string(iterations) + ":" + base64_encode(salt) +
         "$" + base64_encode(stored_key) + ":" + base64_encode(server_key);
}

bool ScramVerifier::verify_password(std::string_view password) const {
  if (iterations < 1) return false;
  std::string prepared = saslprep_password(password);
  ScramKey salted{};
  ScramKey computed{};
  const bool ok = salted_password(prepared, salt, iterations, salted) &&
                  hmac_sha256(salted, kServerKeyName, computed);
  wipe(prepared);
  OPENSSL_cleanse(salted.data(), salted.size());
  return ok && keys_equal(computed, server_key);
}

// --- ScramServer ---

ScramServer::~ScramServer() {
  OPENSSL_cleanse(stored_key_.data(), stored_key_.size());
  OPENSSL_cleanse(server_key_.data(), server_key_.size());
}

Result<ScramServer> ScramServer::make(std::string_view user, std::string_view mechanism,
                                      ScramServerOptions options) {
  ScramServer s;
  if (mechanism == kScramSha256Plus && !options.channel_binding_data.empty()) {
    s.use_channel_binding_ = true;
  } else if (mechanism != kScramSha256) {
    return Error::protocol("client selected an invalid SASL authentication mechanism");
  }
  s.user_ = std::string(user);
  s.channel_binding_data_ = std::move(options.channel_binding_data);
  s.nonce_ = std::move(options.nonce);
  return s;
}

Result<ScramServer> ScramServer::begin(std::string_view user, std::string_view mechanism,
                                       const ScramVerifier& verifier, ScramServerOptions options) {
  if (verifier.iterations < 1) return internal("invalid SCRAM secret");
  auto s = make(user, mechanism, std::move(options));
  if (!s.ok()) return s;
  s->iterations_ = verifier.iterations;
  s->salt_ = verifier.salt;
  s->stored_key_ = verifier.stored_key;
  s->server_key_ = verifier.server_key;
  return s;
}

Result<ScramServer> ScramServer::begin_mock(std::string_view user, std::string_view mechanism,
                                            ScramServerOptions options, std::string log_detail) {
  if (options.mock_secret.empty()) return internal("mock SCRAM authentication needs a secret");
  if (options.mock_iterations < 1) return internal("invalid SCRAM iteration count");
  Bytes seed(user.begin(), user.end());
  seed.insert(seed.end(), options.mock_secret.begin(), options.mock_secret.end());
  ScramKey digest{};
  if (!sha256(seed, digest)) return internal("could not encode salt");
  const int iterations = options.mock_iterations;
  auto s = make(user, mechanism, std::move(options));
  if (!s.ok()) return s;
  s->doomed_ = true;
  s->log_detail_ = std::move(log_detail);
  s->iterations_ = iterations;
  s->salt_.assign(digest.begin(), digest.begin() + kScramSaltLen);
  // StoredKey and ServerKey stay zero: a doomed exchange never succeeds.
  return s;
}

Result<ScramServer> ScramServer::begin_with_secret(std::string_view user,
                                                   std::string_view mechanism,
                                                   std::optional<std::string_view> shadow_pass,
                                                   ScramServerOptions options) {
  if (!shadow_pass) return begin_mock(user, mechanism, std::move(options));
  auto verifier = ScramVerifier::parse(*shadow_pass);
  if (verifier.ok()) return begin(user, mechanism, *verifier, std::move(options));
  return begin_mock(user, mechanism, std::move(options),
                    "User \"" + std::string(user) + "\" does not have a valid SCRAM secret.");
}

Error ScramServer::fail(Error error) {
  state_ = State::kFailed;
  return error;
}

Result<std::string> ScramServer::handle_client_first(std::string_view message) {
  if (state_ != State::kInit) return fail(state_error());
  if (auto st = read_client_first(message); !st.ok()) return fail(st.error());

  auto nonce = make_nonce(nonce_);
  if (!nonce.ok()) return fail(nonce.error());
  server_nonce_ = std::move(*nonce);
  server_first_ = "r=" + client_nonce_ + server_nonce_ + ",s=" + base64_encode(salt_) +
                  ",i=" + std::to_string(iterations_);
  state_ = State::kSaltSent;
  return server_first_;
}

Status ScramServer::read_client_first(std::string_view message) {
  PGRELAY_TRY(check_message_shape(message));
  Cursor in(message);

  // gs2-cbind-flag
  cbind_flag_ = in.peek();
  const char* const plus_without_data =
      "The client selected SCRAM-SHA-256-PLUS, but the SCRAM message does not include channel "
      "binding data.";
  switch (cbind_flag_) {
    case 'n':
    case 'y':
      if (use_channel_binding_) return malformed(plus_without_data);
      if (cbind_flag_ == 'y' && !channel_binding_data_.empty()) {
        return Error::make(sqlstate::kInvalidAuthorization,
                           "SCRAM channel binding negotiation error", {},
                           "The client supports SCRAM channel binding but thinks the server does "
                           "not.  However, this server does support channel binding.");
      }
      in.advance();
      if (in.peek() != ',') {
        return malformed("Comma expected, but found character \"" + sanitize_char(in.peek()) +
                         "\".");
      }
      in.advance();
      break;
    case 'p': {
      if (!use_channel_binding_) {
        return malformed(
            "The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message "
            "includes channel binding data.");
      }
      auto type = server_read_attr(in, 'p');
      if (!type.ok()) return type.error();
      if (*type != kTlsServerEndPoint) {
        return Error::protocol("unsupported SCRAM channel-binding type \"" + sanitize_str(*type) +
                               "\"");
      }
      break;
    }
    default:
      return malformed("Unexpected channel-binding flag \"" + sanitize_char(cbind_flag_) + "\".");
  }

  // authzid: not supported.
  if (in.peek() == 'a') {
    return Error::make(sqlstate::kFeatureNotSupported,
                       "client uses authorization identity, but it is not supported");
  }
  if (in.peek() != ',') {
    return malformed("Unexpected attribute \"" + sanitize_char(in.peek()) +
                     "\" in client-first-message.");
  }
  in.advance();
  client_first_bare_ = std::string(in.rest());

  if (in.peek() == 'm') {
    return Error::make(sqlstate::kFeatureNotSupported,
                       "client requires an unsupported SCRAM extension");
  }
  // The user name is parsed but ignored: the startup packet's name is the one authenticated.
  auto user = server_read_attr(in, 'n');
  if (!user.ok()) return user.error();
  auto nonce = server_read_attr(in, 'r');
  if (!nonce.ok()) return nonce.error();
  if (!is_scram_printable(*nonce)) {
    return Error::protocol("non-printable characters in SCRAM nonce");
  }
  client_nonce_ = std::string(*nonce);
  // Optional extensions: syntax-checked, then ignored.
  while (!in.at_end()) {
    auto attr = server_read_any_attr(in);
    if (!attr.ok()) return attr.error();
  }
  return {};
}

Result<std::string> ScramServer::handle_client_final(std::string_view message) {
  if (state_ != State::kSaltSent) return fail(state_error());
  if (auto st = read_client_final(message); !st.ok()) return fail(st.error());

  if (client_final_nonce_ != client_nonce_ + server_nonce_) {
    return fail(Error::make(sqlstate::kProtocolViolation, "invalid SCRAM response", {},
                            "Nonce does not match."));
  }
  // The proof is checked even when doomed, so a mock exchange costs the same time as a real one.
  if (!verify_client_proof() || doomed_) return fail(password_auth_failed(user_));

  const std::string auth_message =
      client_first_bare_ + "," + server_first_ + "," + client_final_without_proof_;
  ScramKey server_signature{};
  if (!hmac_sha256(server_key_, auth_message, server_signature)) {
    return fail(internal("could not calculate server signature"));
  }
  state_ = State::kFinished;
  return "v=" + base64_encode(server_signature);
}

Status ScramServer::read_client_final(std::string_view message) {
  PGRELAY_TRY(check_message_shape(message));
  Cursor in(message);

  auto binding = server_read_attr(in, 'c');
  if (!binding.ok()) return binding.error();
  if (use_channel_binding_) {
    std::string cbind_input = "p=" + std::string(kTlsServerEndPoint) + ",,";
    cbind_input.append(as_chars(channel_binding_data_));
    if (*binding != base64_encode(as_bytes(cbind_input))) {
      return Error::make(sqlstate::kInvalidAuthorization, "SCRAM channel binding check failed");
    }
  } else if (!(*binding == "biws" && cbind_flag_ == 'n') &&
             !(*binding == "eSws" && cbind_flag_ == 'y')) {
    // "biws" is base64("n,,"), "eSws" base64("y,,"): the flag must repeat the first message's.
    return Error::protocol("unexpected SCRAM channel-binding attribute in client-final-message");
  }

  auto nonce = server_read_attr(in, 'r');
  if (!nonce.ok()) return nonce.error();
  client_final_nonce_ = std::string(*nonce);

  // Skip extensions up to the proof; the message without proof ends before its ','.
  std::size_t proof_start = 0;
  std::string_view proof_text;
  for (;;) {
    proof_start = in.pos() - 1;  // r= was read, so pos() >= 1
    auto attr = server_read_any_attr(in);
    if (!attr.ok()) return attr.error();
    if (attr->name == 'p') {
      proof_text = attr->value;
      break;
    }
  }
  auto proof = base64_decode(proof_text);
  if (!proof || proof->size() != kScramKeyLen) {
    return malformed("Malformed proof in client-final-message.");
  }
  std::copy(proof->begin(), proof->end(), client_proof_.begin());
  if (!in.at_end()) return malformed("Garbage found at the end of client-final-message.");
  client_final_without_proof_ = std::string(message.substr(0, proof_start));
  return {};
}

bool ScramServer::verify_client_proof() const {
  const std::string auth_message =
      client_first_bare_ + "," + server_first_ + "," + client_final_without_proof_;
  ScramKey client_signature{};
  if (!hmac_sha256(stored_key_, auth_message, client_signature)) return false;
  ScramKey client_key{};
  for (std::size_t i = 0; i < kScramKeyLen; ++i) {
    client_key[i] = client_proof_[i] ^ client_signature[i];
  }
  ScramKey client_stored_key{};
  const bool ok = sha256(client_key, client_stored_key);
  OPENSSL_cleanse(client_key.data(), client_key.size());
  return ok && keys_equal(client_stored_key, stored_key_);
}

// --- ScramClient ---

ScramClient::ScramClient(std::string_view password, ScramClientOptions options)
    : password_(saslprep_password(password)), options_(std::move(options)) {}

ScramClient::~ScramClient() {
  wipe(password_);
  OPENSSL_cleanse(salted_password_.data(), salted_password_.size());
}

std::string_view ScramClient::mechanism() const {
  return options_.channel_binding == ScramChannelBinding::kPlus ? kScramSha256Plus : kScramSha256;
}

Error ScramClient::fail(Error error) {
  state_ = State::kFailed;
  wipe(password_);
  return error;
}

Result<std::string> ScramClient::client_first() {
  if (state_ != State::kInit) return fail(state_error());
  switch (options_.channel_binding) {
    case ScramChannelBinding::kNone:
      gs2_header_ = "n,,";
      break;
    case ScramChannelBinding::kServerNotOffering:
      gs2_header_ = "y,,";
      break;
    case ScramChannelBinding::kPlus:
      if (options_.channel_binding_data.empty()) {
        return fail(internal("channel binding data is required for SCRAM-SHA-256-PLUS"));
      }
      gs2_header_ = "p=" + std::string(kTlsServerEndPoint) + ",,";
      break;
  }
  auto nonce = make_nonce(options_.nonce);
  if (!nonce.ok()) return fail(internal("could not generate nonce"));
  client_nonce_ = std::move(*nonce);

  // saslname escaping (RFC 5802): ',' and '=' cannot appear raw.
  std::string user;
  for (char c : options_.user) {
    if (c == ',') {
      user += "=2C";
    } else if (c == '=') {
      user += "=3D";
    } else {
      user.push_back(c);
    }
  }
  client_first_bare_ = "n=" + user + ",r=" + client_nonce_;
  state_ = State::kNonceSent;
  return gs2_header_ + client_first_bare_;
}

Result<std::string> ScramClient::handle_server_first(std::string_view message) {
  if (state_ != State::kNonceSent) return fail(state_error());
  auto final_message = read_server_first(message);
  if (!final_message.ok()) return fail(final_message.error());
  state_ = State::kProofSent;
  return final_message;
}

Result<std::string> ScramClient::read_server_first(std::string_view message) {
  if (message.empty()) return Error::protocol("malformed SCRAM message (empty message)");
  if (message.find('\0') != std::string_view::npos) {
    return Error::protocol("malformed SCRAM message (length mismatch)");
  }
  server_first_ = std::string(message);
  Cursor in(message);

  auto nonce = client_read_attr(in, 'r');
  if (!nonce.ok()) return nonce.error();
  // The server must extend our nonce.
  if (nonce->size() < client_nonce_.size() ||
      CRYPTO_memcmp(nonce->data(), client_nonce_.data(), client_nonce_.size()) != 0) {
    return Error::protocol("invalid SCRAM response (nonce mismatch)");
  }
  const std::string combined_nonce(*nonce);

  auto salt_text = client_read_attr(in, 's');
  if (!salt_text.ok()) return salt_text.error();
  auto salt = base64_decode(*salt_text);
  if (!salt) return client_malformed("invalid salt");

  auto iterations_text = client_read_attr(in, 'i');
  if (!iterations_text.ok()) return iterations_text.error();
  auto iterations = parse_positive_int(*iterations_text);
  if (!iterations) return client_malformed("invalid iteration count");
  if (!in.at_end()) return client_malformed("garbage at end of server-first-message");
  // Before any PBKDF2 work: the count comes from a not yet authenticated server.
  if (*iterations > options_.max_iterations) {
    return Error::make(sqlstate::kInvalidAuthorization,
                       "SCRAM iteration count " + std::to_string(*iterations) +
                           " requested by the server exceeds the limit of " +
                           std::to_string(options_.max_iterations));
  }

  std::string cbind_input = gs2_header_;
  if (options_.channel_binding == ScramChannelBinding::kPlus) {
    cbind_input.append(as_chars(options_.channel_binding_data));
  }
  client_final_without_proof_ =
      "c=" + base64_encode(as_bytes(cbind_input)) + ",r=" + combined_nonce;

  const std::string auth_message =
      client_first_bare_ + "," + server_first_ + "," + client_final_without_proof_;
  ScramKey client_key{};
  ScramKey stored_key{};
  ScramKey client_signature{};
  const bool ok = salted_password(password_, *salt, *iterations, salted_password_) &&
                  hmac_sha256(salted_password_, kClientKeyName, client_key) &&
                  sha256(client_key, stored_key) &&
                  hmac_sha256(stored_key, auth_message, client_signature);
  wipe(password_);
  if (!ok) return internal("could not calculate client proof");
  ScramKey proof{};
  for (std::size_t i = 0; i < kScramKeyLen; ++i) proof[i] = client_key[i] ^ client_signature[i];
  OPENSSL_cleanse(client_key.data(), client_key.size());
  return client_final_without_proof_ + ",p=" + base64_encode(proof);
}

Status ScramClient::handle_server_final(std::string_view message) {
  if (state_ != State::kProofSent) return fail(state_error());
  if (auto st = read_server_final(message); !st.ok()) return fail(st.error());
  state_ = State::kFinished;
  return {};
}

Status ScramClient::read_server_final(std::string_view message) {
  if (message.empty()) return Error::protocol("malformed SCRAM message (empty message)");
  if (message.find('\0') != std::string_view::npos) {
    return Error::protocol("malformed SCRAM message (length mismatch)");
  }
  Cursor in(message);
  if (in.peek() == 'e') {
    auto error = client_read_attr(in, 'e');
    if (!error.ok()) return error.error();
    return Error::make(sqlstate::kInvalidAuthorization,
                       "error received from server in SCRAM exchange: " + sanitize_str(*error));
  }
  auto signature_text = client_read_attr(in, 'v');
  if (!signature_text.ok()) return signature_text.error();
  if (!in.at_end()) return client_malformed("garbage at end of server-final-message");
  auto signature = base64_decode(*signature_text);
  if (!signature || signature->size() != kScramKeyLen) {
    return client_malformed("invalid server signature");
  }

  const std::string auth_message =
      client_first_bare_ + "," + server_first_ + "," + client_final_without_proof_;
  ScramKey server_key{};
  ScramKey expected{};
  if (!hmac_sha256(salted_password_, kServerKeyName, server_key) ||
      !hmac_sha256(server_key, auth_message, expected)) {
    return internal("could not verify server signature");
  }
  if (CRYPTO_memcmp(expected.data(), signature->data(), kScramKeyLen) != 0) {
    return Error::make(sqlstate::kInvalidAuthorization, "incorrect server signature");
  }
  return {};
}

}  // namespace pgrelay::wire
