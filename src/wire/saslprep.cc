// SASLprep of passwords following Postgres's pg_saslprep: libidn's RFC 3454 tables, ICU's NFKC.
#include "wire/saslprep.h"

#include <stringprep.h>
#include <unicode/unorm2.h>
#include <unicode/utf16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <vector>

namespace pgrelay::wire {
namespace {

// An inclusive range of code points.
struct Range {
  std::uint32_t first;
  std::uint32_t last;
};

// A set of code points made from libidn's RFC 3454 tables, sorted and merged once so that a
// look-up is a binary search (long hostile passwords must not cost tables x length).
class CodePointSet {
 public:
  CodePointSet(std::initializer_list<const Stringprep_table_element*> tables) {
    for (const Stringprep_table_element* table : tables) {
      // libidn terminates each table with an all-zero element; `end` is 0 for one code point.
      for (std::size_t i = 0; table[i].start != 0 || table[i].end != 0; ++i) {
        ranges_.push_back({table[i].start, std::max(table[i].start, table[i].end)});
      }
    }
    std::sort(ranges_.begin(), ranges_.end(),
              [](const Range& a, const Range& b) { return a.first < b.first; });
    std::vector<Range> merged;
    for (const Range& r : ranges_) {
      if (!merged.empty() && r.first <= merged.back().last + 1) {
        merged.back().last = std::max(merged.back().last, r.last);
      } else {
        merged.push_back(r);
      }
    }
    ranges_ = std::move(merged);
  }

  bool contains(std::uint32_t cp) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), cp,
                               [](std::uint32_t v, const Range& r) { return v < r.first; });
    return it != ranges_.begin() && cp <= std::prev(it)->last;
  }

 private:
  std::vector<Range> ranges_;
};

// The sets are immutable after their thread-safe first initialization.
const CodePointSet& non_ascii_spaces() {
  static const CodePointSet set{stringprep_rfc3454_C_1_2};
  return set;
}
const CodePointSet& mapped_to_nothing() {
  static const CodePointSet set{stringprep_rfc3454_B_1};
  return set;
}
// SASLprep's prohibited output (RFC 4013 section 2.3) plus A.1, which Postgres also refuses.
const CodePointSet& prohibited() {
  static const CodePointSet set{
      stringprep_rfc3454_C_1_2, stringprep_rfc3454_C_2_1, stringprep_rfc3454_C_2_2,
      stringprep_rfc3454_C_3,   stringprep_rfc3454_C_4,   stringprep_rfc3454_C_5,
      stringprep_rfc3454_C_6,   stringprep_rfc3454_C_7,   stringprep_rfc3454_C_8,
      stringprep_rfc3454_C_9,   stringprep_rfc3454_A_1};
  return set;
}
const CodePointSet& rand_al_cat() {
  static const CodePointSet set{stringprep_rfc3454_D_1};
  return set;
}
const CodePointSet& l_cat() {
  static const CodePointSet set{stringprep_rfc3454_D_2};
  return set;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (static_cast<unsigned char>(c) & 0x80) == 0; });
}

bool continuation(unsigned char c) {
  return c >= 0x80 && c <= 0xBF;
}

// Decodes strict UTF-8 into code points; nullopt for any ill-formed sequence.
std::optional<std::vector<std::uint32_t>> decode_utf8(std::string_view s) {
  std::vector<std::uint32_t> out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    std::size_t len = 1;
    if ((lead & 0xE0) == 0xC0) {
      len = 2;
    } else if ((lead & 0xF0) == 0xE0) {
      len = 3;
    } else if ((lead & 0xF8) == 0xF0) {
      len = 4;
    }
    if (lead >= 0x80 && (lead < 0xC2 || lead > 0xF4)) return std::nullopt;
    if (s.size() - i < len) return std::nullopt;
    auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
    for (std::size_t k = 1; k < len; ++k) {
      if (!continuation(at(k))) return std::nullopt;
    }
    // The second byte's range excludes overlong forms, surrogates and values above U+10FFFF.
    if (len >= 2) {
      const unsigned char second = at(1);
      if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second > 0x9F) ||
          (lead == 0xF0 && second < 0x90) || (lead == 0xF4 && second > 0x8F)) {
        return std::nullopt;
      }
    }
    std::uint32_t cp = 0;
    switch (len) {
      case 1:
        cp = lead;
        break;
      case 2:
        cp = ((lead & 0x1Fu) << 6) | (at(1) & 0x3Fu);
        break;
      case 3:
        cp = ((lead & 0x0Fu) << 12) | ((at(1) & 0x3Fu) << 6) | (at(2) & 0x3Fu);
        break;
      default:
        cp = ((lead & 0x07u) << 18) | ((at(1) & 0x3Fu) << 12) | ((at(2) & 0x3Fu) << 6) |
             (at(3) & 0x3Fu);
        break;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

Error prohibited_error() {
  return Error::make(kSaslprepProhibited, "string contains characters prohibited by SASLprep");
}

// NFKC with ICU: linear time (libidn's own NFKC is quadratic in the number of compositions, so
// a long password could cost seconds), and the current Unicode version, as Postgres's tables.
std::optional<std::vector<std::uint32_t>> nfkc(const std::vector<std::uint32_t>& in) {
  std::vector<UChar> utf16;
  utf16.reserve(in.size() * 2);
  for (std::uint32_t cp : in) {
    if (cp < 0x10000) {
      utf16.push_back(static_cast<UChar>(cp));
    } else {
      utf16.push_back(static_cast<UChar>(U16_LEAD(cp)));
      utf16.push_back(static_cast<UChar>(U16_TRAIL(cp)));
    }
  }
  if (utf16.size() > static_cast<std::size_t>(INT32_MAX / 4)) return std::nullopt;
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* normalizer = unorm2_getNFKCInstance(&status);
  if (U_FAILURE(status)) return std::nullopt;
  const auto length = static_cast<int32_t>(utf16.size());
  // Preflight for the exact size, then normalize.
  const int32_t needed = unorm2_normalize(normalizer, utf16.data(), length, nullptr, 0, &status);
  if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) return std::nullopt;
  std::vector<UChar> out(static_cast<std::size_t>(needed) + 1);
  status = U_ZERO_ERROR;
  const int32_t written = unorm2_normalize(normalizer, utf16.data(), length, out.data(),
                                           static_cast<int32_t>(out.size()), &status);
  if (U_FAILURE(status)) return std::nullopt;
  std::vector<std::uint32_t> result;
  result.reserve(static_cast<std::size_t>(written));
  for (int32_t i = 0; i < written;) {
    UChar32 c = 0;
    U16_NEXT(out.data(), i, written, c);
    result.push_back(static_cast<std::uint32_t>(c));
  }
  return result;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  return decode_utf8(s).has_value();
}

Result<std::string> saslprep(std::string_view input) {
  if (is_ascii(input)) return std::string(input);

  auto decoded = decode_utf8(input);
  if (!decoded) {
    return Error::make(kSaslprepInvalidUtf8, "string is not valid UTF-8");
  }

  // 1) Map. C.1.2 is tested first, so U+200B (in both C.1.2 and B.1) becomes a space, as in
  // Postgres.
  std::vector<std::uint32_t> mapped;
  mapped.reserve(decoded->size() + 1);
  for (std::uint32_t cp : *decoded) {
    if (non_ascii_spaces().contains(cp)) {
      mapped.push_back(0x20);
    } else if (!mapped_to_nothing().contains(cp)) {
      mapped.push_back(cp);
    }
  }
  if (mapped.empty()) return prohibited_error();  // Postgres refuses an empty password

  // 3) Prohibit and 4) bidi, on the mapped string (before normalizing) as Postgres does.
  bool has_rand_al = false;
  for (std::uint32_t cp : mapped) {
    if (prohibited().contains(cp)) return prohibited_error();
    if (rand_al_cat().contains(cp)) has_rand_al = true;
  }
  if (has_rand_al) {
    const bool any_l = std::any_of(mapped.begin(), mapped.end(),
                                   [](std::uint32_t cp) { return l_cat().contains(cp); });
    if (any_l || !rand_al_cat().contains(mapped.front()) ||
        !rand_al_cat().contains(mapped.back())) {
      return prohibited_error();
    }
  }

  // 2) Normalize (NFKC).
  auto normalized = nfkc(mapped);
  if (!normalized) {
    return Error::make(sqlstate::kInternalError, "SASLprep normalization failed");
  }
  std::string out;
  out.reserve(input.size());
  for (std::uint32_t cp : *normalized) append_utf8(out, cp);
  return out;
}

std::string saslprep_password(std::string_view password) {
  auto prepared = saslprep(password);
  if (prepared.ok()) return std::move(prepared).value();
  return std::string(password);
}

}  // namespace pgrelay::wire
