// Shared by frontend and backend messages: CopyData/CopyDone, framing, parse-error helpers.
#include "wire/messages.h"

#include <cstdio>

namespace pgrelay::wire {

std::string describe_tag(char tag) {
  const auto byte = static_cast<unsigned char>(tag);
  if (byte >= 0x21 && byte <= 0x7e) return std::string("\"") + tag + "\"";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%u", static_cast<unsigned>(byte));
  return buf;
}

void append_frame_header(ByteWriter& w, char tag, std::size_t body_size) {
  w.u8(static_cast<std::uint8_t>(tag));
  w.u32(static_cast<std::uint32_t>(body_size + 4));
}

void append_frame(Bytes& out, char tag, ByteView body) {
  ByteWriter w(std::move(out));
  append_frame_header(w, tag, body.size());
  w.raw(body);
  out = std::move(w).take();
}

namespace detail {

MessageWriter::MessageWriter(char tag, std::size_t body_hint) {
  Bytes initial;
  initial.reserve(5 + body_hint);
  w_ = ByteWriter(std::move(initial));
  if (tag != 0) w_.u8(static_cast<std::uint8_t>(tag));
  length_at_ = w_.size();
  w_.u32(0);
}

Bytes MessageWriter::finish() && {
  w_.patch_u32(length_at_, static_cast<std::uint32_t>(w_.size() - length_at_));
  return std::move(w_).take();
}

void put_cstr(ByteWriter& w, std::string_view s) {
  const std::size_t nul = s.find('\0');
  w.cstr(nul == std::string_view::npos ? s : s.substr(0, nul));
}

Error insufficient_data(std::string_view what) {
  return Error::make(sqlstate::kProtocolViolation, "insufficient data left in message", {},
                     "while reading a " + std::string(what) + " message");
}

Error invalid_format(std::string_view what) {
  return Error::make(sqlstate::kProtocolViolation, "invalid message format", {},
                     std::string(what) + " message has trailing bytes");
}

Status check_complete(const ByteReader& r, std::string_view what) {
  if (!r.ok()) return insufficient_data(what);
  if (!r.at_end()) return invalid_format(what);
  return {};
}

Status expect_empty(ByteView body, std::string_view what) {
  if (!body.empty()) return invalid_format(what);
  return {};
}

void put_formats(ByteWriter& w, const std::vector<FormatCode>& formats) {
  w.u16(static_cast<std::uint16_t>(formats.size()));
  for (FormatCode f : formats) w.i16(f);
}

void put_values(ByteWriter& w, const std::vector<std::optional<Bytes>>& values) {
  w.u16(static_cast<std::uint16_t>(values.size()));
  for (const auto& v : values) {
    if (!v) {
      w.i32(-1);
      continue;
    }
    w.i32(static_cast<std::int32_t>(v->size()));
    w.raw(*v);
  }
}

std::size_t values_size(const std::vector<std::optional<Bytes>>& values) {
  std::size_t n = 0;
  for (const auto& v : values) n += 4 + (v ? v->size() : 0);
  return n;
}

bool read_formats(ByteReader& r, std::vector<FormatCode>& out) {
  const std::uint16_t n = r.u16();
  if (!r.ok() || !count_fits(r, n, 2)) return false;
  out.reserve(n);
  for (std::uint16_t i = 0; i < n; ++i) out.push_back(r.i16());
  return r.ok();
}

bool read_value(ByteReader& r, std::optional<Bytes>& out) {
  const std::int32_t len = r.i32();
  if (!r.ok() || len < -1) return false;
  if (len == -1) {
    out.reset();
    return true;
  }
  ByteView v = r.bytes(static_cast<std::size_t>(len));
  if (!r.ok()) return false;
  out.emplace(v.begin(), v.end());
  return true;
}

bool read_values(ByteReader& r, std::vector<std::optional<Bytes>>& out) {
  const std::uint16_t n = r.u16();
  if (!r.ok() || !count_fits(r, n, 4)) return false;
  out.resize(n);
  for (auto& v : out) {
    if (!read_value(r, v)) return false;
  }
  return true;
}

}  // namespace detail

Bytes encode(const CopyData& m) {
  detail::MessageWriter mw(CopyData::kTag, m.data.size());
  mw.body().raw(m.data);
  return std::move(mw).finish();
}

Bytes encode(const CopyDone&) {
  return std::move(detail::MessageWriter(CopyDone::kTag)).finish();
}

Result<CopyData> parse_copy_data(ByteView body) {
  return CopyData{Bytes(body.begin(), body.end())};
}

Result<CopyDone> parse_copy_done(ByteView body) {
  PGRELAY_TRY(detail::expect_empty(body, "CopyDone"));
  return CopyDone{};
}

}  // namespace pgrelay::wire
