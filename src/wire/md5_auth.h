// MD5 password hashes and challenge responses, and cleartext/MD5 checks against stored secrets.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace pgrelay::wire {

// "md5" followed by 32 lowercase hex digits (Postgres's MD5_PASSWD_LEN).
inline constexpr std::size_t kMd5PasswordLen = 35;

// The 4 random bytes of AuthenticationMD5Password.
using Md5Salt = std::array<std::uint8_t, 4>;

// What kind of secret pg_authid.rolpassword holds (Postgres's get_password_type).
enum class StoredPasswordType { kPlaintext, kMd5, kScramVerifier };
StoredPasswordType stored_password_type(std::string_view shadow_pass);

// Postgres's stored MD5 form: "md5" + hex(md5(password || user)).
std::string md5_password_hash(std::string_view user, std::string_view password);

// The PasswordMessage answering an MD5 challenge, as libpq computes it from the cleartext
// password: "md5" + hex(md5(hex(md5(password || user)) || salt)).
std::string md5_client_response(std::string_view user, std::string_view password, Md5Salt salt);
// The same from an already stored "md5..." hash (for a proxy holding only hashes); 22023 when
// `md5_hash` is not in the stored MD5 form.
Result<std::string> md5_client_response_from_hash(std::string_view md5_hash, Md5Salt salt);

// Server-side checks (Postgres's md5_crypt_verify and plain_crypt_verify). Both compare in
// constant time and fail with 28P01 "password authentication failed for user ..."; the reason,
// which must not reach the client, goes to `*log_detail` when given (errdetail_log).
//
// MD5 response against `shadow_pass`: only an MD5 hash can answer (a SCRAM secret cannot; Postgres
// then runs SCRAM instead of MD5 before ever getting here).
Status md5_verify_response(std::string_view user, std::string_view shadow_pass,
                           std::string_view client_response, Md5Salt salt,
                           std::string* log_detail = nullptr);
// Cleartext password (`password` authentication) against an MD5 hash or a SCRAM secret.
Status plain_password_verify(std::string_view user, std::string_view shadow_pass,
                             std::string_view client_password, std::string* log_detail = nullptr);

}  // namespace pgrelay::wire
