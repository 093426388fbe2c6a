// Benchmarks FrameReader throughput on 1 GiB of backend messages cut into random-sized chunks.
//
// A 64 MiB buffer of realistic backend traffic (DataRows of varied widths, CopyData carrying
// XLogData of mostly small sizes, keepalives and the odd small message) is generated once with a
// fixed seed and fed 16 times, in chunks of 1 byte to 64 KiB (log-uniform, fixed seed), so memory
// stays bounded while each iteration reads 1 GiB.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "wire/backend_messages.h"
#include "wire/frame_reader.h"
#include "wire/messages.h"
#include "wire/replication_frames.h"

namespace {

using namespace pgrelay;
using namespace pgrelay::wire;

constexpr std::size_t kBufferBytes = std::size_t{64} << 20;
constexpr int kPasses = 16;
constexpr std::size_t kMaxChunk = std::size_t{64} << 10;

struct Traffic {
  Bytes bytes;
  std::size_t messages = 0;
  std::vector<std::uint32_t> chunks;  // chunk sizes, cycled through
};

Bytes filler(std::mt19937_64& rng, std::size_t n) {
  Bytes b(n);
  for (auto& byte : b) byte = static_cast<std::uint8_t>('a' + rng() % 26);
  return b;
}

// Sizes with a long tail: mostly small, sometimes large.
std::size_t skewed(std::mt19937_64& rng, std::size_t max) {
  std::uniform_real_distribution<double> u(0.0, std::log(static_cast<double>(max)));
  return static_cast<std::size_t>(std::exp(u(rng)));
}

const Traffic& traffic() {
  static const Traffic t = [] {
    Traffic out;
    std::mt19937_64 rng(20240229);
    out.bytes.reserve(kBufferBytes + (std::size_t{1} << 20));
    auto add = [&](const Bytes& message) {
      out.bytes.insert(out.bytes.end(), message.begin(), message.end());
      ++out.messages;
    };
    while (out.bytes.size() < kBufferBytes) {
      const std::uint64_t kind = rng() % 100;
      if (kind < 55) {
        // A query result row: 1-20 columns of 0-200 bytes, some NULL, rarely a wide value.
        DataRow row;
        const std::size_t columns = 1 + rng() % 20;
        for (std::size_t i = 0; i < columns; ++i) {
          if (rng() % 10 == 0) {
            row.values.emplace_back(std::nullopt);
          } else {
            row.values.emplace_back(filler(rng, rng() % 50 == 0 ? 8192 : rng() % 200));
          }
        }
        add(encode(row));
      } else if (kind < 95) {
        // Logical replication: XLogData in CopyData, mostly 30 bytes to 16 KiB, 1% up to 256 KiB.
        XLogData x;
        x.wal_start = Lsn(0x16B3748 + out.bytes.size());
        x.wal_end = x.wal_start + 4096;
        x.send_time = 767000000000000;
        const std::size_t max = rng() % 100 == 0 ? std::size_t{256} << 10 : std::size_t{16} << 10;
        x.data = filler(rng, 30 + skewed(rng, max));
        add(encode(CopyData{encode(x)}));
      } else if (kind < 98) {
        add(encode(CopyData{
            encode(PrimaryKeepalive{Lsn(out.bytes.size()), 767000000000000, rng() % 2 == 0})}));
      } else if (kind < 99) {
        add(encode(CommandComplete{"SELECT " + std::to_string(rng() % 1000)}));
      } else {
        add(encode(ReadyForQuery{TransactionStatus::kIdle}));
      }
    }
    std::mt19937_64 chunk_rng(7);
    out.chunks.resize(1 << 16);
    for (auto& c : out.chunks) c = static_cast<std::uint32_t>(1 + skewed(chunk_rng, kMaxChunk));
    return out;
  }();
  return t;
}

// Feeds the buffer kPasses times in the precomputed chunk sizes; `read` drains the reader.
template <typename Read>
std::size_t run(const Traffic& t, Read read) {
  FrameReader reader(FrameReader::Phase::kRegular);
  std::size_t frames = 0;
  std::size_t chunk = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    const ByteView all(t.bytes);
    std::size_t pos = 0;
    while (pos < all.size()) {
      const std::size_t n =
          std::min<std::size_t>(t.chunks[chunk++ % t.chunks.size()], all.size() - pos);
      reader.feed(all.subspan(pos, n));
      pos += n;
      frames += read(reader);
    }
  }
  if (!reader.finish_at_eof().ok()) return 0;
  return frames;
}

void report(benchmark::State& state, const Traffic& t, std::size_t frames_per_iteration) {
  const double iterations = static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(t.bytes.size()) * kPasses;
  state.SetBytesProcessed(static_cast<std::int64_t>(iterations * bytes));
  state.SetItemsProcessed(static_cast<std::int64_t>(iterations * frames_per_iteration));
  state.counters["MB"] = benchmark::Counter(iterations * bytes / 1e6, benchmark::Counter::kIsRate);
  state.counters["msgs"] = benchmark::Counter(
      iterations * static_cast<double>(frames_per_iteration), benchmark::Counter::kIsRate);
  state.SetLabel(std::to_string(kPasses) + " x " + std::to_string(t.bytes.size() >> 20) + " MiB, " +
                 std::to_string(t.messages * kPasses) + " messages, chunks 1 B..64 KiB");
}

// next_view(): the zero-copy path a relay uses.
void BM_FrameReaderView(benchmark::State& state) {
  const Traffic& t = traffic();
  std::size_t frames = 0;
  for (auto _ : state) {
    frames = run(t, [](FrameReader& reader) {
      std::size_t n = 0;
      for (;;) {
        auto frame = reader.next_view();
        if (!frame.ok() || !frame->has_value()) break;
        benchmark::DoNotOptimize((*frame)->body.data());
        ++n;
      }
      return n;
    });
  }
  if (frames != t.messages * kPasses) state.SkipWithError("frame count mismatch");
  report(state, t, frames);
}
BENCHMARK(BM_FrameReaderView)->Unit(benchmark::kMillisecond);

// next(): each body copied into its own buffer.
void BM_FrameReaderCopy(benchmark::State& state) {
  const Traffic& t = traffic();
  std::size_t frames = 0;
  for (auto _ : state) {
    frames = run(t, [](FrameReader& reader) {
      std::size_t n = 0;
      for (;;) {
        auto frame = reader.next();
        if (!frame.ok() || !frame->has_value()) break;
        benchmark::DoNotOptimize((*frame)->body.data());
        ++n;
      }
      return n;
    });
  }
  if (frames != t.messages * kPasses) state.SkipWithError("frame count mismatch");
  report(state, t, frames);
}
BENCHMARK(BM_FrameReaderCopy)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
