// Benchmarks pgoutput encode and decode throughput on the golden streams (or a synthetic stream).
//
// With PGRELAY_GOLDEN_DIR set, every file of $PGRELAY_GOLDEN_DIR/fuzz_pgoutput_decoder/ is one
// message of a stream recorded from PostgreSQL 15 by tests/pg/golden_test.cc, named
// <stream>-<index>. Streams are decoded in index order with the options their name stands for
// ("v<proto_version>_...", "parallel" for streaming = parallel). Without the directory a
// synthetic stream built with the encoder is used instead, and the label says so.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "base/bytes.h"
#include "pgoutput/decoder.h"
#include "pgoutput/encoder.h"
#include "pgoutput/messages.h"

namespace {

namespace fs = std::filesystem;
using namespace pgrelay;
using namespace pgrelay::pgoutput;

struct Stream {
  std::string name;
  DecoderOptions options;
  std::vector<Bytes> payloads;
  std::vector<Message> messages;  // the payloads decoded, for the encode benchmarks
};

struct Corpus {
  std::vector<Stream> streams;
  std::size_t message_count = 0;
  std::size_t byte_count = 0;
  std::string label;
  std::string error;  // set when the corpus cannot be used
};

// "v2_streaming" -> protocol 2; "v4_parallel" -> protocol 4 with parallel streaming.
DecoderOptions options_for(const std::string& stream) {
  DecoderOptions options;
  if (stream.size() >= 2 && stream[0] == 'v' && stream[1] >= '1' && stream[1] <= '9') {
    options.protocol_version = stream[1] - '0';
  }
  options.parallel_streaming = stream.find("parallel") != std::string::npos;
  return options;
}

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Decodes every stream once: the benchmark must not time error paths, and the encode benchmarks
// need the decoded messages.
void decode_all(Corpus& corpus) {
  for (Stream& s : corpus.streams) {
    Decoder decoder(s.options);
    for (std::size_t i = 0; i < s.payloads.size(); ++i) {
      Result<Message> m = decoder.decode(s.payloads[i]);
      if (!m.ok()) {
        corpus.error = s.name + " #" + std::to_string(i) + ": " + m.error().to_string();
        return;
      }
      s.messages.push_back(std::move(*m));
      corpus.message_count += 1;
      corpus.byte_count += s.payloads[i].size();
    }
  }
}

bool load_golden(const char* dir_env, Corpus& corpus) {
  const fs::path dir = fs::path(dir_env) / "fuzz_pgoutput_decoder";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  // stream -> index -> file
  std::map<std::string, std::map<long, fs::path>> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    const std::size_t dash = name.rfind('-');
    if (dash == std::string::npos || dash + 1 == name.size()) continue;
    char* end = nullptr;
    const long index = std::strtol(name.c_str() + dash + 1, &end, 10);
    if (*end != '\0') continue;
    files[name.substr(0, dash)][index] = entry.path();
  }
  if (files.empty()) return false;
  for (const auto& [stream, by_index] : files) {
    Stream s;
    s.name = stream;
    s.options = options_for(stream);
    for (const auto& [index, path] : by_index) s.payloads.push_back(read_file(path));
    corpus.streams.push_back(std::move(s));
  }
  corpus.label = "golden " + dir.string();
  return true;
}

// Begin, 5 Inserts, 2 Updates with the old key, 1 Delete, Commit per transaction on one
// 10-column table, after its Relation message.
void build_synthetic(Corpus& corpus, const std::string& why) {
  Stream s;
  s.name = "synthetic";
  s.options.protocol_version = 1;
  Relation rel;
  rel.oid = 16384;
  rel.namespace_name = "public";
  rel.name = "orders";
  const std::pair<const char*, Oid> columns[] = {
      {"id", 20},         {"customer_id", 20},  {"status", 25},       {"amount", 1700},
      {"currency", 1042}, {"created_at", 1184}, {"updated_at", 1184}, {"note", 25},
      {"tags", 1009},     {"flags", 23}};
  for (const auto& [name, type] : columns) {
    rel.columns.push_back(
        Column{static_cast<std::uint8_t>(rel.columns.empty() ? kColumnIsKey : 0), name, type, -1});
  }
  auto row = [](int id, int version) {
    Tuple t;
    const std::string note(static_cast<std::size_t>(20 + (id * 37 + version * 11) % 120), 'n');
    t.columns = {TupleValue::text(std::to_string(id)),
                 TupleValue::text(std::to_string(100000 + id % 977)),
                 TupleValue::text(version == 0 ? "pending" : "shipped"),
                 TupleValue::text(std::to_string(id % 10000) + "." + std::to_string(id % 100)),
                 TupleValue::text("EUR"),
                 TupleValue::text("2024-02-29 12:34:56.789012+00"),
                 version == 0 ? TupleValue::null() : TupleValue::text("2024-03-01 08:00:00+00"),
                 TupleValue::text(note),
                 TupleValue::text("{priority,gift}"),
                 TupleValue::text(std::to_string(version))};
    return t;
  };
  auto key = [](int id) {
    Tuple t;
    t.columns.assign(10, TupleValue::null());
    t.columns[0] = TupleValue::text(std::to_string(id));
    return t;
  };
  std::vector<Message> messages;
  messages.push_back(rel);
  Lsn lsn(0x16B3748);
  int id = 0;
  for (Xid xid = 1000; xid < 2000; ++xid) {
    messages.push_back(Begin{lsn + 4096, 767000000000000 + xid, xid});
    for (int i = 0; i < 5; ++i) messages.push_back(Insert{std::nullopt, rel.oid, row(++id, 0)});
    for (int i = 0; i < 2; ++i) {
      messages.push_back(
          Update{std::nullopt, rel.oid, OldTuple{OldKind::kKey, key(id - i)}, row(id - i, 1)});
    }
    messages.push_back(Delete{std::nullopt, rel.oid, OldTuple{OldKind::kKey, key(id - 4)}});
    messages.push_back(Commit{lsn + 4096, lsn + 4200, 767000000000000 + xid});
    lsn = lsn + 8192;
  }
  for (const Message& m : messages) s.payloads.push_back(encode(m));
  corpus.streams.push_back(std::move(s));
  corpus.label = "synthetic stream (" + why + ")";
}

const Corpus& corpus() {
  static const Corpus c = [] {
    Corpus out;
    const char* dir = std::getenv("PGRELAY_GOLDEN_DIR");
    if (dir == nullptr || *dir == '\0') {
      build_synthetic(out, "PGRELAY_GOLDEN_DIR not set");
    } else if (!load_golden(dir, out)) {
      build_synthetic(out, std::string("no golden streams in ") + dir + "/fuzz_pgoutput_decoder");
    }
    decode_all(out);
    out.label += ": " + std::to_string(out.streams.size()) + " streams, " +
                 std::to_string(out.message_count) + " messages, " +
                 std::to_string(out.byte_count) + " bytes";
    return out;
  }();
  return c;
}

void report(benchmark::State& state, const Corpus& c) {
  const auto iterations = static_cast<std::int64_t>(state.iterations());
  state.SetItemsProcessed(iterations * static_cast<std::int64_t>(c.message_count));
  state.SetBytesProcessed(iterations * static_cast<std::int64_t>(c.byte_count));
  state.counters["msgs"] =
      benchmark::Counter(static_cast<double>(iterations) * static_cast<double>(c.message_count),
                         benchmark::Counter::kIsRate);
  state.counters["MB"] =
      benchmark::Counter(static_cast<double>(iterations) * static_cast<double>(c.byte_count) / 1e6,
                         benchmark::Counter::kIsRate);
  state.SetLabel(c.label);
}

bool usable(benchmark::State& state, const Corpus& c) {
  if (c.error.empty()) return true;
  state.SkipWithError(("corpus does not decode: " + c.error).c_str());
  return false;
}

// A fresh Decoder per stream per pass, so the relation cache and stream state are exercised as
// in a real session.
void BM_Decode(benchmark::State& state) {
  const Corpus& c = corpus();
  if (!usable(state, c)) return;
  for (auto _ : state) {
    for (const Stream& s : c.streams) {
      Decoder decoder(s.options);
      for (const Bytes& payload : s.payloads) {
        Result<Message> m = decoder.decode(payload);
        benchmark::DoNotOptimize(m);
      }
    }
  }
  report(state, c);
}
BENCHMARK(BM_Decode);

// encode() into a fresh buffer per message, as a sender building one CopyData at a time does.
void BM_EncodeToNewBuffer(benchmark::State& state) {
  const Corpus& c = corpus();
  if (!usable(state, c)) return;
  for (auto _ : state) {
    for (const Stream& s : c.streams) {
      for (const Message& m : s.messages) {
        Bytes b = encode(m);
        benchmark::DoNotOptimize(b.data());
      }
    }
  }
  report(state, c);
}
BENCHMARK(BM_EncodeToNewBuffer);

// encode() appending to one reused buffer: the encoder alone, without allocation.
void BM_EncodeAppend(benchmark::State& state) {
  const Corpus& c = corpus();
  if (!usable(state, c)) return;
  Bytes buffer;
  buffer.reserve(c.byte_count);
  for (auto _ : state) {
    buffer.clear();
    ByteWriter w(std::move(buffer));
    for (const Stream& s : c.streams) {
      for (const Message& m : s.messages) encode(m, w);
    }
    buffer = std::move(w).take();
    benchmark::DoNotOptimize(buffer.data());
    benchmark::ClobberMemory();
  }
  if (buffer.size() != c.byte_count) state.SkipWithError("re-encoded size differs from the input");
  report(state, c);
}
BENCHMARK(BM_EncodeAppend);

// Decode then re-encode every message: a pass-through relay's per-message work.
void BM_DecodeEncode(benchmark::State& state) {
  const Corpus& c = corpus();
  if (!usable(state, c)) return;
  for (auto _ : state) {
    for (const Stream& s : c.streams) {
      Decoder decoder(s.options);
      for (const Bytes& payload : s.payloads) {
        Result<Message> m = decoder.decode(payload);
        Bytes b = encode(*m);
        benchmark::DoNotOptimize(b.data());
      }
    }
  }
  report(state, c);
}
BENCHMARK(BM_DecodeEncode);

}  // namespace

BENCHMARK_MAIN();
