// Tests frontend/backend message builders and parsers: round trips, byte layouts, malformed bodies.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "wire/backend_messages.h"
#include "wire/frame_reader.h"
#include "wire/frontend_messages.h"
#include "wire/messages.h"

namespace pgrelay::wire {
namespace {

using namespace std::string_literals;

Bytes b(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

// Splits an encoded message through a FrameReader fed one byte at a time, expecting one frame.
Frame reframe(const Bytes& encoded) {
  FrameReader reader(FrameReader::Phase::kRegular);
  std::vector<Frame> frames;
  for (std::uint8_t byte : encoded) {
    reader.feed(ByteView(&byte, 1));
    for (;;) {
      auto next = reader.next();
      EXPECT_TRUE(next.ok());
      if (!next.ok() || !next->has_value()) break;
      frames.push_back(std::move(**next));
    }
  }
  EXPECT_TRUE(reader.finish_at_eof().ok());
  EXPECT_EQ(frames.size(), 1u);
  return frames.empty() ? Frame{} : frames[0];
}

// build -> frame reader -> parse_X and dispatcher -> equal.
template <typename M, typename ParseFn>
void expect_frontend_round_trip(const M& m, ParseFn parse) {
  const Bytes encoded = encode(m);
  const Frame f = reframe(encoded);
  EXPECT_EQ(f.tag, M::kTag);
  auto parsed = parse(f.body);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(*parsed, m);
  if constexpr (M::kTag != 'p') {
    auto any = parse_frontend(f.tag, f.body);
    ASSERT_TRUE(any.ok()) << any.error().message;
    ASSERT_TRUE(std::holds_alternative<M>(*any));
    EXPECT_EQ(std::get<M>(*any), m);
    EXPECT_EQ(tag_of(*any), M::kTag);
    EXPECT_EQ(encode(*any), encoded);
  }
}

template <typename M, typename ParseFn>
void expect_backend_round_trip(const M& m, ParseFn parse) {
  const Bytes encoded = encode(m);
  const Frame f = reframe(encoded);
  EXPECT_EQ(f.tag, M::kTag);
  auto parsed = parse(f.body);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(*parsed, m);
  auto any = parse_backend(f.tag, f.body);
  ASSERT_TRUE(any.ok()) << any.error().message;
  ASSERT_TRUE(std::holds_alternative<M>(*any));
  EXPECT_EQ(std::get<M>(*any), m);
  EXPECT_EQ(tag_of(*any), M::kTag);
  EXPECT_EQ(encode(*any), encoded);
}

// Every proper prefix of the body must be rejected with 08P01, and so must one extra byte.
template <typename M, typename ParseFn>
void expect_strict_body(const M& m, ParseFn parse) {
  const Bytes encoded = encode(m);
  const Bytes body(encoded.begin() + 5, encoded.end());
  for (std::size_t cut = 0; cut < body.size(); ++cut) {
    auto r = parse(ByteView(body).first(cut));
    ASSERT_FALSE(r.ok()) << "accepted a body truncated to " << cut << " of " << body.size();
    EXPECT_EQ(r.error().sqlstate, "08P01");
  }
  Bytes longer = body;
  longer.push_back(0);
  auto r = parse(longer);
  ASSERT_FALSE(r.ok()) << "accepted a trailing byte";
  EXPECT_EQ(r.error().sqlstate, "08P01");
}

template <typename M, typename ParseFn>
void expect_frontend_message(const M& m, ParseFn parse) {
  expect_frontend_round_trip(m, parse);
  expect_strict_body(m, parse);
}

template <typename M, typename ParseFn>
void expect_backend_message(const M& m, ParseFn parse) {
  expect_backend_round_trip(m, parse);
  expect_strict_body(m, parse);
}

// ---- Frontend round trips and strictness ----

TEST(FrontendMessages, RoundTripAndRejectTruncationAndTrailingBytes) {
  expect_frontend_message(Query{"SELECT 1"}, parse_query);
  expect_frontend_message(Query{""}, parse_query);
  expect_frontend_message(Parse{"stmt", "SELECT $1, $2", {23, 0}}, parse_parse);
  expect_frontend_message(Parse{}, parse_parse);
  expect_frontend_message(Bind{"portal", "stmt", {1}, {b("ab"), std::nullopt, b("")}, {0, 1}},
                          parse_bind);
  expect_frontend_message(Bind{"", "", {0, 1}, {std::nullopt, b("\x00\x01"s)}, {}}, parse_bind);
  expect_frontend_message(Bind{}, parse_bind);
  expect_frontend_message(Describe{ObjectKind::kPortal, "p1"}, parse_describe);
  expect_frontend_message(Describe{ObjectKind::kStatement, ""}, parse_describe);
  expect_frontend_message(Execute{"p1", 100}, parse_execute);
  expect_frontend_message(Execute{"", 0}, parse_execute);
  expect_frontend_message(Sync{}, parse_sync);
  expect_frontend_message(Flush{}, parse_flush);
  expect_frontend_message(Close{ObjectKind::kStatement, "s"}, parse_close);
  expect_frontend_message(Terminate{}, parse_terminate);
  expect_frontend_message(CopyFail{"no more"}, parse_copy_fail);
  expect_frontend_message(FunctionCall{1598, {1}, {b("x"), std::nullopt}, 1}, parse_function_call);
  expect_frontend_message(PasswordMessage{"md5abc"}, parse_password_message);
  expect_frontend_message(SASLInitialResponse{"SCRAM-SHA-256", b("n,,n=,r=abc")},
                          parse_sasl_initial_response);
  expect_frontend_message(SASLInitialResponse{"SCRAM-SHA-256", std::nullopt},
                          parse_sasl_initial_response);
  expect_frontend_message(SASLInitialResponse{"X", b("")}, parse_sasl_initial_response);
  expect_frontend_message(CopyDone{}, parse_copy_done);
}

TEST(FrontendMessages, RawBodyMessagesRoundTrip) {
  // CopyData and SASLResponse carry the whole body, so any length is valid.
  expect_frontend_round_trip(CopyData{b("row\tdata\n")}, parse_copy_data);
  expect_frontend_round_trip(CopyData{}, parse_copy_data);
  expect_frontend_round_trip(SASLResponse{b("c=biws,r=abc,p=xyz")}, parse_sasl_response);
}

TEST(FrontendMessages, PasswordPacketIsInterpretedByContext) {
  const Bytes encoded = encode(SASLInitialResponse{"SCRAM-SHA-256", b("n,,n=,r=x")});
  const Frame f = reframe(encoded);
  auto any = parse_frontend(f.tag, f.body);
  ASSERT_TRUE(any.ok());
  ASSERT_TRUE(std::holds_alternative<PasswordPacket>(*any));
  const auto& packet = std::get<PasswordPacket>(*any);
  auto sasl = parse_sasl_initial_response(packet.body);
  ASSERT_TRUE(sasl.ok());
  EXPECT_EQ(sasl->mechanism, "SCRAM-SHA-256");
  // The same bytes are not a valid PasswordMessage: the string does not fill the packet.
  auto password = parse_password_message(packet.body);
  ASSERT_FALSE(password.ok());
  EXPECT_EQ(password.error().message, "invalid password packet size");
  EXPECT_EQ(encode(packet), encoded);
}

// ---- Frontend byte layouts (protocol docs, "Message Formats") ----

TEST(FrontendMessages, ByteLayouts) {
  EXPECT_EQ(encode(Query{"SELECT 1"}), b("Q\x00\x00\x00\x0dSELECT 1\x00"s));
  EXPECT_EQ(encode(Sync{}), b("S\x00\x00\x00\x04"s));
  EXPECT_EQ(encode(Terminate{}), b("X\x00\x00\x00\x04"s));
  EXPECT_EQ(encode(Describe{ObjectKind::kPortal, ""}), b("D\x00\x00\x00\x06P\x00"s));
  EXPECT_EQ(encode(Execute{"", 0}), b("E\x00\x00\x00\x09\x00\x00\x00\x00\x00"s));
  EXPECT_EQ(encode(Parse{"", "SELECT $1", {23}}),
            b("P\x00\x00\x00\x15\x00SELECT $1\x00\x00\x01\x00\x00\x00\x17"s));
  // portal "", statement "s", no param formats, 2 params ("7" and NULL), 1 result format binary
  EXPECT_EQ(encode(Bind{"", "s", {}, {b("7"), std::nullopt}, {1}}),
            b("B\x00\x00\x00\x18\x00s\x00\x00\x00\x00\x02\x00\x00\x00\x01"
              "7\xff\xff\xff\xff\x00\x01\x00\x01"s));
  EXPECT_EQ(encode(SASLInitialResponse{"A", std::nullopt}), b("p\x00\x00\x00\x0a"
                                                              "A\x00\xff\xff\xff\xff"s));
}

TEST(FrontendMessages, AppendedFramesAreTheEncodedMessagesAfterWhatWasThere) {
  Bytes out = b("xy");
  append_frame(out, 'Q', b("SELECT 1\x00"s));
  append_frame(out, 'S', {});
  EXPECT_EQ(out, b("xyQ\x00\x00\x00\x0dSELECT 1\x00S\x00\x00\x00\x04"s));
  EXPECT_EQ(Bytes(out.begin() + 2, out.end() - 5), encode(Query{"SELECT 1"}));
}

// ---- Frontend malformed input ----

TEST(FrontendMessages, UnknownTagIsNamedAsPostgresDoes) {
  auto r = parse_frontend('z', {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, "08P01");
  EXPECT_EQ(r.error().message, "invalid frontend message type 122");
  auto high = parse_frontend(static_cast<char>(0xC8), {});
  ASSERT_FALSE(high.ok());
  EXPECT_EQ(high.error().message, "invalid frontend message type 200");
}

TEST(FrontendMessages, DescribeAndCloseSubtypes) {
  auto d = parse_describe(b("X\x00"s));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().sqlstate, "08P01");
  EXPECT_EQ(d.error().message, "invalid DESCRIBE message subtype 88");
  auto c = parse_close(b("Q\x00"s));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message, "invalid CLOSE message subtype 81");
}

TEST(FrontendMessages, BindFormatCountMustMatchParameters) {
  auto r = parse_bind(b("\x00\x00\x00\x02\x00\x00\x00\x01\x00\x01\x00\x00\x00\x00\x00\x00"s));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, "08P01");
  EXPECT_EQ(r.error().message, "bind message has 2 parameter formats but 1 parameters");
}

TEST(FrontendMessages, BindRejectsBadLengthsAndHugeCounts) {
  // Parameter length -2.
  EXPECT_FALSE(parse_bind(b("\x00\x00\x00\x00\x00\x01\xff\xff\xff\xfe\x00\x00"s)).ok());
  // Parameter length beyond the body.
  EXPECT_FALSE(parse_bind(b("\x00\x00\x00\x00\x00\x01\x7f\xff\xff\xff\x00\x00"s)).ok());
  // 65535 parameters announced with nothing behind them.
  auto huge = parse_bind(b("\x00\x00\x00\x00\xff\xff"s));
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().message, "insufficient data left in message");
  // 65535 parameter formats announced.
  EXPECT_FALSE(parse_bind(b("\x00\x00\xff\xff\x00\x00"s)).ok());
  // Parse with 65535 parameter types announced.
  EXPECT_FALSE(parse_parse(b("\x00\x00\xff\xff"s)).ok());
}

TEST(FrontendMessages, FunctionCallFormatCountMustMatchArguments) {
  ByteWriter w;
  w.u32(1598);
  w.u16(2);
  w.i16(0);
  w.i16(0);
  w.u16(1);
  w.i32(-1);
  w.i16(0);
  auto r = parse_function_call(w.bytes());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "function call message contains 2 argument formats but 1 arguments");
}

TEST(FrontendMessages, SaslInitialResponseLengths) {
  EXPECT_FALSE(parse_sasl_initial_response(b("M\x00\xff\xff\xff\xfe"s)).ok());
  EXPECT_FALSE(parse_sasl_initial_response(b("M\x00\x00\x00\x00\x05xy"s)).ok());
  auto ok = parse_sasl_initial_response(b("M\x00\x00\x00\x00\x02xy"s));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->data, b("xy"));
}

TEST(FrontendMessages, EmptyMessagesRejectTrailingBytes) {
  auto r = parse_sync(b("x"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, "08P01");
  EXPECT_EQ(r.error().message, "invalid message format");
  EXPECT_FALSE(parse_flush(b("x")).ok());
  EXPECT_FALSE(parse_terminate(b("x")).ok());
  EXPECT_FALSE(parse_copy_done(b("x")).ok());
}

TEST(FrontendMessages, StringsWithNulAreCutSoFramingStaysValid) {
  const Bytes encoded = encode(Query{"SELECT 1\0; DROP"s});
  const Frame f = reframe(encoded);
  auto q = parse_query(f.body);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->sql, "SELECT 1");
}

// ---- Backend round trips and strictness ----

TEST(BackendMessages, AuthenticationRoundTrips) {
  expect_backend_message(AuthenticationOk{}, parse_authentication_ok);
  expect_backend_message(AuthenticationCleartextPassword{},
                         parse_authentication_cleartext_password);
  expect_backend_message(AuthenticationMD5Password{{0xde, 0xad, 0xbe, 0xef}},
                         parse_authentication_md5_password);
  expect_backend_message(AuthenticationSASL{{"SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"}},
                         parse_authentication_sasl);
  expect_backend_message(AuthenticationSASL{}, parse_authentication_sasl);
  // SASL data fills the rest of the body: only the code can be truncated.
  expect_backend_round_trip(AuthenticationSASLContinue{b("r=abc,s=c2FsdA==,i=4096")},
                            parse_authentication_sasl_continue);
  expect_backend_round_trip(AuthenticationSASLFinal{b("v=xyz")}, parse_authentication_sasl_final);
  EXPECT_FALSE(parse_authentication_sasl_continue(b("\x00\x00\x00"s)).ok());
}

TEST(BackendMessages, AuthenticationRequestCodeMustMatch) {
  const Bytes md5 = encode(AuthenticationMD5Password{{1, 2, 3, 4}});
  auto r = parse_authentication_ok(ByteView(md5).subspan(5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, "08P01");
  auto unsupported = parse_authentication(b("\x00\x00\x00\x07"s));  // GSSAPI
  ASSERT_FALSE(unsupported.ok());
  EXPECT_EQ(unsupported.error().sqlstate, "0A000");
  EXPECT_EQ(unsupported.error().message, "authentication method 7 not supported");
  auto any = parse_authentication(ByteView(md5).subspan(5));
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(std::get<AuthenticationMD5Password>(*any).salt,
            (std::array<std::uint8_t, 4>{1, 2, 3, 4}));
}

TEST(BackendMessages, RoundTripAndRejectTruncationAndTrailingBytes) {
  expect_backend_message(ParameterStatus{"server_version", "15.4"}, parse_parameter_status);
  expect_backend_message(BackendKeyData{4242, -7}, parse_backend_key_data);
  expect_backend_message(ReadyForQuery{TransactionStatus::kIdle}, parse_ready_for_query);
  expect_backend_message(ReadyForQuery{TransactionStatus::kInTransaction}, parse_ready_for_query);
  expect_backend_message(ReadyForQuery{TransactionStatus::kFailedTransaction},
                         parse_ready_for_query);
  expect_backend_message(
      RowDescription{{FieldDescription{"id", 16384, 1, 23, 4, -1, 0},
                      FieldDescription{"", 0, 0, 25, -1, -1, 1},
                      FieldDescription{"n", 0xFFFFFFFF, -32768, 1700, -1, 0x7FFFFFFF, 0}}},
      parse_row_description);
  expect_backend_message(RowDescription{}, parse_row_description);
  expect_backend_message(DataRow{{b("1"), std::nullopt, b("")}}, parse_data_row);
  expect_backend_message(DataRow{}, parse_data_row);
  expect_backend_message(CommandComplete{"INSERT 0 1"}, parse_command_complete);
  expect_backend_message(EmptyQueryResponse{}, parse_empty_query_response);
  expect_backend_message(NotificationResponse{77, "chan", "payload"}, parse_notification_response);
  CopyInResponse in;
  in.format = 0;
  in.column_formats = {0, 0};
  expect_backend_message(in, parse_copy_in_response);
  CopyOutResponse out;
  out.format = 1;
  out.column_formats = {1};
  expect_backend_message(out, parse_copy_out_response);
  expect_backend_message(CopyBothResponse{}, parse_copy_both_response);
  expect_backend_message(ParseComplete{}, parse_parse_complete);
  expect_backend_message(BindComplete{}, parse_bind_complete);
  expect_backend_message(CloseComplete{}, parse_close_complete);
  expect_backend_message(NoData{}, parse_no_data);
  expect_backend_message(PortalSuspended{}, parse_portal_suspended);
  expect_backend_message(ParameterDescription{{23, 25, 0xFFFFFFFF}}, parse_parameter_description);
  expect_backend_message(NegotiateProtocolVersion{{3, 0}, {"_pq_.a", "_pq_.b"}},
                         parse_negotiate_protocol_version);
  expect_backend_message(FunctionCallResponse{b("42")}, parse_function_call_response);
  expect_backend_message(FunctionCallResponse{std::nullopt}, parse_function_call_response);
  expect_backend_message(CopyDone{}, parse_copy_done);
  expect_backend_round_trip(CopyData{b("\x00\x01\x02"s)}, parse_copy_data);
}

TEST(BackendMessages, ErrorAndNoticeKeepEveryFieldInOrder) {
  ErrorResponse e;
  for (char code : std::string("SVCMDHPpqWstcdnFLR"))
    e.fields.push_back({code, "v" + std::string(1, code)});
  e.fields.push_back({'Z', "unknown code kept"});
  e.fields.push_back({'M', "second M"});
  expect_backend_message(e, parse_error_response);
  EXPECT_EQ(e.severity(), "vV");
  EXPECT_EQ(e.sqlstate(), "vC");
  EXPECT_EQ(e.message(), "vM");  // the first M
  EXPECT_EQ(e.find('Z'), "unknown code kept");
  EXPECT_FALSE(e.find('Y').has_value());

  NoticeResponse n;
  n.fields = {{'S', "NOTICE"}, {'C', "00000"}, {'M', "hello"}};
  expect_backend_message(n, parse_notice_response);
  EXPECT_EQ(n.severity(), "NOTICE");  // no V: falls back to S
  expect_backend_message(NoticeResponse{}, parse_notice_response);
}

TEST(BackendMessages, ErrorResponseFromError) {
  const Error err =
      Error::make("42P01", "relation \"x\" does not exist", "Create it.", "Some detail.");
  const ErrorResponse r = make_error_response(err, Severity::kFatal);
  const std::vector<NoticeField> expected = {
      {'S', "FATAL"},        {'V', "FATAL"},
      {'C', "42P01"},        {'M', "relation \"x\" does not exist"},
      {'D', "Some detail."}, {'H', "Create it."}};
  EXPECT_EQ(r.fields, expected);
  const Error back = r.to_error();
  EXPECT_EQ(back.sqlstate, "42P01");
  EXPECT_EQ(back.message, err.message);
  EXPECT_EQ(back.detail, "Some detail.");
  EXPECT_EQ(back.hint, "Create it.");

  // Empty detail and hint are left out; the layout matches the protocol docs byte for byte.
  const ErrorResponse plain = make_error_response(Error::protocol("bad"));
  EXPECT_EQ(encode(plain), b("E\x00\x00\x00\x1fSERROR\x00VERROR\x00"
                             "C08P01\x00Mbad\x00\x00"s));
  const NoticeResponse notice =
      make_notice_response(Error::make("01000", "careful"), Severity::kWarning);
  EXPECT_EQ(notice.severity(), "WARNING");
  EXPECT_EQ(ErrorResponse{}.to_error().sqlstate, "XX000");
}

TEST(BackendMessages, ByteLayouts) {
  EXPECT_EQ(encode(AuthenticationOk{}), b("R\x00\x00\x00\x08\x00\x00\x00\x00"s));
  EXPECT_EQ(encode(AuthenticationCleartextPassword{}), b("R\x00\x00\x00\x08\x00\x00\x00\x03"s));
  EXPECT_EQ(encode(AuthenticationMD5Password{{1, 2, 3, 4}}),
            b("R\x00\x00\x00\x0c\x00\x00\x00\x05\x01\x02\x03\x04"s));
  EXPECT_EQ(encode(AuthenticationSASL{{"SCRAM-SHA-256"}}),
            b("R\x00\x00\x00\x17\x00\x00\x00\x0aSCRAM-SHA-256\x00\x00"s));
  EXPECT_EQ(encode(AuthenticationSASLFinal{b("v=x")}), b("R\x00\x00\x00\x0b\x00\x00\x00\x0cv=x"s));
  EXPECT_EQ(encode(ReadyForQuery{TransactionStatus::kIdle}), b("Z\x00\x00\x00\x05I"s));
  EXPECT_EQ(encode(BackendKeyData{1234, 5678}),
            b("K\x00\x00\x00\x0c\x00\x00\x04\xd2\x00\x00\x16\x2e"s));
  EXPECT_EQ(encode(ParameterStatus{"a", "b"}), b("S\x00\x00\x00\x08"
                                                 "a\x00"
                                                 "b\x00"s));
  EXPECT_EQ(encode(DataRow{{b("1"), std::nullopt}}), b("D\x00\x00\x00\x0f\x00\x02\x00\x00\x00\x01"
                                                       "1\xff\xff\xff\xff"s));
  EXPECT_EQ(encode(CommandComplete{"SELECT 1"}), b("C\x00\x00\x00\x0dSELECT 1\x00"s));
  EXPECT_EQ(encode(RowDescription{{FieldDescription{"a", 0, 0, 23, 4, -1, 0}}}),
            b("T\x00\x00\x00\x1a\x00\x01"
              "a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x17\x00\x04\xff\xff\xff\xff\x00\x00"s));
  CopyOutResponse out;
  out.format = 0;
  out.column_formats = {0};
  EXPECT_EQ(encode(out), b("H\x00\x00\x00\x09\x00\x00\x01\x00\x00"s));
  EXPECT_EQ(encode(NegotiateProtocolVersion{{3, 0}, {"_pq_.x"}}),
            b("v\x00\x00\x00\x13\x00\x03\x00\x00\x00\x00\x00\x01_pq_.x\x00"s));
  EXPECT_EQ(encode(ParseComplete{}), b("1\x00\x00\x00\x04"s));
  EXPECT_EQ(encode(CopyData{b("ab")}), b("d\x00\x00\x00\x06"
                                         "ab"s));
  EXPECT_EQ(encode(CopyDone{}), b("c\x00\x00\x00\x04"s));
}

// ---- Backend malformed input ----

TEST(BackendMessages, UnknownTag) {
  auto r = parse_backend('x', {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, "08P01");
  EXPECT_EQ(r.error().message, "invalid backend message type 120");
}

TEST(BackendMessages, ReadyForQueryOnlyAcceptsIdleInTransactionFailed) {
  auto r = parse_ready_for_query(b("X"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sqlstate, "08P01");
  EXPECT_EQ(r.error().message, "invalid transaction status \"X\" in ReadyForQuery message");
}

TEST(BackendMessages, HugeCountsAreRejectedWithoutAllocating) {
  EXPECT_FALSE(parse_data_row(b("\xff\xff"s)).ok());
  EXPECT_FALSE(parse_data_row(b("\x00\x01\x7f\xff\xff\xff"s)).ok());
  EXPECT_FALSE(parse_data_row(b("\x00\x01\xff\xff\xff\xfe"s)).ok());
  EXPECT_FALSE(parse_row_description(b("\xff\xff\x00\x00\x00\x00"s)).ok());
  EXPECT_FALSE(parse_parameter_description(b("\xff\xff\x00\x00"s)).ok());
  EXPECT_FALSE(parse_copy_in_response(b("\x00\xff\xff"s)).ok());
  // NegotiateProtocolVersion's count is a full int32.
  EXPECT_FALSE(parse_negotiate_protocol_version(b("\x00\x03\x00\x00\x7f\xff\xff\xff"s)).ok());
  EXPECT_FALSE(parse_negotiate_protocol_version(b("\x00\x03\x00\x00\xff\xff\xff\xff"s)).ok());
}

TEST(BackendMessages, CopyResponseFormatCodes) {
  auto overall = parse_copy_out_response(b("\x02\x00\x00"s));
  ASSERT_FALSE(overall.ok());
  EXPECT_EQ(overall.error().message, "invalid COPY format code 2 in CopyOutResponse message");
  auto column = parse_copy_both_response(b("\x01\x00\x01\x00\x05"s));
  ASSERT_FALSE(column.ok());
  EXPECT_EQ(column.error().message, "invalid column format code 5 in CopyBothResponse message");
}

TEST(BackendMessages, ErrorResponseNeedsItsTerminator) {
  EXPECT_FALSE(parse_error_response(b("SERROR\x00"s)).ok());
  EXPECT_FALSE(parse_error_response(b("SERROR"s)).ok());
  EXPECT_FALSE(parse_error_response({}).ok());
  auto trailing = parse_error_response(b("SERROR\x00\x00x"s));
  ASSERT_FALSE(trailing.ok());
  EXPECT_EQ(trailing.error().message, "invalid message format");
}

TEST(BackendMessages, TruncatedFrameBodyFailsToParse) {
  // A frame whose length word is smaller than what the builder wrote: the body is cut short.
  Bytes wire = encode(ParameterStatus{"client_encoding", "UTF8"});
  wire[4] = static_cast<std::uint8_t>(wire[4] - 3);
  FrameReader reader(FrameReader::Phase::kRegular);
  reader.feed(wire);
  auto f = reader.next();
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(f->has_value());
  EXPECT_FALSE(parse_backend((*f)->tag, (*f)->body).ok());
  // The leftover bytes then read as a bogus header.
  EXPECT_FALSE(reader.finish_at_eof().ok());
}

}  // namespace
}  // namespace pgrelay::wire
