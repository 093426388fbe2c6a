// Backend (server to client) protocol v3 messages: one struct each, a builder and a body parser.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"
#include "wire/messages.h"

namespace pgrelay::wire {

// Builders write strings up to their first NUL and assume counts fit the protocol's int16 fields.
// Parsers take the body without tag and length and reject truncated bodies and trailing bytes.

// ---- Authentication ('R'): one struct per request code ----

struct AuthenticationOk {
  static constexpr char kTag = 'R';
  static constexpr std::int32_t kCode = 0;
  bool operator==(const AuthenticationOk&) const = default;
};

struct AuthenticationCleartextPassword {
  static constexpr char kTag = 'R';
  static constexpr std::int32_t kCode = 3;
  bool operator==(const AuthenticationCleartextPassword&) const = default;
};

struct AuthenticationMD5Password {
  static constexpr char kTag = 'R';
  static constexpr std::int32_t kCode = 5;
  std::array<std::uint8_t, 4> salt{};
  bool operator==(const AuthenticationMD5Password&) const = default;
};

struct AuthenticationSASL {
  static constexpr char kTag = 'R';
  static constexpr std::int32_t kCode = 10;
  std::vector<std::string> mechanisms;  // in the server's order of preference
  bool operator==(const AuthenticationSASL&) const = default;
};

struct AuthenticationSASLContinue {
  static constexpr char kTag = 'R';
  static constexpr std::int32_t kCode = 11;
  Bytes data;
  bool operator==(const AuthenticationSASLContinue&) const = default;
};

struct AuthenticationSASLFinal {
  static constexpr char kTag = 'R';
  static constexpr std::int32_t kCode = 12;
  Bytes data;
  bool operator==(const AuthenticationSASLFinal&) const = default;
};

using AuthenticationMessage =
    std::variant<AuthenticationOk, AuthenticationCleartextPassword, AuthenticationMD5Password,
                 AuthenticationSASL, AuthenticationSASLContinue, AuthenticationSASLFinal>;

// ---- Session state ----

struct ParameterStatus {
  static constexpr char kTag = 'S';
  std::string name;
  std::string value;
  bool operator==(const ParameterStatus&) const = default;
};

// The values a backend reported in ParameterStatus messages, each name once, in the order each
// was first reported (what a client is told at login).
using ReportedParameters = std::vector<std::pair<std::string, std::string>>;
// Records a report: a name reported again takes the new value where it was.
void record_parameter(ReportedParameters& parameters, ParameterStatus status);

struct BackendKeyData {
  static constexpr char kTag = 'K';
  std::int32_t pid = 0;
  std::int32_t secret_key = 0;
  bool operator==(const BackendKeyData&) const = default;
};

enum class TransactionStatus : char {
  kIdle = 'I',
  kInTransaction = 'T',
  kFailedTransaction = 'E',
};

struct ReadyForQuery {
  static constexpr char kTag = 'Z';
  TransactionStatus status = TransactionStatus::kIdle;
  bool operator==(const ReadyForQuery&) const = default;
};

// ---- Query results ----

struct FieldDescription {
  std::string name;
  Oid table_oid = 0;             // 0 if not a table column
  std::int16_t column_attr = 0;  // attribute number, 0 if not a table column
  Oid type_oid = 0;
  std::int16_t type_size = 0;  // negative = variable width
  std::int32_t type_modifier = -1;
  FormatCode format = kTextFormat;
  bool operator==(const FieldDescription&) const = default;
};

struct RowDescription {
  static constexpr char kTag = 'T';
  std::vector<FieldDescription> fields;
  bool operator==(const RowDescription&) const = default;
};

struct DataRow {
  static constexpr char kTag = 'D';
  std::vector<std::optional<Bytes>> values;  // nullopt = SQL NULL (length -1)
  bool operator==(const DataRow&) const = default;
};

struct CommandComplete {
  static constexpr char kTag = 'C';
  std::string command_tag;  // e.g. "INSERT 0 1"
  bool operator==(const CommandComplete&) const = default;
};

struct EmptyQueryResponse {
  static constexpr char kTag = 'I';
  bool operator==(const EmptyQueryResponse&) const = default;
};

// ---- Errors and notices ----

// Field codes of ErrorResponse/NoticeResponse (protocol "Error and Notice Message Fields").
namespace error_field {
inline constexpr char kSeverity = 'S';  // localized
inline constexpr char kSeverityNonLocalized = 'V';
inline constexpr char kSqlState = 'C';
inline constexpr char kMessage = 'M';
inline constexpr char kDetail = 'D';
inline constexpr char kHint = 'H';
inline constexpr char kPosition = 'P';
inline constexpr char kInternalPosition = 'p';
inline constexpr char kInternalQuery = 'q';
inline constexpr char kWhere = 'W';
inline constexpr char kSchemaName = 's';
inline constexpr char kTableName = 't';
inline constexpr char kColumnName = 'c';
inline constexpr char kDataTypeName = 'd';
inline constexpr char kConstraintName = 'n';
inline constexpr char kFile = 'F';
inline constexpr char kLine = 'L';
inline constexpr char kRoutine = 'R';
}  // namespace error_field

struct NoticeField {
  char code = 0;  // never 0 on the wire: 0 terminates the list
  std::string value;
  bool operator==(const NoticeField&) const = default;
};

// The body shared by ErrorResponse and NoticeResponse: fields in wire order, unknown codes kept.
struct NoticeFields {
  std::vector<NoticeField> fields;

  // The first field with this code.
  std::optional<std::string_view> find(char code) const;
  // The non-localized severity ('V') when present, else the localized one ('S'); "" if neither.
  std::string_view severity() const;
  std::string_view sqlstate() const;
  std::string_view message() const;
  // Sqlstate, message, detail and hint as an Error (sqlstate XX000 if the server sent none).
  Error to_error() const;
  bool operator==(const NoticeFields&) const = default;
};

struct ErrorResponse : NoticeFields {
  static constexpr char kTag = 'E';
  bool operator==(const ErrorResponse&) const = default;
};

struct NoticeResponse : NoticeFields {
  static constexpr char kTag = 'N';
  bool operator==(const NoticeResponse&) const = default;
};

enum class Severity { kError, kFatal, kPanic, kWarning, kNotice, kDebug, kInfo, kLog };
std::string_view severity_name(Severity severity);  // "ERROR", "FATAL", ...

// Fields in the order Postgres sends them: S, V, C, M, then D and H when not empty.
ErrorResponse make_error_response(const Error& error, Severity severity = Severity::kError);
NoticeResponse make_notice_response(const Error& notice, Severity severity = Severity::kNotice);

struct NotificationResponse {
  static constexpr char kTag = 'A';
  std::int32_t pid = 0;
  std::string channel;
  std::string payload;
  bool operator==(const NotificationResponse&) const = default;
};

// ---- COPY ----

struct CopyResponseFields {
  std::int8_t format = 0;  // overall: 0 text, 1 binary
  std::vector<FormatCode> column_formats;
  bool operator==(const CopyResponseFields&) const = default;
};

struct CopyInResponse : CopyResponseFields {
  static constexpr char kTag = 'G';
  bool operator==(const CopyInResponse&) const = default;
};

struct CopyOutResponse : CopyResponseFields {
  static constexpr char kTag = 'H';
  bool operator==(const CopyOutResponse&) const = default;
};

struct CopyBothResponse : CopyResponseFields {
  static constexpr char kTag = 'W';
  bool operator==(const CopyBothResponse&) const = default;
};

// ---- Extended query ----

struct ParseComplete {
  static constexpr char kTag = '1';
  bool operator==(const ParseComplete&) const = default;
};

struct BindComplete {
  static constexpr char kTag = '2';
  bool operator==(const BindComplete&) const = default;
};

struct CloseComplete {
  static constexpr char kTag = '3';
  bool operator==(const CloseComplete&) const = default;
};

struct NoData {
  static constexpr char kTag = 'n';
  bool operator==(const NoData&) const = default;
};

struct PortalSuspended {
  static constexpr char kTag = 's';
  bool operator==(const PortalSuspended&) const = default;
};

struct ParameterDescription {
  static constexpr char kTag = 't';
  std::vector<Oid> types;
  bool operator==(const ParameterDescription&) const = default;
};

struct NegotiateProtocolVersion {
  static constexpr char kTag = 'v';
  // Sent as the full version code, as Postgres does (PG_PROTOCOL_LATEST).
  ProtocolVersion newest;
  std::vector<std::string> unrecognized_options;
  bool operator==(const NegotiateProtocolVersion&) const = default;
};

struct FunctionCallResponse {
  static constexpr char kTag = 'V';
  std::optional<Bytes> result;  // nullopt = NULL (length -1)
  bool operator==(const FunctionCallResponse&) const = default;
};

// ---- Builders ----

Bytes encode(const AuthenticationOk& m);
Bytes encode(const AuthenticationCleartextPassword& m);
Bytes encode(const AuthenticationMD5Password& m);
Bytes encode(const AuthenticationSASL& m);
Bytes encode(const AuthenticationSASLContinue& m);
Bytes encode(const AuthenticationSASLFinal& m);
Bytes encode(const AuthenticationMessage& m);
Bytes encode(const ParameterStatus& m);
Bytes encode(const BackendKeyData& m);
Bytes encode(const ReadyForQuery& m);
Bytes encode(const RowDescription& m);
Bytes encode(const DataRow& m);
Bytes encode(const CommandComplete& m);
Bytes encode(const EmptyQueryResponse& m);
Bytes encode(const ErrorResponse& m);
Bytes encode(const NoticeResponse& m);
Bytes encode(const NotificationResponse& m);
Bytes encode(const CopyInResponse& m);
Bytes encode(const CopyOutResponse& m);
Bytes encode(const CopyBothResponse& m);
Bytes encode(const ParseComplete& m);
Bytes encode(const BindComplete& m);
Bytes encode(const CloseComplete& m);
Bytes encode(const NoData& m);
Bytes encode(const PortalSuspended& m);
Bytes encode(const ParameterDescription& m);
Bytes encode(const NegotiateProtocolVersion& m);
Bytes encode(const FunctionCallResponse& m);

// ---- Parsers (body without tag and length) ----

// Any supported request; other codes (GSS, SSPI, ...) give 0A000.
Result<AuthenticationMessage> parse_authentication(ByteView body);
// These also fail (08P01) when the body carries another request code.
Result<AuthenticationOk> parse_authentication_ok(ByteView body);
Result<AuthenticationCleartextPassword> parse_authentication_cleartext_password(ByteView body);
Result<AuthenticationMD5Password> parse_authentication_md5_password(ByteView body);
Result<AuthenticationSASL> parse_authentication_sasl(ByteView body);
Result<AuthenticationSASLContinue> parse_authentication_sasl_continue(ByteView body);
Result<AuthenticationSASLFinal> parse_authentication_sasl_final(ByteView body);
Result<ParameterStatus> parse_parameter_status(ByteView body);
Result<BackendKeyData> parse_backend_key_data(ByteView body);
Result<ReadyForQuery> parse_ready_for_query(ByteView body);  // only 'I', 'T', 'E'
Result<RowDescription> parse_row_description(ByteView body);
Result<DataRow> parse_data_row(ByteView body);
Result<CommandComplete> parse_command_complete(ByteView body);
Result<EmptyQueryResponse> parse_empty_query_response(ByteView body);
Result<ErrorResponse> parse_error_response(ByteView body);
Result<NoticeResponse> parse_notice_response(ByteView body);
Result<NotificationResponse> parse_notification_response(ByteView body);
Result<CopyInResponse> parse_copy_in_response(ByteView body);
Result<CopyOutResponse> parse_copy_out_response(ByteView body);
Result<CopyBothResponse> parse_copy_both_response(ByteView body);
Result<ParseComplete> parse_parse_complete(ByteView body);
Result<BindComplete> parse_bind_complete(ByteView body);
Result<CloseComplete> parse_close_complete(ByteView body);
Result<NoData> parse_no_data(ByteView body);
Result<PortalSuspended> parse_portal_suspended(ByteView body);
Result<ParameterDescription> parse_parameter_description(ByteView body);
Result<NegotiateProtocolVersion> parse_negotiate_protocol_version(ByteView body);
Result<FunctionCallResponse> parse_function_call_response(ByteView body);

// ---- Dispatch ----

using BackendMessage =
    std::variant<AuthenticationOk, AuthenticationCleartextPassword, AuthenticationMD5Password,
                 AuthenticationSASL, AuthenticationSASLContinue, AuthenticationSASLFinal,
                 ParameterStatus, BackendKeyData, ReadyForQuery, RowDescription, DataRow,
                 CommandComplete, EmptyQueryResponse, ErrorResponse, NoticeResponse,
                 NotificationResponse, CopyInResponse, CopyOutResponse, CopyBothResponse, CopyData,
                 CopyDone, ParseComplete, BindComplete, CloseComplete, NoData, PortalSuspended,
                 ParameterDescription, NegotiateProtocolVersion, FunctionCallResponse>;

// Dispatches on the tag of a regular-phase frame; an unknown tag gives 08P01.
Result<BackendMessage> parse_backend(char tag, ByteView body);
Bytes encode(const BackendMessage& m);
char tag_of(const BackendMessage& m);

}  // namespace pgrelay::wire
