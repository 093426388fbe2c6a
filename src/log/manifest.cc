// Serializes and parses the log manifest: a short text file whose last line is its CRC.
#include "log/manifest.h"

#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "log/crc32c.h"

namespace pgrelay::log {

namespace {

constexpr const char* kHeaderLine = "pgrelay-log-manifest 1";

Error manifest_error(const std::string& path, const std::string& why) {
  return Error::make(sqlstate::kDataCorrupted, "log manifest \"" + path + "\" is invalid: " + why,
                     "The manifest is written atomically, so this means it was edited or damaged. "
                     "Restore the data directory from a backup.");
}

}  // namespace

std::string segment_file_name(std::uint64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIX64 ".seg", seq);
  return buf;
}

std::string index_file_name(std::uint64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIX64 ".idx", seq);
  return buf;
}

Bytes serialize_manifest(const Manifest& m) {
  std::ostringstream out;
  out << kHeaderLine << "\n";
  out << "system-id " << m.system_id << "\n";
  out << "next-seq " << m.next_seq << "\n";
  out << "removed-through " << m.removed_through.to_string() << "\n";
  for (const auto& s : m.segments) {
    out << "segment " << s.seq << ' ' << (s.sealed ? "sealed" : "active") << ' '
        << s.first_lsn.to_string() << ' ' << s.last_lsn.to_string() << ' ' << s.first_time << ' '
        << s.last_time << ' ' << s.bytes << "\n";
  }
  std::string body = out.str();
  char crc_line[32];
  std::snprintf(crc_line, sizeof crc_line, "crc %08X\n", crc32c(as_bytes(body)));
  body += crc_line;
  return Bytes(body.begin(), body.end());
}

Result<Manifest> parse_manifest(ByteView data, const std::string& path) {
  std::string text(as_chars(data));
  auto crc_pos = text.rfind("crc ");
  if (crc_pos == std::string::npos) return manifest_error(path, "no CRC line");
  unsigned stored = 0;
  if (std::sscanf(text.c_str() + crc_pos, "crc %8X", &stored) != 1) {
    return manifest_error(path, "unreadable CRC line");
  }
  // The CRC line must be exactly as written, or a damaged last byte would go unnoticed.
  char expected_line[32];
  std::snprintf(expected_line, sizeof expected_line, "crc %08X\n", stored);
  if (text.compare(crc_pos, std::string::npos, expected_line) != 0) {
    return manifest_error(path, "damaged CRC line");
  }
  if (crc32c(as_bytes(std::string_view(text).substr(0, crc_pos))) != stored) {
    return manifest_error(path, "CRC mismatch");
  }
  std::istringstream in(text.substr(0, crc_pos));
  std::string line;
  if (!std::getline(in, line) || line != kHeaderLine) {
    return manifest_error(path, "unknown header \"" + line + "\"");
  }
  Manifest m;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "system-id") {
      fields >> m.system_id;
    } else if (key == "next-seq") {
      fields >> m.next_seq;
    } else if (key == "removed-through") {
      std::string lsn;
      fields >> lsn;
      auto parsed = Lsn::parse(lsn);
      if (!parsed) return manifest_error(path, "bad LSN in \"" + line + "\"");
      m.removed_through = *parsed;
    } else if (key == "segment") {
      SegmentInfo s;
      std::string state, first, last;
      fields >> s.seq >> state >> first >> last >> s.first_time >> s.last_time >> s.bytes;
      auto first_lsn = Lsn::parse(first);
      auto last_lsn = Lsn::parse(last);
      if (fields.fail() || !first_lsn || !last_lsn || (state != "sealed" && state != "active")) {
        return manifest_error(path, "bad segment line \"" + line + "\"");
      }
      s.sealed = state == "sealed";
      s.first_lsn = *first_lsn;
      s.last_lsn = *last_lsn;
      m.segments.push_back(s);
    } else {
      return manifest_error(path, "unknown line \"" + line + "\"");
    }
    if (fields.fail()) return manifest_error(path, "bad line \"" + line + "\"");
  }
  for (std::size_t i = 1; i < m.segments.size(); ++i) {
    if (m.segments[i].seq <= m.segments[i - 1].seq) {
      return manifest_error(path, "segments out of order");
    }
  }
  return m;
}

}  // namespace pgrelay::log
