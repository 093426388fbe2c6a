// SASLprep (RFC 4013) of passwords, with exactly the rules of Postgres's src/common/saslprep.c.
#pragma once

#include <string>
#include <string_view>

#include "base/result.h"

namespace pgrelay::wire {

// SQLSTATEs of the two ways SASLprep can refuse a string (Postgres's pg_saslprep_rc).
inline constexpr const char* kSaslprepInvalidUtf8 = "22021";  // character_not_in_repertoire
inline constexpr const char* kSaslprepProhibited = "22023";   // invalid_parameter_value

// Prepares `input` as Postgres does:
//  - pure ASCII passes through unchanged (Postgres's fast path: even ASCII control characters,
//    which RFC 4013 would prohibit, and the empty string);
//  - otherwise the input must be valid UTF-8 (else kSaslprepInvalidUtf8);
//  - non-ASCII spaces (RFC 3454 C.1.2) map to U+0020, B.1 characters are deleted, an empty result
//    is refused, the rest is NFKC-normalized (ICU's current Unicode, as Postgres's own tables);
//  - prohibited output (C.1.2, C.2.1-C.9), code points unassigned in Unicode 3.2 (A.1) and
//    bidirectional violations (section 6, D.1/D.2) give kSaslprepProhibited. Like Postgres these
//    checks look at the mapped string before normalization.
Result<std::string> saslprep(std::string_view input);

// The password bytes SCRAM hashes: the SASLprep'd form, or the raw bytes when SASLprep refuses the
// password (not UTF-8 or prohibited characters), as Postgres's server and libpq both do.
std::string saslprep_password(std::string_view password);

// True for a well-formed UTF-8 string (no overlong forms, surrogates or code points above
// U+10FFFF): Postgres's pg_utf8_islegal applied to every character.
bool is_valid_utf8(std::string_view s);

}  // namespace pgrelay::wire
