// MD5 password hashing and verification with Postgres's stored forms and log details.
#include "wire/md5_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "base/bytes.h"
#include "wire/scram.h"

namespace pgrelay::wire {
namespace {

constexpr std::string_view kMd5Prefix = "md5";

// "md5" + lowercase hex of md5(a || b): Postgres's pg_md5_encrypt.
std::string md5_encrypt(std::string_view a, ByteView b) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const bool ok = ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_md5(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx, a.data(), a.size()) == 1 &&
                  EVP_DigestUpdate(ctx, b.data(), b.size()) == 1 &&
                  EVP_DigestFinal_ex(ctx, digest, &len) == 1 && len == 16;
  EVP_MD_CTX_free(ctx);
  if (!ok) return {};  // never equal to a 35-character hash, so checks fail closed
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(kMd5Prefix);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0x0F]);
  }
  return out;
}

bool is_md5_hash(std::string_view s) {
  if (s.size() != kMd5PasswordLen || s.substr(0, kMd5Prefix.size()) != kMd5Prefix) return false;
  for (char c : s.substr(kMd5Prefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Error failed(std::string_view user, std::string detail, std::string* log_detail) {
  if (log_detail != nullptr) *log_detail = std::move(detail);
  return password_auth_failed(user);
}

std::string quoted(std::string_view user) {
  return "\"" + std::string(user) + "\"";
}

}  // namespace

StoredPasswordType stored_password_type(std::string_view shadow_pass) {
  if (is_md5_hash(shadow_pass)) return StoredPasswordType::kMd5;
  if (ScramVerifier::parse(shadow_pass).ok()) return StoredPasswordType::kScramVerifier;
  return StoredPasswordType::kPlaintext;
}

std::string md5_password_hash(std::string_view user, std::string_view password) {
  return md5_encrypt(password, as_bytes(user));
}

std::string md5_client_response(std::string_view user, std::string_view password, Md5Salt salt) {
  const std::string hash = md5_password_hash(user, password);
  return md5_encrypt(std::string_view(hash).substr(kMd5Prefix.size()), salt);
}

Result<std::string> md5_client_response_from_hash(std::string_view md5_hash, Md5Salt salt) {
  if (!is_md5_hash(md5_hash)) {
    return Error::make(sqlstate::kInvalidParameterValue, "not an MD5 password hash");
  }
  return md5_encrypt(md5_hash.substr(kMd5Prefix.size()), salt);
}

Status md5_verify_response(std::string_view user, std::string_view shadow_pass,
                           std::string_view client_response, Md5Salt salt,
                           std::string* log_detail) {
  if (!is_md5_hash(shadow_pass)) {
    return failed(
        user,
        "User " + quoted(user) + " has a password that cannot be used with MD5 authentication.",
        log_detail);
  }
  const std::string expected = md5_encrypt(shadow_pass.substr(kMd5Prefix.size()), salt);
  if (!constant_time_equal(client_response, expected)) {
    return failed(user, "Password does not match for user " + quoted(user) + ".", log_detail);
  }
  return {};
}

Status plain_password_verify(std::string_view user, std::string_view shadow_pass,
                             std::string_view client_password, std::string* log_detail) {
  if (is_md5_hash(shadow_pass)) {
    if (constant_time_equal(md5_password_hash(user, client_password), shadow_pass)) return {};
    return failed(user, "Password does not match for user " + quoted(user) + ".", log_detail);
  }
  if (auto verifier = ScramVerifier::parse(shadow_pass); verifier.ok()) {
    if (verifier->verify_password(client_password)) return {};
    return failed(user, "Password does not match for user " + quoted(user) + ".", log_detail);
  }
  return failed(user, "Password of user " + quoted(user) + " is in unrecognized format.",
                log_detail);
}

}  // namespace pgrelay::wire
