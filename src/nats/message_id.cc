// The Nats-Msg-Id of each message pgrelay publishes, and where a stream's last one leaves off.
#include "nats/message_id.h"

#include <charconv>

namespace pgrelay::nats {

namespace {

std::optional<std::uint32_t> parse_number(std::string_view text) {
  std::uint32_t value = 0;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  if (text.size() > 1 && text[0] == '0') return std::nullopt;  // one spelling per id
  return value;
}

}  // namespace

std::string format_message_id(const MessageId& id) {
  return id.commit_lsn.to_string() + (id.tx_part ? "/tx/" : "/") + std::to_string(id.number);
}

std::optional<MessageId> parse_message_id(std::string_view text) {
  // "X/Y" holds one '/': the LSN ends at the second.
  const auto first = text.find('/');
  if (first == std::string_view::npos) return std::nullopt;
  const auto second = text.find('/', first + 1);
  if (second == std::string_view::npos) return std::nullopt;
  MessageId id;
  auto lsn = wire::Lsn::parse(text.substr(0, second));
  if (!lsn) return std::nullopt;
  id.commit_lsn = *lsn;
  std::string_view rest = text.substr(second + 1);
  if (rest.starts_with("tx/")) {
    id.tx_part = true;
    rest.remove_prefix(3);
  }
  auto number = parse_number(rest);
  if (!number) return std::nullopt;
  id.number = *number;
  return id;
}

std::string format_part_header(const PartHeader& part) {
  return std::to_string(part.number) + "/" + std::to_string(part.count) + "/" +
         std::to_string(part.size);
}

std::optional<PartHeader> parse_part_header(std::string_view text) {
  const auto first = text.find('/');
  const auto second = first == std::string_view::npos ? first : text.find('/', first + 1);
  if (second == std::string_view::npos) return std::nullopt;
  auto number = parse_number(text.substr(0, first));
  auto count = parse_number(text.substr(first + 1, second - first - 1));
  std::uint64_t size = 0;
  const std::string_view rest = text.substr(second + 1);
  auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), size);
  if (!number || !count || ec != std::errc() || ptr != rest.data() + rest.size() || rest.empty() ||
      *count == 0 || *number >= *count || size == 0) {
    return std::nullopt;
  }
  return PartHeader{*number, *count, size};
}

ResumePoint resume_after(const MessageId& last, std::uint32_t count_of_last,
                         std::uint32_t parts_of_last) {
  ResumePoint point;
  point.commit_lsn = last.commit_lsn;
  if (last.tx_part && last.number + 1 >= parts_of_last) {
    point.whole = true;
    return point;
  }
  point.changes = count_of_last;
  point.skip = last.tx_part ? std::uint64_t{count_of_last} + last.number + 1 : last.number + 1;
  return point;
}

}  // namespace pgrelay::nats
