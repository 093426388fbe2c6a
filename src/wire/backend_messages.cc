// Backend (server to client) protocol v3 messages: one struct each, a builder and a body parser.
#include "wire/backend_messages.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

namespace pgrelay::wire {
namespace {

using detail::check_complete;
using detail::count_fits;
using detail::expect_empty;
using detail::insufficient_data;
using detail::MessageWriter;
using detail::put_cstr;

Bytes encode_empty(char tag) {
  return std::move(MessageWriter(tag)).finish();
}

Bytes encode_auth(std::int32_t code, ByteView extra) {
  MessageWriter mw('R', 4 + extra.size());
  mw.body().i32(code);
  mw.body().raw(extra);
  return std::move(mw).finish();
}

Bytes encode_notice_fields(char tag, const NoticeFields& m) {
  std::size_t hint = 1;
  for (const auto& f : m.fields) hint += 2 + f.value.size();
  MessageWriter mw(tag, hint);
  for (const auto& f : m.fields) {
    if (f.code == 0) continue;  // 0 would end the list early
    mw.body().u8(static_cast<std::uint8_t>(f.code));
    put_cstr(mw.body(), f.value);
  }
  mw.body().u8(0);
  return std::move(mw).finish();
}

Bytes encode_copy_response(char tag, const CopyResponseFields& m) {
  MessageWriter mw(tag, 3 + 2 * m.column_formats.size());
  mw.body().i8(m.format);
  detail::put_formats(mw.body(), m.column_formats);
  return std::move(mw).finish();
}

Result<NoticeFields> parse_notice_fields(ByteView body, std::string_view what) {
  ByteReader r(body);
  NoticeFields m;
  for (;;) {
    const std::uint8_t code = r.u8();
    if (!r.ok()) return insufficient_data(what);
    if (code == 0) break;
    std::string value = r.cstr();
    if (!r.ok()) return insufficient_data(what);
    m.fields.push_back(NoticeField{static_cast<char>(code), std::move(value)});
  }
  PGRELAY_TRY(check_complete(r, what));
  return m;
}

Result<CopyResponseFields> parse_copy_response(ByteView body, std::string_view what) {
  ByteReader r(body);
  CopyResponseFields m;
  m.format = r.i8();
  if (!r.ok() || !detail::read_formats(r, m.column_formats)) return insufficient_data(what);
  PGRELAY_TRY(check_complete(r, what));
  if (m.format != 0 && m.format != 1) {
    return Error::protocol("invalid COPY format code " + std::to_string(m.format) + " in " +
                           std::string(what) + " message");
  }
  for (FormatCode f : m.column_formats) {
    if (f != 0 && f != 1) {
      return Error::protocol("invalid column format code " + std::to_string(f) + " in " +
                             std::string(what) + " message");
    }
  }
  return m;
}

template <typename T>
Result<T> parse_empty(ByteView body, std::string_view what) {
  PGRELAY_TRY(expect_empty(body, what));
  return T{};
}

std::int32_t auth_code(const AuthenticationMessage& m) {
  return std::visit([](const auto& x) { return std::decay_t<decltype(x)>::kCode; }, m);
}

template <typename T>
Result<T> parse_auth_as(ByteView body, std::string_view what) {
  auto any = parse_authentication(body);
  if (!any.ok()) return any.error();
  if (auto* m = std::get_if<T>(&*any)) return std::move(*m);
  return Error::protocol("expected " + std::string(what) + " (authentication request code " +
                         std::to_string(T::kCode) + "), got authentication request code " +
                         std::to_string(auth_code(*any)));
}

template <typename Derived>
Result<Derived> derive(Result<NoticeFields> r) {
  if (!r.ok()) return r.error();
  Derived d;
  d.fields = std::move(r->fields);
  return d;
}

template <typename Derived>
Result<Derived> derive(Result<CopyResponseFields> r) {
  if (!r.ok()) return r.error();
  Derived d;
  d.format = r->format;
  d.column_formats = std::move(r->column_formats);
  return d;
}

}  // namespace

// ---- NoticeFields ----

std::optional<std::string_view> NoticeFields::find(char code) const {
  for (const auto& f : fields) {
    if (f.code == code) return std::string_view(f.value);
  }
  return std::nullopt;
}

std::string_view NoticeFields::severity() const {
  if (auto v = find(error_field::kSeverityNonLocalized)) return *v;
  return find(error_field::kSeverity).value_or(std::string_view());
}

std::string_view NoticeFields::sqlstate() const {
  return find(error_field::kSqlState).value_or(std::string_view());
}

std::string_view NoticeFields::message() const {
  return find(error_field::kMessage).value_or(std::string_view());
}

Error NoticeFields::to_error() const {
  Error e;
  const std::string_view code = sqlstate();
  e.sqlstate = code.empty() ? std::string(sqlstate::kInternalError) : std::string(code);
  e.message = std::string(message());
  e.detail = std::string(find(error_field::kDetail).value_or(std::string_view()));
  e.hint = std::string(find(error_field::kHint).value_or(std::string_view()));
  return e;
}

std::string_view severity_name(Severity severity) {
  switch (severity) {
    case Severity::kError:
      return "ERROR";
    case Severity::kFatal:
      return "FATAL";
    case Severity::kPanic:
      return "PANIC";
    case Severity::kWarning:
      return "WARNING";
    case Severity::kNotice:
      return "NOTICE";
    case Severity::kDebug:
      return "DEBUG";
    case Severity::kInfo:
      return "INFO";
    case Severity::kLog:
      return "LOG";
  }
  return "ERROR";
}

namespace {

NoticeFields fields_from_error(const Error& error, Severity severity) {
  NoticeFields m;
  const std::string name(severity_name(severity));
  m.fields.push_back({error_field::kSeverity, name});
  m.fields.push_back({error_field::kSeverityNonLocalized, name});
  m.fields.push_back({error_field::kSqlState, error.sqlstate});
  m.fields.push_back({error_field::kMessage, error.message});
  if (!error.detail.empty()) m.fields.push_back({error_field::kDetail, error.detail});
  if (!error.hint.empty()) m.fields.push_back({error_field::kHint, error.hint});
  return m;
}

}  // namespace

ErrorResponse make_error_response(const Error& error, Severity severity) {
  ErrorResponse m;
  m.fields = fields_from_error(error, severity).fields;
  return m;
}

NoticeResponse make_notice_response(const Error& notice, Severity severity) {
  NoticeResponse m;
  m.fields = fields_from_error(notice, severity).fields;
  return m;
}

// ---- Builders ----

Bytes encode(const AuthenticationOk&) {
  return encode_auth(AuthenticationOk::kCode, {});
}

Bytes encode(const AuthenticationCleartextPassword&) {
  return encode_auth(AuthenticationCleartextPassword::kCode, {});
}

Bytes encode(const AuthenticationMD5Password& m) {
  return encode_auth(AuthenticationMD5Password::kCode, m.salt);
}

Bytes encode(const AuthenticationSASL& m) {
  ByteWriter w;
  for (const auto& mech : m.mechanisms) {
    if (!mech.empty()) put_cstr(w, mech);  // an empty name would read as the list's end
  }
  w.u8(0);
  return encode_auth(AuthenticationSASL::kCode, w.bytes());
}

Bytes encode(const AuthenticationSASLContinue& m) {
  return encode_auth(AuthenticationSASLContinue::kCode, m.data);
}

Bytes encode(const AuthenticationSASLFinal& m) {
  return encode_auth(AuthenticationSASLFinal::kCode, m.data);
}

Bytes encode(const AuthenticationMessage& m) {
  return std::visit([](const auto& x) { return encode(x); }, m);
}

Bytes encode(const ParameterStatus& m) {
  MessageWriter mw(ParameterStatus::kTag, m.name.size() + m.value.size() + 2);
  put_cstr(mw.body(), m.name);
  put_cstr(mw.body(), m.value);
  return std::move(mw).finish();
}

Bytes encode(const BackendKeyData& m) {
  MessageWriter mw(BackendKeyData::kTag, 8);
  mw.body().i32(m.pid);
  mw.body().i32(m.secret_key);
  return std::move(mw).finish();
}

Bytes encode(const ReadyForQuery& m) {
  MessageWriter mw(ReadyForQuery::kTag, 1);
  mw.body().u8(static_cast<std::uint8_t>(m.status));
  return std::move(mw).finish();
}

Bytes encode(const RowDescription& m) {
  std::size_t hint = 2;
  for (const auto& f : m.fields) hint += f.name.size() + 19;
  MessageWriter mw(RowDescription::kTag, hint);
  ByteWriter& w = mw.body();
  w.u16(static_cast<std::uint16_t>(m.fields.size()));
  for (const auto& f : m.fields) {
    put_cstr(w, f.name);
    w.u32(f.table_oid);
    w.i16(f.column_attr);
    w.u32(f.type_oid);
    w.i16(f.type_size);
    w.i32(f.type_modifier);
    w.i16(f.format);
  }
  return std::move(mw).finish();
}

Bytes encode(const DataRow& m) {
  MessageWriter mw(DataRow::kTag, 2 + detail::values_size(m.values));
  detail::put_values(mw.body(), m.values);
  return std::move(mw).finish();
}

Bytes encode(const CommandComplete& m) {
  MessageWriter mw(CommandComplete::kTag, m.command_tag.size() + 1);
  put_cstr(mw.body(), m.command_tag);
  return std::move(mw).finish();
}

Bytes encode(const EmptyQueryResponse&) {
  return encode_empty(EmptyQueryResponse::kTag);
}
Bytes encode(const ErrorResponse& m) {
  return encode_notice_fields(ErrorResponse::kTag, m);
}
Bytes encode(const NoticeResponse& m) {
  return encode_notice_fields(NoticeResponse::kTag, m);
}

Bytes encode(const NotificationResponse& m) {
  MessageWriter mw(NotificationResponse::kTag, 6 + m.channel.size() + m.payload.size());
  mw.body().i32(m.pid);
  put_cstr(mw.body(), m.channel);
  put_cstr(mw.body(), m.payload);
  return std::move(mw).finish();
}

Bytes encode(const CopyInResponse& m) {
  return encode_copy_response(CopyInResponse::kTag, m);
}
Bytes encode(const CopyOutResponse& m) {
  return encode_copy_response(CopyOutResponse::kTag, m);
}
Bytes encode(const CopyBothResponse& m) {
  return encode_copy_response(CopyBothResponse::kTag, m);
}
Bytes encode(const ParseComplete&) {
  return encode_empty(ParseComplete::kTag);
}
Bytes encode(const BindComplete&) {
  return encode_empty(BindComplete::kTag);
}
Bytes encode(const CloseComplete&) {
  return encode_empty(CloseComplete::kTag);
}
Bytes encode(const NoData&) {
  return encode_empty(NoData::kTag);
}
Bytes encode(const PortalSuspended&) {
  return encode_empty(PortalSuspended::kTag);
}

Bytes encode(const ParameterDescription& m) {
  MessageWriter mw(ParameterDescription::kTag, 2 + 4 * m.types.size());
  mw.body().u16(static_cast<std::uint16_t>(m.types.size()));
  for (Oid oid : m.types) mw.body().u32(oid);
  return std::move(mw).finish();
}

Bytes encode(const NegotiateProtocolVersion& m) {
  std::size_t hint = 8;
  for (const auto& o : m.unrecognized_options) hint += o.size() + 1;
  MessageWriter mw(NegotiateProtocolVersion::kTag, hint);
  mw.body().u32(m.newest.code());
  mw.body().i32(static_cast<std::int32_t>(m.unrecognized_options.size()));
  for (const auto& o : m.unrecognized_options) put_cstr(mw.body(), o);
  return std::move(mw).finish();
}

Bytes encode(const FunctionCallResponse& m) {
  MessageWriter mw(FunctionCallResponse::kTag, 4 + (m.result ? m.result->size() : 0));
  if (m.result) {
    mw.body().i32(static_cast<std::int32_t>(m.result->size()));
    mw.body().raw(*m.result);
  } else {
    mw.body().i32(-1);
  }
  return std::move(mw).finish();
}

// ---- Parsers ----

Result<AuthenticationMessage> parse_authentication(ByteView body) {
  ByteReader r(body);
  const std::int32_t code = r.i32();
  if (!r.ok()) return insufficient_data("Authentication");
  switch (code) {
    case AuthenticationOk::kCode:
      PGRELAY_TRY(check_complete(r, "AuthenticationOk"));
      return AuthenticationMessage(AuthenticationOk{});
    case AuthenticationCleartextPassword::kCode:
      PGRELAY_TRY(check_complete(r, "AuthenticationCleartextPassword"));
      return AuthenticationMessage(AuthenticationCleartextPassword{});
    case AuthenticationMD5Password::kCode: {
      AuthenticationMD5Password m;
      ByteView salt = r.bytes(4);
      PGRELAY_TRY(check_complete(r, "AuthenticationMD5Password"));
      std::copy(salt.begin(), salt.end(), m.salt.begin());
      return AuthenticationMessage(m);
    }
    case AuthenticationSASL::kCode: {
      AuthenticationSASL m;
      for (;;) {
        std::string mech = r.cstr();
        if (!r.ok()) return insufficient_data("AuthenticationSASL");
        if (mech.empty()) break;
        m.mechanisms.push_back(std::move(mech));
      }
      PGRELAY_TRY(check_complete(r, "AuthenticationSASL"));
      return AuthenticationMessage(std::move(m));
    }
    case AuthenticationSASLContinue::kCode: {
      ByteView data = r.rest();
      return AuthenticationMessage(AuthenticationSASLContinue{Bytes(data.begin(), data.end())});
    }
    case AuthenticationSASLFinal::kCode: {
      ByteView data = r.rest();
      return AuthenticationMessage(AuthenticationSASLFinal{Bytes(data.begin(), data.end())});
    }
    default:
      // Kerberos, SCM, GSSAPI and SSPI requests are valid protocol but not supported here.
      return Error::make(sqlstate::kFeatureNotSupported,
                         "authentication method " + std::to_string(code) + " not supported");
  }
}

Result<AuthenticationOk> parse_authentication_ok(ByteView body) {
  return parse_auth_as<AuthenticationOk>(body, "AuthenticationOk");
}
Result<AuthenticationCleartextPassword> parse_authentication_cleartext_password(ByteView body) {
  return parse_auth_as<AuthenticationCleartextPassword>(body, "AuthenticationCleartextPassword");
}
Result<AuthenticationMD5Password> parse_authentication_md5_password(ByteView body) {
  return parse_auth_as<AuthenticationMD5Password>(body, "AuthenticationMD5Password");
}
Result<AuthenticationSASL> parse_authentication_sasl(ByteView body) {
  return parse_auth_as<AuthenticationSASL>(body, "AuthenticationSASL");
}
Result<AuthenticationSASLContinue> parse_authentication_sasl_continue(ByteView body) {
  return parse_auth_as<AuthenticationSASLContinue>(body, "AuthenticationSASLContinue");
}
Result<AuthenticationSASLFinal> parse_authentication_sasl_final(ByteView body) {
  return parse_auth_as<AuthenticationSASLFinal>(body, "AuthenticationSASLFinal");
}

Result<ParameterStatus> parse_parameter_status(ByteView body) {
  ByteReader r(body);
  ParameterStatus m;
  m.name = r.cstr();
  m.value = r.cstr();
  PGRELAY_TRY(check_complete(r, "ParameterStatus"));
  return m;
}

void record_parameter(ReportedParameters& parameters, ParameterStatus status) {
  for (auto& [name, value] : parameters) {
    if (name == status.name) {
      value = std::move(status.value);
      return;
    }
  }
  parameters.emplace_back(std::move(status.name), std::move(status.value));
}

Result<BackendKeyData> parse_backend_key_data(ByteView body) {
  ByteReader r(body);
  BackendKeyData m;
  m.pid = r.i32();
  m.secret_key = r.i32();
  PGRELAY_TRY(check_complete(r, "BackendKeyData"));
  return m;
}

Result<ReadyForQuery> parse_ready_for_query(ByteView body) {
  ByteReader r(body);
  const std::uint8_t status = r.u8();
  PGRELAY_TRY(check_complete(r, "ReadyForQuery"));
  if (status != 'I' && status != 'T' && status != 'E') {
    return Error::protocol("invalid transaction status " + describe_tag(static_cast<char>(status)) +
                           " in ReadyForQuery message");
  }
  return ReadyForQuery{static_cast<TransactionStatus>(status)};
}

Result<RowDescription> parse_row_description(ByteView body) {
  // A field is at least an empty name (1 byte) plus 18 bytes of attributes.
  constexpr std::size_t kMinFieldSize = 19;
  ByteReader r(body);
  RowDescription m;
  const std::uint16_t n = r.u16();
  if (!r.ok() || !count_fits(r, n, kMinFieldSize)) return insufficient_data("RowDescription");
  m.fields.resize(n);
  for (auto& f : m.fields) {
    f.name = r.cstr();
    f.table_oid = r.u32();
    f.column_attr = r.i16();
    f.type_oid = r.u32();
    f.type_size = r.i16();
    f.type_modifier = r.i32();
    f.format = r.i16();
    if (!r.ok()) return insufficient_data("RowDescription");
  }
  PGRELAY_TRY(check_complete(r, "RowDescription"));
  return m;
}

Result<DataRow> parse_data_row(ByteView body) {
  ByteReader r(body);
  DataRow m;
  if (!detail::read_values(r, m.values)) return insufficient_data("DataRow");
  PGRELAY_TRY(check_complete(r, "DataRow"));
  return m;
}

Result<CommandComplete> parse_command_complete(ByteView body) {
  ByteReader r(body);
  CommandComplete m{r.cstr()};
  PGRELAY_TRY(check_complete(r, "CommandComplete"));
  return m;
}

Result<EmptyQueryResponse> parse_empty_query_response(ByteView body) {
  return parse_empty<EmptyQueryResponse>(body, "EmptyQueryResponse");
}

Result<ErrorResponse> parse_error_response(ByteView body) {
  return derive<ErrorResponse>(parse_notice_fields(body, "ErrorResponse"));
}

Result<NoticeResponse> parse_notice_response(ByteView body) {
  return derive<NoticeResponse>(parse_notice_fields(body, "NoticeResponse"));
}

Result<NotificationResponse> parse_notification_response(ByteView body) {
  ByteReader r(body);
  NotificationResponse m;
  m.pid = r.i32();
  m.channel = r.cstr();
  m.payload = r.cstr();
  PGRELAY_TRY(check_complete(r, "NotificationResponse"));
  return m;
}

Result<CopyInResponse> parse_copy_in_response(ByteView body) {
  return derive<CopyInResponse>(parse_copy_response(body, "CopyInResponse"));
}

Result<CopyOutResponse> parse_copy_out_response(ByteView body) {
  return derive<CopyOutResponse>(parse_copy_response(body, "CopyOutResponse"));
}

Result<CopyBothResponse> parse_copy_both_response(ByteView body) {
  return derive<CopyBothResponse>(parse_copy_response(body, "CopyBothResponse"));
}

Result<ParseComplete> parse_parse_complete(ByteView body) {
  return parse_empty<ParseComplete>(body, "ParseComplete");
}
Result<BindComplete> parse_bind_complete(ByteView body) {
  return parse_empty<BindComplete>(body, "BindComplete");
}
Result<CloseComplete> parse_close_complete(ByteView body) {
  return parse_empty<CloseComplete>(body, "CloseComplete");
}
Result<NoData> parse_no_data(ByteView body) {
  return parse_empty<NoData>(body, "NoData");
}
Result<PortalSuspended> parse_portal_suspended(ByteView body) {
  return parse_empty<PortalSuspended>(body, "PortalSuspended");
}

Result<ParameterDescription> parse_parameter_description(ByteView body) {
  ByteReader r(body);
  ParameterDescription m;
  const std::uint16_t n = r.u16();
  if (!r.ok() || !count_fits(r, n, 4)) return insufficient_data("ParameterDescription");
  m.types.reserve(n);
  for (std::uint16_t i = 0; i < n; ++i) m.types.push_back(r.u32());
  PGRELAY_TRY(check_complete(r, "ParameterDescription"));
  return m;
}

Result<NegotiateProtocolVersion> parse_negotiate_protocol_version(ByteView body) {
  ByteReader r(body);
  NegotiateProtocolVersion m;
  m.newest = ProtocolVersion::from_code(r.u32());
  const std::int32_t n = r.i32();
  // Each option name takes at least its terminator.
  if (!r.ok() || n < 0 || !count_fits(r, static_cast<std::size_t>(n), 1)) {
    return insufficient_data("NegotiateProtocolVersion");
  }
  m.unrecognized_options.reserve(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) {
    m.unrecognized_options.push_back(r.cstr());
    if (!r.ok()) return insufficient_data("NegotiateProtocolVersion");
  }
  PGRELAY_TRY(check_complete(r, "NegotiateProtocolVersion"));
  return m;
}

Result<FunctionCallResponse> parse_function_call_response(ByteView body) {
  ByteReader r(body);
  FunctionCallResponse m;
  if (!detail::read_value(r, m.result)) return insufficient_data("FunctionCallResponse");
  PGRELAY_TRY(check_complete(r, "FunctionCallResponse"));
  return m;
}

// ---- Dispatch ----

namespace {

template <typename T>
Result<BackendMessage> widen(Result<T> r) {
  if (!r.ok()) return r.error();
  return BackendMessage(std::move(r).value());
}

}  // namespace

Result<BackendMessage> parse_backend(char tag, ByteView body) {
  switch (tag) {
    case 'R': {
      auto auth = parse_authentication(body);
      if (!auth.ok()) return auth.error();
      return std::visit([](auto&& m) { return BackendMessage(std::move(m)); },
                        std::move(auth).value());
    }
    case ParameterStatus::kTag:
      return widen(parse_parameter_status(body));
    case BackendKeyData::kTag:
      return widen(parse_backend_key_data(body));
    case ReadyForQuery::kTag:
      return widen(parse_ready_for_query(body));
    case RowDescription::kTag:
      return widen(parse_row_description(body));
    case DataRow::kTag:
      return widen(parse_data_row(body));
    case CommandComplete::kTag:
      return widen(parse_command_complete(body));
    case EmptyQueryResponse::kTag:
      return widen(parse_empty_query_response(body));
    case ErrorResponse::kTag:
      return widen(parse_error_response(body));
    case NoticeResponse::kTag:
      return widen(parse_notice_response(body));
    case NotificationResponse::kTag:
      return widen(parse_notification_response(body));
    case CopyInResponse::kTag:
      return widen(parse_copy_in_response(body));
    case CopyOutResponse::kTag:
      return widen(parse_copy_out_response(body));
    case CopyBothResponse::kTag:
      return widen(parse_copy_both_response(body));
    case CopyData::kTag:
      return widen(parse_copy_data(body));
    case CopyDone::kTag:
      return widen(parse_copy_done(body));
    case ParseComplete::kTag:
      return widen(parse_parse_complete(body));
    case BindComplete::kTag:
      return widen(parse_bind_complete(body));
    case CloseComplete::kTag:
      return widen(parse_close_complete(body));
    case NoData::kTag:
      return widen(parse_no_data(body));
    case PortalSuspended::kTag:
      return widen(parse_portal_suspended(body));
    case ParameterDescription::kTag:
      return widen(parse_parameter_description(body));
    case NegotiateProtocolVersion::kTag:
      return widen(parse_negotiate_protocol_version(body));
    case FunctionCallResponse::kTag:
      return widen(parse_function_call_response(body));
    default:
      return Error::protocol("invalid backend message type " +
                             std::to_string(static_cast<unsigned char>(tag)));
  }
}

Bytes encode(const BackendMessage& m) {
  return std::visit([](const auto& x) { return encode(x); }, m);
}

char tag_of(const BackendMessage& m) {
  return std::visit([](const auto& x) { return std::decay_t<decltype(x)>::kTag; }, m);
}

}  // namespace pgrelay::wire
