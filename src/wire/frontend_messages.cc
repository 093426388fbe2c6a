// Frontend (client to server) protocol v3 messages: one struct each, a builder and a body parser.
#include "wire/frontend_messages.h"

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
using detail::put_formats;
using detail::put_values;
using detail::read_formats;
using detail::read_values;
using detail::values_size;

Result<ObjectKind> read_object_kind(ByteReader& r, const char* message_upper,
                                    std::string_view what) {
  const std::uint8_t kind = r.u8();
  if (!r.ok()) return insufficient_data(what);
  if (kind != 'S' && kind != 'P') {
    return Error::protocol(std::string("invalid ") + message_upper + " message subtype " +
                           std::to_string(kind));
  }
  return static_cast<ObjectKind>(kind);
}

Bytes encode_empty(char tag) {
  return std::move(MessageWriter(tag)).finish();
}

Bytes encode_kind_and_name(char tag, ObjectKind kind, const std::string& name) {
  MessageWriter mw(tag, 2 + name.size());
  mw.body().u8(static_cast<std::uint8_t>(kind));
  put_cstr(mw.body(), name);
  return std::move(mw).finish();
}

}  // namespace

Bytes encode(const Query& m) {
  MessageWriter mw(Query::kTag, m.sql.size() + 1);
  put_cstr(mw.body(), m.sql);
  return std::move(mw).finish();
}

Bytes encode(const Parse& m) {
  MessageWriter mw(Parse::kTag, m.statement.size() + m.sql.size() + 4 + 4 * m.param_types.size());
  ByteWriter& w = mw.body();
  put_cstr(w, m.statement);
  put_cstr(w, m.sql);
  w.u16(static_cast<std::uint16_t>(m.param_types.size()));
  for (Oid oid : m.param_types) w.u32(oid);
  return std::move(mw).finish();
}

Bytes encode(const Bind& m) {
  MessageWriter mw(Bind::kTag, m.portal.size() + m.statement.size() + 8 +
                                   2 * (m.param_formats.size() + m.result_formats.size()) +
                                   values_size(m.params));
  ByteWriter& w = mw.body();
  put_cstr(w, m.portal);
  put_cstr(w, m.statement);
  put_formats(w, m.param_formats);
  put_values(w, m.params);
  put_formats(w, m.result_formats);
  return std::move(mw).finish();
}

Bytes encode(const Describe& m) {
  return encode_kind_and_name(Describe::kTag, m.kind, m.name);
}

Bytes encode(const Execute& m) {
  MessageWriter mw(Execute::kTag, m.portal.size() + 5);
  put_cstr(mw.body(), m.portal);
  mw.body().i32(m.max_rows);
  return std::move(mw).finish();
}

Bytes encode(const Sync&) {
  return encode_empty(Sync::kTag);
}
Bytes encode(const Flush&) {
  return encode_empty(Flush::kTag);
}
Bytes encode(const Close& m) {
  return encode_kind_and_name(Close::kTag, m.kind, m.name);
}
Bytes encode(const Terminate&) {
  return encode_empty(Terminate::kTag);
}

Bytes encode(const CopyFail& m) {
  MessageWriter mw(CopyFail::kTag, m.message.size() + 1);
  put_cstr(mw.body(), m.message);
  return std::move(mw).finish();
}

Bytes encode(const FunctionCall& m) {
  MessageWriter mw(FunctionCall::kTag, 10 + 2 * m.arg_formats.size() + values_size(m.args));
  ByteWriter& w = mw.body();
  w.u32(m.function);
  put_formats(w, m.arg_formats);
  put_values(w, m.args);
  w.i16(m.result_format);
  return std::move(mw).finish();
}

Bytes encode(const PasswordMessage& m) {
  MessageWriter mw(PasswordMessage::kTag, m.password.size() + 1);
  put_cstr(mw.body(), m.password);
  return std::move(mw).finish();
}

Bytes encode(const SASLInitialResponse& m) {
  MessageWriter mw(SASLInitialResponse::kTag,
                   m.mechanism.size() + 5 + (m.data ? m.data->size() : 0));
  ByteWriter& w = mw.body();
  put_cstr(w, m.mechanism);
  if (m.data) {
    w.i32(static_cast<std::int32_t>(m.data->size()));
    w.raw(*m.data);
  } else {
    w.i32(-1);
  }
  return std::move(mw).finish();
}

Bytes encode(const SASLResponse& m) {
  MessageWriter mw(SASLResponse::kTag, m.data.size());
  mw.body().raw(m.data);
  return std::move(mw).finish();
}

Bytes encode(const PasswordPacket& m) {
  MessageWriter mw(PasswordPacket::kTag, m.body.size());
  mw.body().raw(m.body);
  return std::move(mw).finish();
}

Result<Query> parse_query(ByteView body) {
  ByteReader r(body);
  Query m{r.cstr()};
  PGRELAY_TRY(check_complete(r, "Query"));
  return m;
}

Result<Parse> parse_parse(ByteView body) {
  ByteReader r(body);
  Parse m;
  m.statement = r.cstr();
  m.sql = r.cstr();
  const std::uint16_t n = r.u16();
  if (!r.ok() || !count_fits(r, n, 4)) return insufficient_data("Parse");
  m.param_types.reserve(n);
  for (std::uint16_t i = 0; i < n; ++i) m.param_types.push_back(r.u32());
  PGRELAY_TRY(check_complete(r, "Parse"));
  return m;
}

Result<Bind> parse_bind(ByteView body) {
  ByteReader r(body);
  Bind m;
  m.portal = r.cstr();
  m.statement = r.cstr();
  if (!read_formats(r, m.param_formats) || !read_values(r, m.params) ||
      !read_formats(r, m.result_formats)) {
    return insufficient_data("Bind");
  }
  PGRELAY_TRY(check_complete(r, "Bind"));
  if (m.param_formats.size() > 1 && m.param_formats.size() != m.params.size()) {
    return Error::protocol("bind message has " + std::to_string(m.param_formats.size()) +
                           " parameter formats but " + std::to_string(m.params.size()) +
                           " parameters");
  }
  return m;
}

Result<Describe> parse_describe(ByteView body) {
  ByteReader r(body);
  auto kind = read_object_kind(r, "DESCRIBE", "Describe");
  if (!kind.ok()) return kind.error();
  Describe m{*kind, r.cstr()};
  PGRELAY_TRY(check_complete(r, "Describe"));
  return m;
}

Result<Execute> parse_execute(ByteView body) {
  ByteReader r(body);
  Execute m;
  m.portal = r.cstr();
  m.max_rows = r.i32();
  PGRELAY_TRY(check_complete(r, "Execute"));
  return m;
}

Result<Sync> parse_sync(ByteView body) {
  PGRELAY_TRY(expect_empty(body, "Sync"));
  return Sync{};
}

Result<Flush> parse_flush(ByteView body) {
  PGRELAY_TRY(expect_empty(body, "Flush"));
  return Flush{};
}

Result<Close> parse_close(ByteView body) {
  ByteReader r(body);
  auto kind = read_object_kind(r, "CLOSE", "Close");
  if (!kind.ok()) return kind.error();
  Close m{*kind, r.cstr()};
  PGRELAY_TRY(check_complete(r, "Close"));
  return m;
}

Result<Terminate> parse_terminate(ByteView body) {
  PGRELAY_TRY(expect_empty(body, "Terminate"));
  return Terminate{};
}

Result<CopyFail> parse_copy_fail(ByteView body) {
  ByteReader r(body);
  CopyFail m{r.cstr()};
  PGRELAY_TRY(check_complete(r, "CopyFail"));
  return m;
}

Result<FunctionCall> parse_function_call(ByteView body) {
  ByteReader r(body);
  FunctionCall m;
  m.function = r.u32();
  if (!r.ok() || !read_formats(r, m.arg_formats) || !read_values(r, m.args)) {
    return insufficient_data("FunctionCall");
  }
  m.result_format = r.i16();
  PGRELAY_TRY(check_complete(r, "FunctionCall"));
  if (m.arg_formats.size() > 1 && m.arg_formats.size() != m.args.size()) {
    return Error::protocol("function call message contains " +
                           std::to_string(m.arg_formats.size()) + " argument formats but " +
                           std::to_string(m.args.size()) + " arguments");
  }
  return m;
}

Result<PasswordMessage> parse_password_message(ByteView body) {
  ByteReader r(body);
  PasswordMessage m{r.cstr()};
  // Postgres checks that the string fills the packet exactly (recv_password_packet).
  if (!r.ok() || !r.at_end()) return Error::protocol("invalid password packet size");
  return m;
}

Result<SASLInitialResponse> parse_sasl_initial_response(ByteView body) {
  ByteReader r(body);
  SASLInitialResponse m;
  m.mechanism = r.cstr();
  const std::int32_t len = r.i32();
  if (!r.ok() || len < -1) return insufficient_data("SASLInitialResponse");
  if (len >= 0) {
    ByteView data = r.bytes(static_cast<std::size_t>(len));
    if (r.ok()) m.data = Bytes(data.begin(), data.end());
  }
  PGRELAY_TRY(check_complete(r, "SASLInitialResponse"));
  return m;
}

Result<SASLResponse> parse_sasl_response(ByteView body) {
  return SASLResponse{Bytes(body.begin(), body.end())};
}

namespace {

template <typename T>
Result<FrontendMessage> widen(Result<T> r) {
  if (!r.ok()) return r.error();
  return FrontendMessage(std::move(r).value());
}

}  // namespace

Result<FrontendMessage> parse_frontend(char tag, ByteView body) {
  switch (tag) {
    case Query::kTag:
      return widen(parse_query(body));
    case Parse::kTag:
      return widen(parse_parse(body));
    case Bind::kTag:
      return widen(parse_bind(body));
    case Describe::kTag:
      return widen(parse_describe(body));
    case Execute::kTag:
      return widen(parse_execute(body));
    case Sync::kTag:
      return widen(parse_sync(body));
    case Flush::kTag:
      return widen(parse_flush(body));
    case Close::kTag:
      return widen(parse_close(body));
    case Terminate::kTag:
      return widen(parse_terminate(body));
    case CopyData::kTag:
      return widen(parse_copy_data(body));
    case CopyDone::kTag:
      return widen(parse_copy_done(body));
    case CopyFail::kTag:
      return widen(parse_copy_fail(body));
    case FunctionCall::kTag:
      return widen(parse_function_call(body));
    case PasswordPacket::kTag:
      return FrontendMessage(PasswordPacket{Bytes(body.begin(), body.end())});
    default:
      return Error::protocol("invalid frontend message type " +
                             std::to_string(static_cast<unsigned char>(tag)));
  }
}

Bytes encode(const FrontendMessage& m) {
  return std::visit([](const auto& x) { return encode(x); }, m);
}

char tag_of(const FrontendMessage& m) {
  return std::visit([](const auto& x) { return std::decay_t<decltype(x)>::kTag; }, m);
}

}  // namespace pgrelay::wire
