// Frontend (client to server) protocol v3 messages: one struct each, a builder and a body parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"
#include "wire/messages.h"

namespace pgrelay::wire {

// Builders write strings up to their first NUL (a string field cannot hold one) and assume counts
// fit the protocol's int16 fields. Parsers take the body without tag and length and reject
// truncated bodies and trailing bytes with 08P01.

struct Query {
  static constexpr char kTag = 'Q';
  std::string sql;
  bool operator==(const Query&) const = default;
};

struct Parse {
  static constexpr char kTag = 'P';
  std::string statement;  // empty = unnamed
  std::string sql;
  std::vector<Oid> param_types;  // 0 = unspecified
  bool operator==(const Parse&) const = default;
};

struct Bind {
  static constexpr char kTag = 'B';
  std::string portal;
  std::string statement;
  // Empty = all text, one = applies to all, else one per parameter.
  std::vector<FormatCode> param_formats;
  std::vector<std::optional<Bytes>> params;  // nullopt = SQL NULL (length -1)
  std::vector<FormatCode> result_formats;
  bool operator==(const Bind&) const = default;
};

// What Describe and Close name.
enum class ObjectKind : char { kStatement = 'S', kPortal = 'P' };

struct Describe {
  static constexpr char kTag = 'D';
  ObjectKind kind = ObjectKind::kStatement;
  std::string name;
  bool operator==(const Describe&) const = default;
};

struct Execute {
  static constexpr char kTag = 'E';
  std::string portal;
  std::int32_t max_rows = 0;  // 0 = no limit
  bool operator==(const Execute&) const = default;
};

struct Sync {
  static constexpr char kTag = 'S';
  bool operator==(const Sync&) const = default;
};

struct Flush {
  static constexpr char kTag = 'H';
  bool operator==(const Flush&) const = default;
};

struct Close {
  static constexpr char kTag = 'C';
  ObjectKind kind = ObjectKind::kStatement;
  std::string name;
  bool operator==(const Close&) const = default;
};

struct Terminate {
  static constexpr char kTag = 'X';
  bool operator==(const Terminate&) const = default;
};

struct CopyFail {
  static constexpr char kTag = 'f';
  std::string message;
  bool operator==(const CopyFail&) const = default;
};

struct FunctionCall {
  static constexpr char kTag = 'F';
  Oid function = 0;
  std::vector<FormatCode> arg_formats;
  std::vector<std::optional<Bytes>> args;
  FormatCode result_format = kTextFormat;
  bool operator==(const FunctionCall&) const = default;
};

// The three 'p' messages: which one it is depends on the authentication exchange in progress.
struct PasswordMessage {
  static constexpr char kTag = 'p';
  std::string password;  // cleartext, or "md5" + hex digest
  bool operator==(const PasswordMessage&) const = default;
};

struct SASLInitialResponse {
  static constexpr char kTag = 'p';
  std::string mechanism;
  std::optional<Bytes> data;  // nullopt = no initial response (length -1)
  bool operator==(const SASLInitialResponse&) const = default;
};

struct SASLResponse {
  static constexpr char kTag = 'p';
  Bytes data;
  bool operator==(const SASLResponse&) const = default;
};

// A 'p' message as the dispatcher returns it: the body, to be parsed by whoever knows the context.
struct PasswordPacket {
  static constexpr char kTag = 'p';
  Bytes body;
  bool operator==(const PasswordPacket&) const = default;
};

Bytes encode(const Query& m);
Bytes encode(const Parse& m);
Bytes encode(const Bind& m);
Bytes encode(const Describe& m);
Bytes encode(const Execute& m);
Bytes encode(const Sync& m);
Bytes encode(const Flush& m);
Bytes encode(const Close& m);
Bytes encode(const Terminate& m);
Bytes encode(const CopyFail& m);
Bytes encode(const FunctionCall& m);
Bytes encode(const PasswordMessage& m);
Bytes encode(const SASLInitialResponse& m);
Bytes encode(const SASLResponse& m);
Bytes encode(const PasswordPacket& m);

Result<Query> parse_query(ByteView body);
Result<Parse> parse_parse(ByteView body);
// Also rejects a format count other than 0, 1 or the parameter count, as Postgres does.
Result<Bind> parse_bind(ByteView body);
Result<Describe> parse_describe(ByteView body);
Result<Execute> parse_execute(ByteView body);
Result<Sync> parse_sync(ByteView body);
Result<Flush> parse_flush(ByteView body);
Result<Close> parse_close(ByteView body);
Result<Terminate> parse_terminate(ByteView body);
Result<CopyFail> parse_copy_fail(ByteView body);
Result<FunctionCall> parse_function_call(ByteView body);
Result<PasswordMessage> parse_password_message(ByteView body);
Result<SASLInitialResponse> parse_sasl_initial_response(ByteView body);
Result<SASLResponse> parse_sasl_response(ByteView body);

using FrontendMessage =
    std::variant<Query, Parse, Bind, Describe, Execute, Sync, Flush, Close, Terminate, CopyData,
                 CopyDone, CopyFail, FunctionCall, PasswordPacket>;

// Dispatches on the tag of a regular-phase frame; an unknown tag gives 08P01
// "invalid frontend message type N" as Postgres says.
Result<FrontendMessage> parse_frontend(char tag, ByteView body);
Bytes encode(const FrontendMessage& m);
char tag_of(const FrontendMessage& m);

}  // namespace pgrelay::wire
