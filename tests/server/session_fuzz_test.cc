// Mutation fuzzing of the real server's startup, authentication and first session commands.
//
// An interactive client drives the server over loopback while a seeded mutator perturbs what it
// sends. The session code runs on Asio C++20 coroutines that the libFuzzer toolchain (clang 14)
// cannot compile, so this test drives the whole path as the server runs it, under GCC's ASan/UBSan:
// a crash aborts the test. Each iteration plays one valid client conversation (SSL/GSSENC request,
// startup, SCRAM/MD5/cleartext/trust login, queries or replication commands, cancel requests),
// generated interactively because SCRAM nonces are random, and mutates one to three of the
// messages the client sends. The oracles: every ErrorResponse is well formed with a plausible
// SQLSTATE, FATAL is followed by a close, every session ends within kHangLimit once the client
// stops sending, unmutated conversations end exactly as expected, a tampered or wrong credential
// never logs in, and after the run the server is empty and still serves normal clients.
//
// PGRELAY_SESSION_FUZZ_ITERATIONS and PGRELAY_SESSION_FUZZ_SEED override the run's size and
// seed; PGRELAY_SESSION_FUZZ_ONLY=<n> replays iteration n alone and prints its transcript.
#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// md5_auth.h before scram.h (which server_fixture.h includes): its
// StoredPasswordType::kScramVerifier would otherwise shadow wire::kScramSha256 under -Wshadow.
#include "wire/md5_auth.h"

#include "server_fixture.h"
#include "wire/backend_messages.h"
#include "wire/frontend_messages.h"
#include "wire/scram.h"
#include "wire/startup.h"

namespace pgrelay::test {
namespace {

using Clock = std::chrono::steady_clock;
using Rng = std::mt19937_64;

// Every session must be over this long after the client stops sending.
constexpr auto kHangLimit = std::chrono::seconds(5);
// After a mutation the server may rightly wait for bytes that never come: give it this long to
// answer before the client stops sending and watches the session end.
constexpr auto kMutatedPatience = std::chrono::milliseconds(300);
constexpr std::uint64_t kDefaultIterations = 1000;
constexpr std::uint64_t kDefaultSeed = 20240601;
constexpr int kBlockSize = 40;  // iterations sharing one authentication method
constexpr int kSlotNames = 4;

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  return std::strtoull(text, nullptr, 0);
}

std::size_t pick(Rng& rng, std::size_t n) {
  return static_cast<std::size_t>(rng() % n);
}
bool chance(Rng& rng, int percent) {
  return static_cast<int>(rng() % 100) < percent;
}

std::string hex(ByteView bytes, std::size_t limit = 160) {
  std::string out;
  char two[4];
  for (std::size_t i = 0; i < bytes.size() && i < limit; ++i) {
    std::snprintf(two, sizeof two, "%02x", bytes[i]);
    out += two;
  }
  if (bytes.size() > limit) out += "...(" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

Bytes as_bytes(std::string_view text) {
  return Bytes(text.begin(), text.end());
}
std::string as_text(ByteView bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::int32_t read_i32(const std::uint8_t* p) {
  return static_cast<std::int32_t>(std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 |
                                   std::uint32_t{p[2]} << 8 | std::uint32_t{p[3]});
}
void write_u32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 24);
  p[1] = static_cast<std::uint8_t>(v >> 16);
  p[2] = static_cast<std::uint8_t>(v >> 8);
  p[3] = static_cast<std::uint8_t>(v);
}

// ---- The client end of one connection: blocking writes, reads against deadlines ----

struct Incoming {
  enum class Kind { kMessage, kRefusal, kEof, kTimeout, kMalformed } kind = Kind::kEof;
  char tag = 0;
  Bytes body;
};

class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return fd_ >= 0; }

  // False once the server has closed (EPIPE, ECONNRESET): not a failure by itself.
  bool write(ByteView data) {
    std::size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  // Hangs up at once; with `reset`, with an RST instead of a FIN.
  void abort(bool reset) {
    if (reset) {
      linger hard{1, 0};
      ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    }
    ::close(fd_);
    fd_ = -1;
  }

  // One server message. Before any tagged message, a lone 'N' is the answer to an SSL or
  // GSSENC request (pgrelay sends no NoticeResponse before authentication).
  Incoming read(Clock::time_point deadline) {
    Incoming in;
    if (!fill(1, deadline, in)) return in;
    if (!seen_tagged_ && buf_[pos_] == 'N') {
      ++pos_;
      in.kind = Incoming::Kind::kRefusal;
      return in;
    }
    if (!fill(5, deadline, in)) return truncated(in);
    std::int32_t length = read_i32(buf_.data() + pos_ + 1);
    if (length < 4 || length > (1 << 26)) {
      in.kind = Incoming::Kind::kMalformed;
      in.tag = static_cast<char>(buf_[pos_]);
      in.body.assign(buf_.begin() + static_cast<std::ptrdiff_t>(pos_), buf_.end());
      return in;
    }
    if (!fill(1 + static_cast<std::size_t>(length), deadline, in)) return truncated(in);
    in.kind = Incoming::Kind::kMessage;
    in.tag = static_cast<char>(buf_[pos_]);
    auto begin = buf_.begin() + static_cast<std::ptrdiff_t>(pos_ + 5);
    in.body.assign(begin, begin + (length - 4));
    pos_ += 1 + static_cast<std::size_t>(length);
    seen_tagged_ = true;
    return in;
  }

 private:
  // A message cut short by the end of the stream is malformed; by the deadline, a timeout.
  Incoming truncated(Incoming in) {
    if (in.kind == Incoming::Kind::kEof) {
      in.kind = Incoming::Kind::kMalformed;
      in.body.assign(buf_.begin() + static_cast<std::ptrdiff_t>(pos_), buf_.end());
    }
    return in;
  }
  bool fill(std::size_t need, Clock::time_point deadline, Incoming& in) {
    while (buf_.size() - pos_ < need) {
      if (fd_ < 0 || eof_) {
        in.kind = Incoming::Kind::kEof;
        return false;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        in.kind = Incoming::Kind::kTimeout;
        return false;
      }
      pollfd p{fd_, POLLIN, 0};
      int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;  // the deadline check above decides
      std::uint8_t chunk[16384];
      ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {  // orderly close or reset: both end the session
        eof_ = true;
        continue;
      }
      if (pos_ > 65536) {
        buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
        pos_ = 0;
      }
      buf_.insert(buf_.end(), chunk, chunk + n);
    }
    return true;
  }

  int fd_ = -1;
  Bytes buf_;
  std::size_t pos_ = 0;
  bool eof_ = false;
  bool seen_tagged_ = false;
};

// ---- The mutator ----

struct Outgoing {
  Bytes bytes;
  std::vector<std::size_t> cuts;  // write boundaries (tiny writes)
  bool hang_up = false;           // disconnect right after writing
  bool bytes_changed = false;     // false for a change of delivery only
  std::string note;
};

// Messages of other kinds, for "wrong message type at this step".
Bytes stray_message(Rng& rng) {
  switch (pick(rng, 9)) {
    case 0:
      return wire::encode(wire::SSLRequest{});
    case 1: {
      wire::StartupMessage m;
      m.parameters = {{"user", "stray"}, {"database", "postgres"}};
      return wire::encode(m);
    }
    case 2:
      return wire::encode(wire::Query{"SELECT 1"});
    case 3:
      return wire::encode(wire::SASLInitialResponse{"SCRAM-SHA-256", as_bytes("n,,n=,r=abc")});
    case 4:
      return wire::encode(wire::Terminate{});
    case 5:
      return wire::encode(wire::Sync{});
    case 6:
      return wire::encode(wire::PasswordMessage{"relay-secret"});
    case 7:
      return wire::encode(wire::CopyDone{});
    default:
      return wire::encode(wire::CancelRequest{1, 2});
  }
}

Outgoing mutate(const Bytes& valid, bool tagged, Rng& rng) {
  Outgoing out{valid, {}, false, true, {}};
  Bytes& b = out.bytes;
  const std::size_t length_at = tagged ? 1 : 0;
  auto pos = [&](std::size_t n) { return n == 0 ? 0 : pick(rng, n); };
  switch (pick(rng, 12)) {
    case 0: {
      std::size_t at = pos(b.size());
      int bit = static_cast<int>(pick(rng, 8));
      b[at] ^= static_cast<std::uint8_t>(1u << bit);
      out.note = "flip bit " + std::to_string(bit) + " at " + std::to_string(at);
      break;
    }
    case 1: {
      static constexpr std::uint8_t kInteresting[] = {0, 0xff, 0x7f, 0x80, '=', ',', 'p', 'Q'};
      std::size_t at = pos(b.size());
      b[at] = chance(rng, 60) ? kInteresting[pick(rng, std::size(kInteresting))]
                              : static_cast<std::uint8_t>(rng());
      out.note = "set byte at " + std::to_string(at);
      break;
    }
    case 2: {
      std::size_t at = pos(b.size() + 1), n = 1 + pick(rng, 8);
      Bytes junk(n);
      for (auto& c : junk) c = static_cast<std::uint8_t>(chance(rng, 30) ? 0 : rng());
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), junk.begin(), junk.end());
      out.note = "insert " + std::to_string(n) + " at " + std::to_string(at);
      break;
    }
    case 3: {
      std::size_t at = pos(b.size()), n = std::min<std::size_t>(1 + pick(rng, 8), b.size() - at);
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
              b.begin() + static_cast<std::ptrdiff_t>(at + n));
      out.note = "delete " + std::to_string(n) + " at " + std::to_string(at);
      break;
    }
    case 4: {
      if (b.size() < length_at + 4) break;
      std::uint32_t declared = static_cast<std::uint32_t>(read_i32(b.data() + length_at));
      static constexpr std::uint32_t kFixed[] = {0,          3,          4,     0x7fffffff,
                                                 0xffffffff, 0x80000000, 10001, 8};
      std::uint32_t v = 0;
      switch (pick(rng, 4)) {
        case 0:
          v = declared + 1;
          break;
        case 1:
          v = declared - 1;
          break;
        case 2:
          v = declared + static_cast<std::uint32_t>(1 + pick(rng, 2000));
          break;
        default:
          v = kFixed[pick(rng, std::size(kFixed))];
      }
      write_u32(b.data() + length_at, v);
      out.note = "length " + std::to_string(declared) + " -> " + std::to_string(v);
      break;
    }
    case 5: {
      std::size_t keep = pos(b.size());
      b.resize(keep);
      out.hang_up = chance(rng, 50);
      out.note = "truncate to " + std::to_string(keep) + (out.hang_up ? " and hang up" : "");
      break;
    }
    case 6: {
      Bytes copy = b;
      b.insert(b.end(), copy.begin(), copy.end());
      out.note = "duplicate";
      break;
    }
    case 7: {
      static constexpr char kTags[] = {'p', 'Q', 'P', 'B', 'E', 'S', 'X', 'd', 'c',
                                       'f', 'H', 'F', 'D', 'C', 0,   'R', 'N'};
      char tag = kTags[pick(rng, std::size(kTags))];
      if (tagged) {
        b[0] = static_cast<std::uint8_t>(tag);
      } else {
        b.insert(b.begin(), static_cast<std::uint8_t>(tag));
      }
      out.note = std::string("tag ") + std::to_string(static_cast<int>(tag));
      break;
    }
    case 8: {
      for (std::size_t at = 1 + pick(rng, 3); at < b.size(); at += 1 + pick(rng, 3)) {
        out.cuts.push_back(at);
      }
      out.bytes_changed = false;
      out.note = "tiny writes";
      break;
    }
    case 9: {
      std::size_t n = 1 + pick(rng, 32);
      for (std::size_t i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>(rng()));
      out.note = "append " + std::to_string(n) + " junk bytes";
      break;
    }
    case 10: {
      b = stray_message(rng);
      out.note = "replace with another message type";
      break;
    }
    default: {
      // A NUL where a string ends early, or a string that no longer ends.
      std::vector<std::size_t> nuls;
      for (std::size_t i = length_at + 4; i < b.size(); ++i) {
        if (b[i] == 0) nuls.push_back(i);
      }
      if (!nuls.empty() && chance(rng, 50)) {
        std::size_t at = nuls[pick(rng, nuls.size())];
        b[at] = 'x';
        out.note = "unterminate string at " + std::to_string(at);
      } else {
        std::size_t at = pos(b.size());
        b[at] = 0;
        out.note = "NUL at " + std::to_string(at);
      }
    }
  }
  if (b == valid && out.cuts.empty()) out.bytes_changed = false;
  return out;
}

// ---- One fuzzed session ----

enum class Method { kScram, kMd5, kPassword, kTrust, kReject };
const char* method_name(Method m) {
  static constexpr const char* kNames[] = {"scram-sha-256", "md5", "password", "trust", "reject"};
  return kNames[static_cast<int>(m)];
}

struct Account {
  std::string user;
  std::string password;
  bool exists = true;
  bool replication = true;
  bool scram_secret = true;  // else an MD5 hash
};

// What an unmutated conversation must end with.
enum class Expect { kSession, kAuthFailure, kNoReplicationRight, kRefused };

struct Plan {
  bool cancel = false;
  std::optional<wire::BackendKeyData> cancel_key;
  bool ssl_request = false;
  bool gssenc_request = false;
  bool replication = false;
  std::optional<std::string> replication_value;  // replication=true or a bad value: refused
  bool minor_version = false;                    // asks for 3.1: NegotiateProtocolVersion first
  bool protocol_option = false;                  // a "_pq_." option: NegotiateProtocolVersion first
  bool no_initial_response = false;
  Account account;
  std::string password;  // what the client says, maybe wrong
  std::vector<std::pair<std::string, std::string>> extra;
  std::vector<std::string> commands;
  std::vector<int> mutate_at;  // send indexes
  enum class After { kDrain, kContinue, kAbort } after = After::kDrain;
  bool write_after_error = false;
  Expect expect = Expect::kSession;
};

enum class Phase { kStartup, kAuthenticated, kReady };

struct Stats {
  std::uint64_t sessions = 0, logins = 0, ready = 0, streamed = 0, fatal = 0, mutated = 0,
                hang_ups = 0;
};

class FuzzSession {
 public:
  FuzzSession(int port, Plan plan, Rng& rng, Method method)
      : client_(port), plan_(std::move(plan)), rng_(rng), method_(method) {}

  // Runs the conversation; returns the failures found (empty when every oracle held).
  std::vector<std::string> run() {
    if (!client_.connected()) {
      fail("could not connect");
      return failures_;
    }
    play();
    return failures_;
  }
  const std::vector<std::string>& transcript() const { return transcript_; }
  bool logged_in() const { return phase_ != Phase::kStartup; }
  bool mutated() const { return mutated_; }
  bool saw_fatal() const { return saw_fatal_; }
  bool hung_up() const { return hung_up_; }
  bool streamed() const { return streamed_; }
  bool ready() const { return phase_ == Phase::kReady; }
  std::optional<wire::BackendKeyData> key() const { return key_; }

 private:
  void fail(const std::string& what) { failures_.push_back(what); }
  bool failed(const std::string& what) {
    fail(what);
    return false;
  }
  void log(std::string line) { transcript_.push_back(std::move(line)); }

  Clock::time_point read_deadline() const {
    return Clock::now() +
           (mutated_ ? std::chrono::duration_cast<std::chrono::milliseconds>(kMutatedPatience)
                     : std::chrono::duration_cast<std::chrono::milliseconds>(kHangLimit));
  }

  // Sends one client message, mutated when the plan says so. Returns false when the
  // conversation should stop following the script.
  bool send(const std::string& step, const Bytes& valid, bool tagged, bool credential = false) {
    int index = sends_++;
    Outgoing out{valid, {}, false, false, {}};
    if (std::find(plan_.mutate_at.begin(), plan_.mutate_at.end(), index) != plan_.mutate_at.end()) {
      out = mutate(valid, tagged, rng_);
      mutated_ = true;
      if (credential && out.bytes_changed && !same_credential(valid, out.bytes)) {
        credential_tampered_ = true;
      }
    }
    log("send " + step + (out.note.empty() ? "" : " [" + out.note + "]") + ": " + hex(out.bytes));
    bool written = true;
    std::size_t from = 0;
    for (std::size_t cut : out.cuts) {
      written = written && client_.write(ByteView(out.bytes).subspan(from, cut - from));
      from = cut;
    }
    written = written && client_.write(ByteView(out.bytes).subspan(from));
    if (out.hang_up) {
      client_.abort(chance(rng_, 50));
      hung_up_ = true;
      log("hang up");
      return false;
    }
    if (!written) {
      log("write failed (server closed)");
      drain();
      return false;
    }
    if (out.bytes_changed && plan_.after == Plan::After::kAbort) {
      client_.abort(chance(rng_, 50));
      hung_up_ = true;
      log("hang up");
      return false;
    }
    if (out.bytes_changed && plan_.after == Plan::After::kDrain) {
      drain();
      return false;
    }
    return true;
  }

  // The credential the server would read from the first frame of `sent` equals the valid one.
  bool same_credential(const Bytes& valid, const Bytes& sent) const {
    if (sent.size() < 5 || sent[0] != 'p') return false;
    std::int32_t length = read_i32(sent.data() + 1);
    if (length < 4 || static_cast<std::size_t>(length) + 1 > sent.size()) return false;
    Bytes body(sent.begin() + 5, sent.begin() + 1 + length);
    Bytes valid_body(valid.begin() + 5, valid.end());
    if (body == valid_body) return true;
    // SCRAM client-final: the same channel binding, nonce and proof bytes.
    auto a = wire::parse_sasl_response(body), b = wire::parse_sasl_response(valid_body);
    auto password_a = wire::parse_password_message(body);
    auto password_b = wire::parse_password_message(valid_body);
    if (password_a.ok() && password_b.ok() && password_a->password == password_b->password) {
      return true;
    }
    if (!a.ok() || !b.ok()) return false;
    auto attributes = [](const std::string& text) {
      std::vector<std::string> parts;
      std::stringstream in(text);
      for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
      return parts;
    };
    auto pa = attributes(as_text(a->data)), pb = attributes(as_text(b->data));
    if (pa.size() != pb.size() || pa.empty()) return false;
    for (std::size_t i = 0; i + 1 < pa.size(); ++i) {
      if (pa[i] != pb[i]) return false;
    }
    if (pa.back().rfind("p=", 0) != 0) return false;
    auto proof_a = wire::base64_decode(pa.back().substr(2));
    auto proof_b = wire::base64_decode(pb.back().substr(2));
    return proof_a && proof_b && *proof_a == *proof_b;
  }

  // Checks an ErrorResponse; returns whether it is FATAL.
  bool check_error(const Bytes& body) {
    auto error = wire::parse_error_response(body);
    if (!error.ok()) {
      fail("unparsable ErrorResponse: " + hex(body));
      return true;
    }
    auto severity = error->find(wire::error_field::kSeverity);
    auto code = error->find(wire::error_field::kSqlState);
    auto message = error->find(wire::error_field::kMessage);
    if (!severity || !code || !message) {
      fail("ErrorResponse without S, C and M fields: " + hex(body));
      return true;
    }
    std::string sqlstate(*code);
    bool well_formed =
        sqlstate.size() == 5 && std::all_of(sqlstate.begin(), sqlstate.end(), [](char c) {
          return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
        });
    if (!well_formed) fail("malformed SQLSTATE \"" + sqlstate + "\"");
    bool fatal = *severity == "FATAL";
    log("recv E " + std::string(*severity) + " " + sqlstate + " " + std::string(*message));
    if (*severity != "FATAL" && *severity != "ERROR") {
      fail("ErrorResponse with severity " + std::string(*severity));
    }
    std::string klass = sqlstate.substr(0, 2);
    if (phase_ == Phase::kStartup) {
      static const std::vector<std::string> kStartupClasses = {"08", "28", "0A", "22",
                                                               "42", "53", "57", "55"};
      if (std::find(kStartupClasses.begin(), kStartupClasses.end(), klass) ==
          kStartupClasses.end()) {
        fail("SQLSTATE " + sqlstate + " before authentication: " + std::string(*message));
      }
      if (!fatal) fail("non-FATAL error before authentication: " + std::string(*message));
      if (!mutated_ && plan_.expect == Expect::kSession) {
        fail("a valid login failed: " + sqlstate + " " + std::string(*message));
      }
      if (!mutated_ && plan_.expect == Expect::kAuthFailure && klass != "28") {
        fail("a wrong credential gave " + sqlstate + " instead of class 28");
      }
      if (!mutated_ && plan_.expect == Expect::kRefused && klass != "0A" && klass != "22") {
        fail("a refused replication mode gave " + sqlstate + " instead of class 0A or 22");
      }
    } else if (phase_ == Phase::kAuthenticated && klass == "XX") {
      fail("internal error while starting an authenticated session: " + std::string(*message));
    }
    if (phase_ == Phase::kAuthenticated && !mutated_ && plan_.expect == Expect::kSession) {
      fail("a valid session failed to start: " + sqlstate + " " + std::string(*message));
    }
    if (phase_ == Phase::kAuthenticated && plan_.expect == Expect::kNoReplicationRight &&
        !mutated_ && sqlstate != "42501") {
      fail("replication without the right gave " + sqlstate);
    }
    return fatal;
  }

  // After a FATAL: the server must close without another word (bytes written after the error
  // must change nothing).
  void expect_close_after_fatal() {
    saw_fatal_ = true;
    if (plan_.write_after_error) {
      Bytes more = chance(rng_, 50) ? wire::encode(wire::Query{"SELECT 1"}) : stray_message(rng_);
      log("send after error: " + hex(more));
      (void)client_.write(more);
    }
    Incoming next = client_.read(Clock::now() + kHangLimit);
    if (next.kind == Incoming::Kind::kTimeout) {
      fail("connection still open " + std::to_string(kHangLimit.count()) + " s after FATAL");
    } else if (next.kind != Incoming::Kind::kEof) {
      fail("message after FATAL: tag " + std::to_string(static_cast<int>(next.tag)));
    }
  }

  // Stops sending and reads until the server closes, checking what it says.
  void drain() {
    client_.shutdown_write();
    log("shutdown(SHUT_WR)");
    auto deadline = Clock::now() + kHangLimit;
    for (;;) {
      Incoming in = client_.read(deadline);
      switch (in.kind) {
        case Incoming::Kind::kEof:
          return;
        case Incoming::Kind::kTimeout:
          fail("session did not end within " + std::to_string(kHangLimit.count()) +
               " s of the client's EOF (phase " + std::to_string(static_cast<int>(phase_)) + ")");
          return;
        case Incoming::Kind::kMalformed:
          fail("malformed server frame: " + hex(in.body));
          return;
        case Incoming::Kind::kRefusal:
          log("recv N (refusal)");
          continue;
        case Incoming::Kind::kMessage:
          if (!observe(in)) return;
      }
    }
  }

  // Follows the server's state from one message. Returns false once the session is over.
  bool observe(const Incoming& in) {
    switch (in.tag) {
      case 'E':
        if (check_error(in.body)) {
          expect_close_after_fatal();
          return false;
        }
        return true;
      case 'R': {
        auto auth = wire::parse_authentication(in.body);
        if (!auth.ok()) {
          fail("unparsable Authentication message: " + hex(in.body));
          return false;
        }
        if (phase_ != Phase::kStartup) fail("Authentication message after login");
        if (std::holds_alternative<wire::AuthenticationOk>(*auth)) on_login();
        log("recv R " + std::to_string(read_i32(in.body.data())));
        return true;
      }
      case 'v':
      case 'S':
      case 'K':
      case 'Z':
        if (in.tag != 'v' && phase_ == Phase::kStartup)
          fail(std::string("'") + in.tag + "' before login");
        if (in.tag == 'Z') phase_ = Phase::kReady;
        return true;
      default:
        if (phase_ == Phase::kStartup) {
          fail("unexpected message before login: tag " + std::to_string(static_cast<int>(in.tag)));
          return false;
        }
        return true;
    }
  }

  void on_login() {
    phase_ = Phase::kAuthenticated;
    if (plan_.expect == Expect::kAuthFailure || plan_.expect == Expect::kRefused) {
      fail("logged in with a wrong password or unknown user");
    }
    if (method_ == Method::kReject) fail("logged in although the rules reject");
    if (credential_tampered_) fail("logged in with a tampered credential");
  }

  // Reads the next message for the script; false when the script cannot go on (the session
  // ended, or the server waits for something the mutated client never sends).
  bool next(Incoming& in) {
    in = client_.read(read_deadline());
    switch (in.kind) {
      case Incoming::Kind::kMessage:
        return true;
      case Incoming::Kind::kRefusal:
        log("recv N (refusal)");
        return true;
      case Incoming::Kind::kEof:
        log("recv EOF");
        if (!mutated_ && !saw_fatal_) fail("server closed an unmutated conversation silently");
        return false;
      case Incoming::Kind::kMalformed:
        fail("malformed server frame: " + hex(in.body));
        return false;
      case Incoming::Kind::kTimeout:
        if (!mutated_) {
          fail("no answer within " + std::to_string(kHangLimit.count()) +
               " s to an unmutated message");
          return false;
        }
        log("no answer yet");
        drain();
        return false;
    }
    return false;
  }

  void play() {
    if (plan_.cancel) {
      wire::CancelRequest request;
      if (plan_.cancel_key) request = {plan_.cancel_key->pid, plan_.cancel_key->secret_key};
      if (!send("CancelRequest", wire::encode(request), false)) return;
      drain();
      return;
    }
    for (bool gssenc : {true, false}) {
      if (!(gssenc ? plan_.gssenc_request : plan_.ssl_request)) continue;
      Bytes request =
          gssenc ? wire::encode(wire::GSSENCRequest{}) : wire::encode(wire::SSLRequest{});
      if (!send(gssenc ? "GSSENCRequest" : "SSLRequest", request, false)) return;
      Incoming in;
      if (!next(in)) return;
      if (in.kind != Incoming::Kind::kRefusal) {
        if (!mutated_) fail("no 'N' answer to an encryption request");
        if (observe(in)) drain();
        return;
      }
    }
    wire::StartupMessage startup;
    startup.parameters = {{"user", plan_.account.user}, {"database", "postgres"}};
    if (plan_.replication) startup.parameters.emplace_back("replication", "database");
    if (plan_.replication_value)
      startup.parameters.emplace_back("replication", *plan_.replication_value);
    if (plan_.minor_version) startup.version.minor = 1;
    for (const auto& p : plan_.extra) startup.parameters.push_back(p);
    if (!send("StartupMessage", wire::encode(startup), false)) return;
    if (!authenticate()) return;
    if (!run_commands()) return;
    (void)send("Terminate", wire::encode(wire::Terminate{}), true);
    if (!hung_up_) drain();
  }

  // Answers whatever the server asks until the first ReadyForQuery; false if it never comes.
  bool authenticate() {
    std::optional<wire::ScramClient> scram;
    std::string client_first;
    bool final_sent_intact = false;
    for (;;) {
      Incoming in;
      if (!next(in)) return false;
      if (in.kind == Incoming::Kind::kRefusal) {
        if (!mutated_) fail("'N' byte after StartupMessage");
        continue;  // a mutated StartupMessage can become an SSLRequest
      }
      if (!observe(in)) return false;
      if (in.tag == 'Z') return true;
      if (in.tag == 'K') {
        auto key = wire::parse_backend_key_data(in.body);
        if (key.ok()) key_ = *key;
      }
      if (in.tag != 'R') continue;
      auto auth = *wire::parse_authentication(in.body);
      if (auto* sasl = std::get_if<wire::AuthenticationSASL>(&auth)) {
        if (std::find(sasl->mechanisms.begin(), sasl->mechanisms.end(), wire::kScramSha256) ==
            sasl->mechanisms.end()) {
          fail("SCRAM-SHA-256 not offered");
        }
        scram.emplace(plan_.password);
        auto first = scram->client_first();
        if (!first.ok()) return failed("client_first: " + first.error().message);
        client_first = *first;
        wire::SASLInitialResponse initial{std::string(scram->mechanism()), as_bytes(*first)};
        if (plan_.no_initial_response) initial.data.reset();
        if (!send("SASLInitialResponse", wire::encode(initial), true)) return false;
      } else if (auto* more = std::get_if<wire::AuthenticationSASLContinue>(&auth)) {
        if (!scram) return failed("SASLContinue without SASL");
        if (more->data.empty()) {
          if (!send("SASLResponse(first)", wire::encode(wire::SASLResponse{as_bytes(client_first)}),
                    true)) {
            return false;
          }
          continue;
        }
        auto final_message = scram->handle_server_first(as_text(more->data));
        if (!final_message.ok()) {
          if (!mutated_) fail("bad server-first-message: " + final_message.error().message);
          drain();
          return false;
        }
        bool was_mutated = mutated_;
        if (!send("SASLResponse(final)", wire::encode(wire::SASLResponse{as_bytes(*final_message)}),
                  true, true)) {
          return false;
        }
        final_sent_intact = !was_mutated && !credential_tampered_;
      } else if (auto* done = std::get_if<wire::AuthenticationSASLFinal>(&auth)) {
        if (credential_tampered_) fail("AuthenticationSASLFinal for a tampered proof");
        if (!scram) return failed("SASLFinal without SASL");
        auto verified = scram->handle_server_final(as_text(done->data));
        if (final_sent_intact && !verified.ok()) {
          fail("server signature rejected: " + verified.error().message);
        }
      } else if (auto* md5 = std::get_if<wire::AuthenticationMD5Password>(&auth)) {
        std::string response =
            wire::md5_client_response(plan_.account.user, plan_.password, md5->salt);
        if (!send("md5 PasswordMessage", wire::encode(wire::PasswordMessage{response}), true,
                  true)) {
          return false;
        }
      } else if (std::holds_alternative<wire::AuthenticationCleartextPassword>(auth)) {
        if (!send("PasswordMessage", wire::encode(wire::PasswordMessage{plan_.password}), true,
                  true)) {
          return false;
        }
      }
    }
  }

  // Sends each command and reads its reply up to ReadyForQuery; false once the session is over.
  bool run_commands() {
    if (!mutated_ && plan_.expect != Expect::kSession) {
      fail("session started although it should not have");
    }
    for (const auto& command : plan_.commands) {
      if (!send("Query " + command, wire::encode(wire::Query{command}), true)) return false;
      bool done = false;
      while (!done) {
        Incoming in;
        if (!next(in)) return false;
        if (!observe(in)) return false;
        if (in.tag == 'E' && !mutated_ && !command.starts_with("CREATE_REPLICATION_SLOT") &&
            !command.starts_with("DROP_REPLICATION_SLOT") && !command.starts_with("START_")) {
          fail("valid command failed: " + command);
        }
        if (in.tag == 'Z') done = true;
        if (in.tag == 'W') {
          streamed_ = true;
          // Streaming: report a position, then end the stream as a client does.
          Bytes status(34, 0);
          status[0] = 'r';
          Bytes frame = wire::encode(wire::CopyData{status});
          if (!send("standby status", frame, true)) return false;
          if (!send("CopyDone", wire::encode(wire::CopyDone{}), true)) return false;
        }
      }
    }
    return true;
  }

  RawClient client_;
  Plan plan_;
  Rng& rng_;
  Method method_;
  int sends_ = 0;
  bool mutated_ = false;
  bool credential_tampered_ = false;
  bool saw_fatal_ = false;
  bool hung_up_ = false;
  bool streamed_ = false;
  Phase phase_ = Phase::kStartup;
  std::optional<wire::BackendKeyData> key_;
  std::vector<std::string> failures_;
  std::vector<std::string> transcript_;
};

// ---- Seeds: valid conversations ----

Plan make_plan(Rng& rng, Method method, const std::vector<Account>& accounts,
               const std::optional<wire::BackendKeyData>& last_key) {
  Plan plan;
  if (chance(rng, 6)) {
    plan.cancel = true;
    if (last_key && chance(rng, 70)) plan.cancel_key = last_key;
    plan.mutate_at = {0};
    if (chance(rng, 30)) plan.mutate_at.clear();
    plan.after = Plan::After::kDrain;
    return plan;
  }
  plan.ssl_request = chance(rng, 40);
  plan.gssenc_request = chance(rng, 15);
  plan.replication = chance(rng, 40);
  plan.account = accounts[pick(rng, accounts.size())];
  plan.password = plan.account.password;
  if (chance(rng, 12)) plan.password = "not-the-password";
  plan.no_initial_response = chance(rng, 5);
  if (chance(rng, 60))
    plan.extra.emplace_back("application_name", "fuzz-" + std::to_string(rng() % 1000));
  if (chance(rng, 15)) plan.extra.emplace_back("options", "-c statement_timeout=5000");
  if (chance(rng, 10)) plan.extra.emplace_back("client_encoding", "UTF8");
  plan.minor_version = chance(rng, 5);
  if (!plan.replication && chance(rng, 4)) {
    static const char* kRefusedValues[] = {"true", "on", "1", "bogus", "datab"};
    plan.replication_value = kRefusedValues[pick(rng, 5)];
  }
  if (chance(rng, 5)) {
    plan.protocol_option = true;
    plan.extra.emplace_back("_pq_.fuzz_option", "on");
  }

  // As in Postgres, an MD5 secret cannot answer SCRAM.
  bool credentials_ok = plan.account.exists && plan.password == plan.account.password &&
                        (method != Method::kScram || plan.account.scram_secret);
  if (method == Method::kTrust) credentials_ok = plan.account.exists;
  if (method == Method::kReject || !credentials_ok) {
    plan.expect = Expect::kAuthFailure;
  } else if (plan.replication && !plan.account.replication) {
    plan.expect = Expect::kNoReplicationRight;
  }
  if (plan.replication_value) plan.expect = Expect::kRefused;

  if (plan.replication) {
    std::string slot = "fz_slot_" + std::to_string(pick(rng, kSlotNames));
    static const char* kCreate[] = {" LOGICAL pgoutput", " LOGICAL pgoutput NOEXPORT_SNAPSHOT",
                                    " TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing')",
                                    " LOGICAL pgoutput (SNAPSHOT 'nothing')"};
    plan.commands.push_back("IDENTIFY_SYSTEM");
    if (chance(rng, 50)) plan.commands.push_back("SHOW wal_sender_timeout");
    if (chance(rng, 70)) {
      plan.commands.push_back("CREATE_REPLICATION_SLOT \"" + slot + "\"" + kCreate[pick(rng, 4)]);
    }
    if (chance(rng, 60)) {
      plan.commands.push_back("START_REPLICATION SLOT \"" + slot +
                              "\" LOGICAL 0/0 (proto_version '1', publication_names 'fz_pub')");
    }
    if (chance(rng, 50)) plan.commands.push_back("DROP_REPLICATION_SLOT \"" + slot + "\"");
  } else {
    static const char* kQueries[] = {"SELECT 1", "SELECT current_user, 'x' || 'y'",
                                     "SHOW server_version", "SELECT count(*) FROM pg_class",
                                     "BEGIN; SELECT 2; COMMIT"};
    for (std::size_t n = pick(rng, 3); n > 0; --n) plan.commands.push_back(kQueries[pick(rng, 5)]);
  }

  // Up to three mutated sends among the first ones (startup and authentication get most).
  int sends = 2 + static_cast<int>(plan.ssl_request) + static_cast<int>(plan.gssenc_request) + 2 +
              static_cast<int>(plan.commands.size());
  if (!chance(rng, 10)) {
    int count = 1 + static_cast<int>(pick(rng, 3) == 0) + static_cast<int>(pick(rng, 6) == 0);
    for (int i = 0; i < count; ++i)
      plan.mutate_at.push_back(static_cast<int>(pick(rng, static_cast<std::size_t>(sends))));
  }
  int after = static_cast<int>(pick(rng, 10));
  plan.after = after < 5   ? Plan::After::kDrain
               : after < 9 ? Plan::After::kContinue
                           : Plan::After::kAbort;
  plan.write_after_error = chance(rng, 30);
  return plan;
}

Method method_for_block(std::uint64_t seed, std::uint64_t block) {
  if (block == 0) return Method::kScram;
  Rng rng(seed * 1000003 + block);
  auto r = pick(rng, 100);
  if (r < 55) return Method::kScram;
  if (r < 70) return Method::kMd5;
  if (r < 85) return Method::kPassword;
  if (r < 93) return Method::kTrust;
  return Method::kReject;
}

void set_method(RelayHarness& relay, Method method) {
  auto& rules = relay.context().auth.rules;
  rules.clear();
  if (method == Method::kScram) return;
  server::AuthMethod server_method = *server::parse_auth_method(method_name(method));
  rules.push_back({*server::parse_auth_network("all"), server_method});
}

bool wait_for_no_sessions(RelayHarness& relay, std::chrono::seconds limit) {
  auto deadline = Clock::now() + limit;
  while (relay.session_count() != 0) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// PGRELAY_SESSION_FUZZ_POOL=1: pass-through backends are kept between sessions
// (--pool-idle-timeout), so that sessions, mutated or not, also start on kept backends.
bool pooled() {
  return env_u64("PGRELAY_SESSION_FUZZ_POOL", 0) != 0;
}

class SessionFuzzTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    PgServerOptions options;
    options.settings["wal_level"] = "replica";
    pg_ = new PgServer(options);
    RelayOptions relay_options;
    relay_options.replication = true;
    if (pooled()) {
      relay_options.pool_idle_timeout = std::chrono::seconds(60);
    }
    relay_ = new RelayHarness(*pg_, relay_options);
    pg_->exec(
        "CREATE TABLE IF NOT EXISTS fz_t (id int primary key); CREATE PUBLICATION fz_pub "
        "FOR TABLE fz_t; GRANT SELECT ON fz_t TO app");
    // A user whose stored secret is an MD5 hash, so the md5 method really runs MD5, and
    // who may not open replication connections. Added before any session exists.
    relay_->context().auth.users.push_back(
        {"md5user", wire::md5_password_hash("md5user", "md5-Secret"), false});
  }
  static void TearDownTestSuite() {
    delete relay_;
    delete pg_;
  }
  static PgServer* pg_;
  static RelayHarness* relay_;
};
PgServer* SessionFuzzTest::pg_ = nullptr;
RelayHarness* SessionFuzzTest::relay_ = nullptr;

TEST_F(SessionFuzzTest, MutatedConversationsNeverCrashHangOrLeak) {
  const std::uint64_t seed = env_u64("PGRELAY_SESSION_FUZZ_SEED", kDefaultSeed);
  const std::uint64_t iterations = env_u64("PGRELAY_SESSION_FUZZ_ITERATIONS", kDefaultIterations);
  const char* only_text = std::getenv("PGRELAY_SESSION_FUZZ_ONLY");
  const std::optional<std::uint64_t> only =
      only_text && *only_text ? std::optional(std::strtoull(only_text, nullptr, 0)) : std::nullopt;
  std::printf(
      "session fuzz: seed %llu, %llu iterations (PGRELAY_SESSION_FUZZ_SEED, "
      "PGRELAY_SESSION_FUZZ_ITERATIONS)\n",
      static_cast<unsigned long long>(seed), static_cast<unsigned long long>(iterations));

  const std::vector<Account> accounts = {
      {"app", "relay-secret", true, true},
      {"app", "relay-secret", true, true},
      {"md5user", "md5-Secret", true, false, false},
      {"ghost", "whatever", false, true},
  };
  std::vector<std::string> failures;
  Stats stats;
  std::optional<wire::BackendKeyData> last_key;
  std::optional<Method> current;
  auto start = Clock::now();
  for (std::uint64_t i = only.value_or(0); i < (only ? *only + 1 : iterations); ++i) {
    Method method = method_for_block(seed, i / kBlockSize);
    if (method != current) {
      // Rules change only while no session runs (the server reads them without a lock).
      if (!wait_for_no_sessions(*relay_, kHangLimit)) {
        failures.push_back("sessions left behind before iteration " + std::to_string(i) + ": " +
                           std::to_string(relay_->session_count()));
        break;
      }
      set_method(*relay_, method);
      current = method;
    }
    Rng rng(seed ^ (0x9E3779B97F4A7C15ULL * (i + 1)));
    Plan plan = make_plan(rng, method, accounts, last_key);
    FuzzSession session(relay_->port(), std::move(plan), rng, method);
    std::vector<std::string> found = session.run();
    ++stats.sessions;
    stats.logins += session.logged_in();
    stats.ready += session.ready();
    stats.streamed += session.streamed();
    stats.fatal += session.saw_fatal();
    stats.mutated += session.mutated();
    stats.hang_ups += session.hung_up();
    if (session.key()) last_key = session.key();
    if (!found.empty() || only) {
      std::ostringstream report;
      report << "iteration " << i << " (seed " << seed << ", method " << method_name(method)
             << "):";
      for (const auto& f : found) report << "\n  FAILED: " << f;
      for (const auto& line : session.transcript()) report << "\n    " << line;
      if (found.empty()) {
        std::printf("%s\n", report.str().c_str());
      } else {
        failures.push_back(report.str());
      }
      if (failures.size() >= 10) break;
    }
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "session fuzz: %llu sessions in %.1f s (%.1f/s): %llu mutated, %llu logged in, "
      "%llu ready for queries, %llu streamed, %llu ended by FATAL, %llu hung up by the client\n",
      static_cast<unsigned long long>(stats.sessions), seconds,
      static_cast<double>(stats.sessions) / seconds, static_cast<unsigned long long>(stats.mutated),
      static_cast<unsigned long long>(stats.logins), static_cast<unsigned long long>(stats.ready),
      static_cast<unsigned long long>(stats.streamed), static_cast<unsigned long long>(stats.fatal),
      static_cast<unsigned long long>(stats.hang_ups));
  for (const auto& f : failures) ADD_FAILURE() << f;
  if (!only) {
    EXPECT_GT(stats.logins, stats.sessions / 10) << "the seeds hardly ever log in";
    EXPECT_GT(stats.fatal, stats.sessions / 10) << "the mutations hardly ever cause an error";
    EXPECT_GT(stats.streamed, 0u) << "no session reached START_REPLICATION";
    if (pooled()) {
      std::printf("session fuzz: %llu sessions got a kept backend\n",
                  static_cast<unsigned long long>(relay_->reused_backends()));
      EXPECT_GT(relay_->reused_backends(), 0u) << "no session got a kept backend";
    }
  }

  // The server is empty again and serves normal clients.
  set_method(*relay_, Method::kScram);
  EXPECT_TRUE(wait_for_no_sessions(*relay_, kHangLimit))
      << relay_->session_count() << " sessions left behind";
  {
    PgConnection conn(relay_->conninfo());
    EXPECT_EQ(conn.scalar("SELECT 'still serving'"), "still serving");
  }
  {
    PGconn* conn = PQconnectdb(relay_->conninfo("replication=database").c_str());
    ASSERT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
    PGresult* res = PQexec(conn, "IDENTIFY_SYSTEM");
    EXPECT_EQ(PQresultStatus(res), PGRES_TUPLES_OK) << PQerrorMessage(conn);
    EXPECT_EQ(PQntuples(res), 1);
    PQclear(res);
    PQfinish(conn);
  }
  EXPECT_TRUE(wait_for_no_sessions(*relay_, kHangLimit))
      << relay_->session_count() << " sessions left behind";
}

}  // namespace
}  // namespace pgrelay::test
