// Reads a .env file: the NAME=VALUE lines an app keeps beside its code for its tools.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "base/result.h"

namespace pgrelay::zero {

// The variables of a .env file, as the dotenv convention writes them:
//   NAME=value            the value trimmed; " #" starts a comment
//   export NAME=value     the same ("export " is ignored)
//   NAME='value'          taken as it is
//   NAME="a\nb"           \n, \r, \t, \" and \\ are escapes; may span lines
// Blank lines and lines starting with # are skipped. A later line wins over an earlier one.
// Anything else is 22023 naming `origin` and the line, with what is expected.
Result<std::map<std::string, std::string>> parse_dotenv(std::string_view text,
                                                        const std::string& origin);

// parse_dotenv of the file at `path`; a file that does not exist is empty.
Result<std::map<std::string, std::string>> read_dotenv(const std::string& path);

}  // namespace pgrelay::zero
