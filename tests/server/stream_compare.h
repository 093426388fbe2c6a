// Test support: pgrelay's walsender streams read with libpq and compared with a native slot's,
// message by message (LSNs excepted: pgrelay's are its own, by design).
#pragma once

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "pgoutput/decoder.h"
#include "replication_recorder.h"
#include "wire/replication_frames.h"

namespace pgrelay::test {

using wire::Lsn;

// What a message says, LSNs excepted (pgrelay's LSNs are its own, by design).
inline pgoutput::Message without_lsns(pgoutput::Message m) {
  if (auto* b = std::get_if<pgoutput::Begin>(&m)) b->final_lsn = Lsn();
  if (auto* c = std::get_if<pgoutput::Commit>(&m)) c->commit_lsn = c->end_lsn = Lsn();
  if (auto* l = std::get_if<pgoutput::LogicalMessage>(&m)) l->lsn = Lsn();
  return m;
}

inline std::vector<pgoutput::Message> decode_native(const RecordedStream& stream) {
  std::vector<pgoutput::Message> out;
  pgoutput::Decoder decoder(pgoutput::DecoderOptions{});
  for (std::size_t i = 0; i < stream.frames.size(); ++i) {
    auto m = decoder.decode(stream.message(i));
    EXPECT_TRUE(m.ok()) << m.error().message;
    if (!m.ok()) continue;
    if (auto* msg = std::get_if<pgoutput::LogicalMessage>(&*m)) {
      if (msg->prefix == ReplicationRecorder::kEndMarkerPrefix) continue;
    }
    out.push_back(without_lsns(std::move(*m)));
  }
  return out;
}

struct Streamed {
  std::vector<pgoutput::Message> messages;
  std::string sqlstate;  // set when the stream ended with an error
  std::string error;
  bool ended = false;  // the server ended the COPY (or the connection)
};

// Reads a pgrelay stream with libpq, decoding its messages (LSNs dropped) into `result`.
class StreamReader {
 public:
  explicit StreamReader(PGconn* conn) : conn_(conn), decoder_(pgoutput::DecoderOptions{1, false}) {}

  // Reads until a message satisfies `done` (true), the stream ends or `timeout` passes (false).
  bool read_until(const std::function<bool(const pgoutput::Message&)>& done,
                  std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!result.ended && std::chrono::steady_clock::now() < deadline) {
      char* buffer = nullptr;
      int n = PQgetCopyData(conn_, &buffer, 1);
      if (n == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        PQconsumeInput(conn_);
        continue;
      }
      if (n < 0) {
        end();
        break;
      }
      ByteView payload(reinterpret_cast<const std::uint8_t*>(buffer), static_cast<std::size_t>(n));
      auto frame = wire::parse_from_server(payload);
      bool matched = false;
      if (frame.ok()) {
        if (auto* x = std::get_if<wire::XLogData>(&*frame)) {
          auto message = decoder_.decode(x->data);
          EXPECT_TRUE(message.ok()) << message.error().message;
          if (message.ok()) {
            matched = done(*message);
            result.messages.push_back(without_lsns(std::move(*message)));
          }
        }
      }
      PQfreemem(buffer);
      if (matched) return true;
    }
    return false;
  }

  Streamed result;

 private:
  void end() {
    result.ended = true;
    while (PGresult* res = PQgetResult(conn_)) {
      if (PQresultStatus(res) == PGRES_FATAL_ERROR) {
        const char* state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        const char* msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        result.sqlstate = state ? state : "";
        result.error = msg ? msg : "";
      }
      PQclear(res);
    }
  }

  PGconn* conn_;
  pgoutput::Decoder decoder_;
};

// Streams from pgrelay until `commits` Commits arrived (then a little longer, to catch extra
// messages), an error ends the stream, or the timeout passes.
inline Streamed stream_from(PGconn* conn, std::size_t commits,
                            std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  StreamReader reader(conn);
  std::size_t seen = 0;
  if (reader.read_until(
          [&](const pgoutput::Message& m) {
            return std::holds_alternative<pgoutput::Commit>(m) && ++seen == commits;
          },
          timeout)) {
    reader.read_until([](const pgoutput::Message&) { return false; },
                      std::chrono::milliseconds(500));
  }
  return std::move(reader.result);
}

// Postgres re-sends a table's Relation after any DDL on it (relcache invalidation) even when it
// says the same, for instance after a column outside the list was added; pgrelay's walsender
// sends a Relation only when it differs from the one its consumer has. Repeats are dropped on
// both sides before comparing.
inline std::vector<pgoutput::Message> without_repeated_relations(
    std::vector<pgoutput::Message> in) {
  std::map<pgoutput::Oid, pgoutput::Relation> known;
  std::vector<pgoutput::Message> out;
  for (auto& m : in) {
    if (auto* r = std::get_if<pgoutput::Relation>(&m)) {
      auto it = known.find(r->oid);
      if (it != known.end() && it->second == *r) continue;
      known[r->oid] = *r;
    }
    out.push_back(std::move(m));
  }
  return out;
}

// pgrelay's messages against a native slot's, one by one, naming what differs.
inline void expect_same_messages(const std::vector<pgoutput::Message>& got,
                                 const std::vector<pgoutput::Message>& want) {
  const std::size_t n = std::max(want.size(), got.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (i >= want.size()) {
      ADD_FAILURE() << "extra from pgrelay: " << pgoutput::describe(got[i]);
    } else if (i >= got.size()) {
      ADD_FAILURE() << "missing from pgrelay: " << pgoutput::describe(want[i]);
    } else {
      EXPECT_EQ(got[i], want[i]) << "message " << i << "\n pgrelay: " << pgoutput::describe(got[i])
                                 << "\n native:  " << pgoutput::describe(want[i]);
    }
  }
}

inline std::size_t count_commits(const std::vector<pgoutput::Message>& messages) {
  std::size_t n = 0;
  for (const auto& m : messages) n += std::holds_alternative<pgoutput::Commit>(m);
  return n;
}

}  // namespace pgrelay::test
