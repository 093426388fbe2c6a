// Replication benchmark consumer: M pgoutput streams from one server, checked and timed.
//
// Used by bench/replication.sh against native Postgres and against pgrelay alike. It opens M
// replication connections, creates a TEMPORARY pgoutput slot on each, and (after an optional
// go-file, for catch-up runs) starts all streams at once and reads them in one poll() loop until
// every stream has delivered --expect inserts into table `bench`. The workload inserts rows
// with ids 1..N (RESTART IDENTITY), one row per transaction, so the data can be checked
// exactly: every id once per stream, one change per transaction, increasing commit LSNs, the
// expected payload, and the same order on every stream. Any violation, a decode error, a
// stream ending early or a stall fails the run (exit 3) with the symptom on stderr. The bulk
// workload writes all its rows in one transaction (--rows-per-transaction N) with a long
// payload (--payload-length: --payload repeated to that many bytes; --payload-any: any text of
// that length, for incompressible data).
//
// Output: one line of key=value pairs on stdout (see print_result).
//
// Usage: bench_repl_consumer --conninfo STR --expect N [--consumers M] [--slot-prefix P]
//          [--publication NAME] [--proto V] [--ready-file F] [--wait-file F]
//          [--cpu-pid LABEL=PID]... [--stall-seconds S] [--timeout-seconds S]
//          [--payload TEXT] [--payload-length L] [--payload-any]
//          [--rows-per-transaction N (default 1)]
//          [--threads T (default 2)]
#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "pgoutput/decoder.h"
#include "wire/replication_frames.h"

using namespace pgrelay;

namespace {

constexpr const char* kDefaultPayload =
    "payload-0123456789-0123456789-0123456789-0123456789-0123456789";

struct Settings {
  std::string conninfo;
  int consumers = 1;
  std::string slot_prefix = "bench_slot";
  std::string publication = "bench_pub";
  int proto = 1;
  std::int64_t expect = 0;
  std::string ready_file;
  std::string wait_file;
  std::vector<std::pair<std::string, int>> cpu_pids;
  double stall_seconds = 30;
  double timeout_seconds = 600;
  int threads = 2;
  std::string payload = kDefaultPayload;
  bool payload_length_only = false;  // --payload-any: rows carry other text of that length
  std::int64_t rows_per_transaction = 1;
  bool streaming = false;  // --streaming: protocol 2+, streaming 'on' (stream blocks accepted)
  // --receipts FILE: the first stream's transactions, one line each: "END_LSN FIRST_TS_US
  // RECEIPT_US SENT_US COMMIT_US" (commit end LSN, the first row's ts_us, when its Commit
  // arrived, the send time the server put on the Commit's XLogData, the commit time the Commit
  // carries; Unix µs), for bench/hop_report.py to line up with pgrelay's --hop-trace, or to split
  // a native walsender's latency in two.
  std::string receipts;
};

std::int64_t now_unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

// CPU seconds (user + system) of a process tree: live members plus the root's reaped children,
// so that a difference of two samples is right even if a backend exits in between.
double tree_cpu_seconds(int root) {
  struct Proc {
    int ppid = 0;
    double own = 0, reaped = 0;
  };
  std::unordered_map<int, Proc> procs;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return -1;
  while (dirent* e = readdir(dir)) {
    int pid = 0;
    if (std::from_chars(e->d_name, e->d_name + std::strlen(e->d_name), pid).ec != std::errc()) {
      continue;
    }
    std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    // The command name is in parentheses and may contain spaces: fields start after the last ')'.
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(line.substr(close + 2));
    std::vector<std::string> f;
    for (std::string tok; fields >> tok && f.size() < 15;) f.push_back(tok);
    if (f.size() < 15) continue;
    // f[0] = state (field 3), f[1] = ppid, f[11..14] = utime, stime, cutime, cstime.
    Proc p;
    p.ppid = std::atoi(f[1].c_str());
    p.own = (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) / tick;
    p.reaped = (std::atof(f[13].c_str()) + std::atof(f[14].c_str())) / tick;
    procs[pid] = p;
  }
  closedir(dir);
  if (!procs.count(root)) return -1;
  double total = procs[root].reaped;
  for (const auto& [pid, p] : procs) {
    for (int cur = pid, depth = 0; cur > 1 && depth < 64; ++depth) {
      if (cur == root) {
        total += p.own;
        break;
      }
      auto it = procs.find(cur);
      if (it == procs.end()) break;
      cur = it->second.ppid;
    }
  }
  return total;
}

double self_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Where the checked columns are in one relation's tuples.
struct RelationColumns {
  bool is_bench = false;
  int id = -1, ts_us = -1, payload = -1;
};

enum class State { kIdle, kStarting, kStreaming, kDone };

// One replication connection and the checks on what it received.
struct Stream {
  int index = 0;
  PGconn* conn = nullptr;
  std::string slot;
  State state = State::kIdle;
  pgoutput::Decoder decoder{pgoutput::DecoderOptions{}};
  std::unordered_map<pgoutput::Oid, RelationColumns> relations;
  std::vector<std::uint8_t> seen;  // by id, 1..expect
  std::int64_t inserts = 0, transactions = 0, messages = 0, truncates = 0, other = 0;
  std::int64_t changes_in_txn = 0;
  bool in_txn = false;
  wire::Lsn last_end_lsn;
  std::uint64_t digest = 1469598103934665603ull;  // FNV-1a over the ids in arrival order
  std::vector<std::int32_t> latency_us;           // receipt - the row's ts_us, per row
  std::vector<std::int32_t> commit_latency_us;    // receipt - the Commit's commit time, per commit
  // For --receipts: the open transaction's first row's ts_us, then each commit's receipt.
  std::int64_t txn_first_ts = 0;
  struct Receipt {
    wire::Lsn end_lsn;
    std::int64_t first_ts = 0, received = 0, sent = 0, committed = 0;
  };
  std::vector<Receipt> receipts;
  double last_progress = 0;
  double last_reply = 0;
  std::string where() const { return "stream " + std::to_string(index) + " (" + slot + ")"; }
};

void send_status(Stream& s) {
  wire::StandbyStatusUpdate u;
  u.write = u.flush = u.apply = s.last_end_lsn;
  u.send_time = wire::to_pg_timestamp(std::chrono::system_clock::now());
  Bytes b = wire::encode(u);
  if (PQputCopyData(s.conn, reinterpret_cast<const char*>(b.data()), static_cast<int>(b.size())) !=
      1) {
    fail(s.where() + ": sending standby status failed: " + PQerrorMessage(s.conn));
  }
  PQflush(s.conn);
  s.last_reply = steady_seconds();
}

std::int64_t to_int(const std::string& text, const std::string& what, const Stream& s) {
  std::int64_t v = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size()) {
    fail(s.where() + ": " + what + " is not an integer: \"" + text + "\"");
  }
  return v;
}

std::int32_t clamped_micros(std::int64_t us) {
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(us, INT32_MIN, INT32_MAX));
}

void on_insert(Stream& s, const Settings& cfg, const pgoutput::Insert& ins, std::int64_t now) {
  auto rel = s.relations.find(ins.relation_oid);
  if (rel == s.relations.end()) {
    fail(s.where() + ": Insert for relation " + std::to_string(ins.relation_oid) +
         " before its Relation message");
  }
  if (!rel->second.is_bench) {
    ++s.other;
    return;
  }
  if (!s.in_txn) fail(s.where() + ": Insert outside Begin..Commit");
  const RelationColumns& c = rel->second;
  const auto& cols = ins.new_tuple.columns;
  auto text_of = [&](int i, const char* name) -> const std::string& {
    if (i < 0 || static_cast<std::size_t>(i) >= cols.size() ||
        cols[i].kind != pgoutput::ValueKind::kText) {
      fail(s.where() + ": Insert without a text value for column " + name);
    }
    return cols[i].bytes;
  };
  std::int64_t id = to_int(text_of(c.id, "id"), "id", s);
  std::int64_t ts = to_int(text_of(c.ts_us, "ts_us"), "ts_us", s);
  const std::string& got = text_of(c.payload, "payload");
  if (cfg.payload_length_only ? got.size() != cfg.payload.size() : got != cfg.payload) {
    fail(s.where() + ": id " + std::to_string(id) + " has payload \"" +
         text_of(c.payload, "payload") + "\"");
  }
  if (id < 1 || id > cfg.expect) {
    fail(s.where() + ": unexpected id " + std::to_string(id) + " (expected 1.." +
         std::to_string(cfg.expect) + "; wrong data or rows from another run)");
  }
  if (s.seen[id]) fail(s.where() + ": id " + std::to_string(id) + " received twice");
  s.seen[id] = 1;
  ++s.inserts;
  if (++s.changes_in_txn == 1) s.txn_first_ts = ts;
  s.digest = (s.digest ^ static_cast<std::uint64_t>(id)) * 1099511628211ull;
  s.latency_us.push_back(clamped_micros(now - ts));
}

// A transaction's end, at Commit or Stream Commit.
// `sent` is the server's send time on the Commit's XLogData, `committed` the commit time the
// Commit carries (both Unix µs).
void on_commit(Stream& s, const Settings& cfg, wire::Lsn end_lsn, std::int64_t now,
               std::int64_t sent, std::int64_t committed) {
  if (end_lsn <= s.last_end_lsn) {
    fail(s.where() + ": commit end LSN " + end_lsn.to_string() + " not after " +
         s.last_end_lsn.to_string());
  }
  // Every workload transaction inserts the same number of rows; other transactions (a
  // TRUNCATE) change none.
  if (s.changes_in_txn != 0 && s.changes_in_txn != cfg.rows_per_transaction) {
    fail(s.where() + ": a transaction carried " + std::to_string(s.changes_in_txn) +
         " bench inserts, the workload writes " + std::to_string(cfg.rows_per_transaction) +
         " per transaction");
  }
  s.in_txn = false;
  s.last_end_lsn = end_lsn;
  ++s.transactions;
  if (s.changes_in_txn == 0) return;
  s.commit_latency_us.push_back(clamped_micros(now - committed));
  if (!cfg.receipts.empty() && s.index == 0) {
    s.receipts.push_back({end_lsn, s.txn_first_ts, now, sent, committed});
  }
}

void on_message(Stream& s, const Settings& cfg, const pgoutput::Message& m, std::int64_t now,
                std::int64_t sent) {
  ++s.messages;
  if (const auto* b = std::get_if<pgoutput::Begin>(&m)) {
    (void)b;
    if (s.in_txn) fail(s.where() + ": Begin inside a transaction");
    s.in_txn = true;
    s.changes_in_txn = 0;
  } else if (const auto* start = std::get_if<pgoutput::StreamStart>(&m)) {
    // One streamed transaction at a time in these workloads: its blocks stand for Begin.
    if (start->first_segment) {
      if (s.in_txn) fail(s.where() + ": a first Stream Start inside a transaction");
      s.in_txn = true;
      s.changes_in_txn = 0;
    } else if (!s.in_txn) {
      fail(s.where() + ": a later Stream Start of a transaction never started");
    }
  } else if (std::holds_alternative<pgoutput::StreamAbort>(m)) {
    fail(s.where() + ": Stream Abort (the workload's transactions all commit)");
  } else if (const auto* sc = std::get_if<pgoutput::StreamCommit>(&m)) {
    if (!s.in_txn) fail(s.where() + ": Stream Commit of a transaction never started");
    on_commit(s, cfg, sc->end_lsn, now, sent, wire::pg_to_unix_micros(sc->commit_time));
  } else if (const auto* c = std::get_if<pgoutput::Commit>(&m)) {
    if (!s.in_txn) fail(s.where() + ": Commit without Begin");
    on_commit(s, cfg, c->end_lsn, now, sent, wire::pg_to_unix_micros(c->commit_time));
  } else if (const auto* r = std::get_if<pgoutput::Relation>(&m)) {
    RelationColumns rc;
    // The table, or one of its partitions when the benchmark partitions it (bench_p0, ...).
    rc.is_bench =
        r->name == "bench" || (r->name.size() > 7 && r->name.compare(0, 7, "bench_p") == 0 &&
                               r->name.find_first_not_of("0123456789", 7) == std::string::npos);
    for (std::size_t i = 0; i < r->columns.size(); ++i) {
      const std::string& n = r->columns[i].name;
      if (n == "id") rc.id = static_cast<int>(i);
      if (n == "ts_us") rc.ts_us = static_cast<int>(i);
      if (n == "payload") rc.payload = static_cast<int>(i);
    }
    if (rc.is_bench && (rc.id < 0 || rc.ts_us < 0 || rc.payload < 0)) {
      fail(s.where() + ": Relation bench lacks id, ts_us or payload");
    }
    s.relations[r->oid] = rc;
  } else if (const auto* ins = std::get_if<pgoutput::Insert>(&m)) {
    on_insert(s, cfg, *ins, now);
  } else if (std::holds_alternative<pgoutput::Truncate>(m)) {
    ++s.truncates;
  } else if (std::holds_alternative<pgoutput::Update>(m) ||
             std::holds_alternative<pgoutput::Delete>(m)) {
    fail(s.where() + ": unexpected " + pgoutput::describe(m) + " (the workload only inserts)");
  } else {
    ++s.other;  // Type, Origin, logical messages: not part of this workload's count
  }
}

// Reads everything buffered on one streaming connection. Its messages arrived together, so
// they share one receipt time: the clock is read once per batch, not once per message.
void drain(Stream& s, const Settings& cfg) {
  if (PQconsumeInput(s.conn) == 0) fail(s.where() + ": connection lost: " + PQerrorMessage(s.conn));
  const std::int64_t now = now_unix_us();
  const std::int64_t inserts_before = s.inserts;
  for (;;) {
    char* buf = nullptr;
    int n = PQgetCopyData(s.conn, &buf, 1);
    if (n == 0) break;
    if (n == -1) {
      PGresult* res = PQgetResult(s.conn);
      std::string msg = res ? PQresultErrorMessage(res) : "";
      if (res) PQclear(res);
      fail(s.where() + ": server ended the stream after " + std::to_string(s.inserts) + " of " +
           std::to_string(cfg.expect) + " inserts" + (msg.empty() ? "" : ": " + msg));
    }
    if (n < 0) fail(s.where() + ": stream error: " + PQerrorMessage(s.conn));
    ByteView payload(reinterpret_cast<const std::uint8_t*>(buf), static_cast<std::size_t>(n));
    if (!payload.empty() && payload[0] == wire::XLogData::kType) {
      auto x = wire::view_xlog_data(payload);
      if (!x.ok()) fail(s.where() + ": bad XLogData: " + x.error().message);
      auto msg = s.decoder.decode(x->data);
      PQfreemem(buf);
      if (!msg.ok()) fail(s.where() + ": pgoutput decode error: " + msg.error().to_string());
      on_message(s, cfg, *msg, now, wire::pg_to_unix_micros(x->send_time));
      if (s.inserts == cfg.expect && !s.in_txn) {
        s.state = State::kDone;
        break;
      }
      continue;
    }
    auto frame = wire::parse_from_server(payload);
    PQfreemem(buf);
    if (!frame.ok()) fail(s.where() + ": bad replication frame: " + frame.error().message);
    if (auto* k = std::get_if<wire::PrimaryKeepalive>(&*frame)) {
      if (k->reply_requested) send_status(s);
    }
  }
  if (s.inserts > inserts_before) s.last_progress = steady_seconds();
}

std::string quoted_ident(const std::string& name) {
  std::string q = "\"";
  for (char ch : name) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

void touch(const std::string& path) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << "ready\n";
}

bool exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

// Shared by the reading threads: the ready-file is written once every stream is running.
struct StartGate {
  std::atomic<int> starting{0};
  std::atomic<bool> ready{false};
};

struct GroupTimes {
  double first = 0;  // first insert received
  double last = 0;   // last insert received, or the commit that completed its transaction
};

// Reads one share of the streams in one poll() loop until each has delivered --expect inserts.
GroupTimes read_streams(const std::vector<Stream*>& streams, const Settings& cfg, StartGate& gate,
                        double t_start) {
  GroupTimes times;
  bool saw_ready = false;
  std::size_t done = 0;
  std::vector<pollfd> fds(streams.size());
  while (done < streams.size()) {
    for (std::size_t i = 0; i < streams.size(); ++i) {
      fds[i] = pollfd{PQsocket(streams[i]->conn), POLLIN, 0};
      if (streams[i]->state == State::kDone) fds[i].fd = -1;
    }
    int pr = poll(fds.data(), fds.size(), 100);
    if (pr < 0 && errno != EINTR) fail(std::string("poll: ") + std::strerror(errno));
    const double now = steady_seconds();
    for (std::size_t i = 0; i < streams.size(); ++i) {
      Stream& s = *streams[i];
      if (s.state == State::kDone) continue;
      if (s.state == State::kStarting && (fds[i].revents != 0)) {
        if (PQconsumeInput(s.conn) == 0) fail(s.where() + ": " + PQerrorMessage(s.conn));
        if (!PQisBusy(s.conn)) {
          PGresult* res = PQgetResult(s.conn);
          if (PQresultStatus(res) != PGRES_COPY_BOTH) {
            fail(s.where() + ": START_REPLICATION failed: " + PQresultErrorMessage(res));
          }
          PQclear(res);
          s.state = State::kStreaming;
          --gate.starting;
        }
      }
      if (s.state == State::kStreaming && fds[i].revents != 0) {
        const std::int64_t before = s.inserts, transactions_before = s.transactions;
        drain(s, cfg);
        if (s.inserts > before && times.first == 0) times.first = now;
        // The last change counts once its transaction is complete: a streamed one's rows
        // arrive before its commit, and the Stream Commit is what makes them usable.
        if (s.inserts > before || s.transactions > transactions_before) {
          times.last = steady_seconds();
        }
        if (s.state == State::kDone) ++done;
      }
      if (s.state == State::kStreaming && now - s.last_reply > 1.0) send_status(s);
      if (now - s.last_progress > cfg.stall_seconds) {
        fail(s.where() + ": stalled: no insert for " + std::to_string(cfg.stall_seconds) +
             " s; received " + std::to_string(s.inserts) + " of " + std::to_string(cfg.expect) +
             " inserts in " + std::to_string(s.transactions) + " transactions (state " +
             (s.state == State::kStarting ? "starting" : "streaming") + ")");
      }
    }
    // Live runs: the driver starts the workload once every stream is running.
    if (gate.starting == 0 && !gate.ready.exchange(true)) touch(cfg.ready_file);
    if (gate.ready && !saw_ready) {
      saw_ready = true;
      for (Stream* s : streams) s->last_progress = steady_seconds();
    }
    if (now - t_start > cfg.timeout_seconds)
      fail("timed out after " + std::to_string(now - t_start) + " s");
  }
  return times;
}

void write_receipts(const std::string& path, const Stream& s) {
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) fail("cannot create " + path + ": " + std::strerror(errno));
  for (const auto& r : s.receipts) {
    std::fprintf(out, "%s %lld %lld %lld %lld\n", r.end_lsn.to_string().c_str(),
                 static_cast<long long>(r.first_ts), static_cast<long long>(r.received),
                 static_cast<long long>(r.sent), static_cast<long long>(r.committed));
  }
  if (std::fclose(out) != 0) fail("cannot write " + path + ": " + std::strerror(errno));
}

double percentile(const std::vector<std::int32_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  std::size_t rank = static_cast<std::size_t>(p / 100.0 * static_cast<double>(sorted.size()));
  if (rank >= sorted.size()) rank = sorted.size() - 1;
  return sorted[rank] / 1000.0;
}

bool parse_args(int argc, char** argv, Settings& s) {
  std::int64_t payload_length = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--conninfo")
      s.conninfo = next();
    else if (a == "--consumers")
      s.consumers = std::atoi(next().c_str());
    else if (a == "--slot-prefix")
      s.slot_prefix = next();
    else if (a == "--publication")
      s.publication = next();
    else if (a == "--proto")
      s.proto = std::atoi(next().c_str());
    else if (a == "--expect")
      s.expect = std::atoll(next().c_str());
    else if (a == "--ready-file")
      s.ready_file = next();
    else if (a == "--wait-file")
      s.wait_file = next();
    else if (a == "--receipts")
      s.receipts = next();
    else if (a == "--stall-seconds")
      s.stall_seconds = std::atof(next().c_str());
    else if (a == "--timeout-seconds")
      s.timeout_seconds = std::atof(next().c_str());
    else if (a == "--threads")
      s.threads = std::atoi(next().c_str());
    else if (a == "--payload")
      s.payload = next();
    else if (a == "--payload-length")
      payload_length = std::atoll(next().c_str());
    else if (a == "--payload-any")
      s.payload_length_only = true;
    else if (a == "--streaming")
      s.streaming = true;
    else if (a == "--rows-per-transaction")
      s.rows_per_transaction = std::atoll(next().c_str());
    else if (a == "--cpu-pid") {
      std::string v = next();
      auto eq = v.find('=');
      if (eq == std::string::npos) return false;
      s.cpu_pids.emplace_back(v.substr(0, eq), std::atoi(v.c_str() + eq + 1));
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return false;
    }
  }
  if (payload_length > 0 && !s.payload.empty()) {
    std::string unit = s.payload;
    s.payload.clear();
    while (static_cast<std::int64_t>(s.payload.size()) < payload_length) s.payload += unit;
    s.payload.resize(static_cast<std::size_t>(payload_length));
  }
  if (s.rows_per_transaction < 1) return false;
  if (s.streaming && s.proto < 2) s.proto = 2;  // the first version that streams
  return !s.conninfo.empty() && s.expect > 0 && s.consumers > 0 && s.proto >= 1 && s.proto <= 4;
}

}  // namespace

int main(int argc, char** argv) {
  Settings cfg;
  if (!parse_args(argc, argv, cfg)) {
    std::fprintf(stderr,
                 "usage: bench_repl_consumer --conninfo STR --expect N [--consumers M] "
                 "[--slot-prefix P] [--publication NAME] [--proto V] [--ready-file F] "
                 "[--wait-file F] [--cpu-pid LABEL=PID]... [--stall-seconds S] "
                 "[--timeout-seconds S] [--payload TEXT] [--payload-length L] "
                 "[--rows-per-transaction N] [--threads T] [--streaming] [--receipts F]\n");
    return 2;
  }
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < cfg.consumers; ++i) {
    auto s = std::make_unique<Stream>();
    s->index = i;
    s->slot = cfg.slot_prefix + "_" + std::to_string(i);
    s->decoder = pgoutput::Decoder(pgoutput::DecoderOptions{cfg.proto, false});
    s->seen.assign(static_cast<std::size_t>(cfg.expect) + 1, 0);
    s->latency_us.reserve(static_cast<std::size_t>(cfg.expect));
    s->commit_latency_us.reserve(static_cast<std::size_t>(cfg.expect));
    s->conn = PQconnectdb((cfg.conninfo + " replication=database").c_str());
    if (PQstatus(s->conn) != CONNECTION_OK) {
      fail(s->where() + ": connect failed: " + PQerrorMessage(s->conn));
    }
    std::string create = "CREATE_REPLICATION_SLOT " + quoted_ident(s->slot) +
                         " TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT";
    PGresult* res = PQexec(s->conn, create.c_str());
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      fail(s->where() + ": " + create + " failed: " + PQresultErrorMessage(res));
    }
    PQclear(res);
    streams.push_back(std::move(s));
  }

  // Catch-up runs: slots exist, the driver now writes the backlog and then creates the go-file.
  if (!cfg.wait_file.empty()) {
    touch(cfg.ready_file);
    double deadline = steady_seconds() + cfg.timeout_seconds;
    while (!exists(cfg.wait_file)) {
      if (steady_seconds() > deadline) fail("timed out waiting for " + cfg.wait_file);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::map<std::string, double> cpu_before;
  for (const auto& [label, pid] : cfg.cpu_pids) cpu_before[label] = tree_cpu_seconds(pid);
  const double self_before = self_cpu_seconds();
  const double t_start = steady_seconds();
  const double unix_start = static_cast<double>(now_unix_us()) / 1e6;
  for (auto& s : streams) {
    std::string start = "START_REPLICATION SLOT " + quoted_ident(s->slot) +
                        " LOGICAL 0/0 (proto_version '" + std::to_string(cfg.proto) +
                        "', publication_names " + "'" + quoted_ident(cfg.publication) + "'" +
                        (cfg.streaming ? ", streaming 'on')" : ")");
    if (PQsetnonblocking(s->conn, 1) != 0 || PQsendQuery(s->conn, start.c_str()) != 1) {
      fail(s->where() + ": START_REPLICATION could not be sent: " + PQerrorMessage(s->conn));
    }
    s->state = State::kStarting;
    s->last_progress = t_start;
    s->last_reply = t_start;
  }

  // Streams are read by up to --threads threads, each polling its own share: 32 consumers are
  // 32 processes in a real deployment, and one thread decoding them all would measure itself.
  StartGate gate;
  gate.starting = static_cast<int>(streams.size());
  gate.ready = !cfg.wait_file.empty();  // catch-up runs wrote their ready-file already
  const int threads = std::max(1, std::min(cfg.threads, static_cast<int>(streams.size())));
  std::vector<std::vector<Stream*>> groups(static_cast<std::size_t>(threads));
  for (std::size_t i = 0; i < streams.size(); ++i) {
    groups[i % groups.size()].push_back(streams[i].get());
  }
  std::vector<GroupTimes> times(groups.size());
  std::vector<std::thread> readers;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    readers.emplace_back([&, g] { times[g] = read_streams(groups[g], cfg, gate, t_start); });
  }
  for (auto& t : readers) t.join();
  double t_first = 0, t_last = 0;
  for (const GroupTimes& t : times) {
    if (t.first != 0 && (t_first == 0 || t.first < t_first)) t_first = t.first;
    t_last = std::max(t_last, t.last);
  }
  const double t_end = t_last;
  std::map<std::string, double> cpu_used;
  for (const auto& [label, pid] : cfg.cpu_pids)
    cpu_used[label] = tree_cpu_seconds(pid) - cpu_before[label];
  const double self_used = self_cpu_seconds() - self_before;

  // Every stream must have delivered the same transactions in the same order.
  for (const auto& s : streams) {
    if (s->digest != streams[0]->digest) {
      fail(s->where() + " received the ids in another order than " + streams[0]->where());
    }
  }
  std::vector<std::int32_t> lat, commit_lat;
  std::int64_t total = 0, txns = 0;
  for (const auto& s : streams) {
    lat.insert(lat.end(), s->latency_us.begin(), s->latency_us.end());
    commit_lat.insert(commit_lat.end(), s->commit_latency_us.begin(), s->commit_latency_us.end());
    total += s->inserts;
    txns += s->transactions;
  }
  std::sort(lat.begin(), lat.end());
  std::sort(commit_lat.begin(), commit_lat.end());
  const double catchup_s = t_end - t_start;
  const double live_s = t_end - t_first;
  std::printf(
      "consumers=%d changes=%lld transactions=%lld start_to_last_s=%.3f first_to_last_s=%.3f "
      "changes_per_s=%.0f live_changes_per_s=%.0f lat_p50_ms=%.2f lat_p99_ms=%.2f "
      "lat_max_ms=%.2f lat_commit_p50_ms=%.2f lat_commit_p99_ms=%.2f lat_commit_max_ms=%.2f "
      "consumer_cpu_s=%.2f last_unix_s=%.6f",
      cfg.consumers, static_cast<long long>(total), static_cast<long long>(txns), catchup_s, live_s,
      total / std::max(catchup_s, 1e-9), total / std::max(live_s, 1e-9), percentile(lat, 50),
      percentile(lat, 99), lat.empty() ? 0.0 : lat.back() / 1000.0, percentile(commit_lat, 50),
      percentile(commit_lat, 99), commit_lat.empty() ? 0.0 : commit_lat.back() / 1000.0, self_used,
      unix_start + (t_last - t_start));
  for (const auto& [label, secs] : cpu_used) std::printf(" cpu_%s_s=%.2f", label.c_str(), secs);
  std::printf("\n");
  std::fflush(stdout);
  if (!cfg.receipts.empty()) write_receipts(cfg.receipts, *streams[0]);
  for (auto& s : streams) PQfinish(s->conn);
  return 0;
}
