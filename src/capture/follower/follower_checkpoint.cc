// What a follower's log remembers of the stream it follows: the log id and the last sequence
// it applied, written as a checkpoint entry in the same batch as the entries it covers.
#include "capture/follower/follower_checkpoint.h"

#include <string_view>

#include "base/strings.h"

namespace pgrelay::capture {

namespace {

constexpr std::string_view kMagic = "pgrelay-follower-checkpoint 1\n";

// The value of the line "KEY VALUE\n" at the front of `text`, which moves past it.
std::optional<std::string_view> take_line(std::string_view& text, std::string_view key) {
  const std::size_t end = text.find('\n');
  if (end == std::string_view::npos) return std::nullopt;
  std::string_view line = text.substr(0, end);
  text.remove_prefix(end + 1);
  if (!line.starts_with(key) || line.size() <= key.size() || line[key.size()] != ' ') {
    return std::nullopt;
  }
  return line.substr(key.size() + 1);
}

}  // namespace

Bytes encode_follower_checkpoint(const FollowerCheckpoint& checkpoint) {
  std::string text(kMagic);
  text += "stream " + checkpoint.stream + "\n";
  text += "log-id " + std::to_string(checkpoint.log_id) + "\n";
  text += "seq " + std::to_string(checkpoint.stream_seq) + "\n";
  return Bytes(text.begin(), text.end());
}

Result<std::optional<FollowerCheckpoint>> decode_follower_checkpoint(ByteView data) {
  std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
  if (!text.starts_with(kMagic)) {
    if (!text.starts_with(kMagic.substr(0, kMagic.find(' ') + 1))) {
      return std::optional<FollowerCheckpoint>();
    }
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "the follower's checkpoint in its log is of a format this pgrelay does "
                       "not know",
                       "Run the pgrelay version that wrote it, or start the follower on an empty "
                       "--data-dir: it rebuilds its log from the stream.");
  }
  text.remove_prefix(kMagic.size());
  auto stream = take_line(text, "stream");
  auto log_id = stream ? take_line(text, "log-id") : std::nullopt;
  auto seq = log_id ? take_line(text, "seq") : std::nullopt;
  auto log_value = log_id ? parse_decimal(*log_id) : std::nullopt;
  auto seq_value = seq ? parse_decimal(*seq) : std::nullopt;
  if (!log_value || !seq_value || !text.empty()) {
    return Error::make(sqlstate::kDataCorrupted, "the follower's checkpoint in its log is damaged",
                       "Start the follower on an empty --data-dir: it rebuilds its log from the "
                       "stream.");
  }
  return std::optional<FollowerCheckpoint>(
      FollowerCheckpoint{std::string(*stream), *log_value, *seq_value});
}

}  // namespace pgrelay::capture
