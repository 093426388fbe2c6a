// The JetStream stream pgrelay publishes into: created when missing, checked when it exists,
// and where its end leaves a database's publishing.
#include "nats/stream_setup.h"

#include <algorithm>
#include <memory>
#include <string_view>

#include "base/strings.h"

namespace pgrelay::nats {

namespace {

constexpr std::int64_t kDuplicateWindowNanos = 120'000'000'000;  // 2 minutes

struct StreamInfoDeleter {
  void operator()(jsStreamInfo* si) const { jsStreamInfo_Destroy(si); }
};
using StreamInfoPtr = std::unique_ptr<jsStreamInfo, StreamInfoDeleter>;

std::vector<std::string_view> tokens(std::string_view subject) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const auto dot = subject.find('.', start);
    out.push_back(subject.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

Error js_error(natsStatus status, jsErrCode code, const std::string& what,
               const ConnectOptions& options) {
  Error e = nats_error(status, what, options);
  if (code != 0)
    e.detail += (e.detail.empty() ? "" : "; ") + std::string("JetStream error ") +
                std::to_string(static_cast<int>(code));
  if (code == JSNotEnabledErr || status == NATS_NO_RESPONDERS) {
    e.hint =
        "Enable JetStream on the NATS servers (nats-server -js, or a jetstream block in "
        "their configuration).";
  }
  return e;
}

}  // namespace

bool subject_covers(const std::string& pattern, const std::string& wanted) {
  const auto have = tokens(pattern);
  const auto want = tokens(wanted);
  for (std::size_t i = 0; i < have.size(); ++i) {
    if (have[i] == ">") return i < want.size();
    if (i >= want.size() || want[i] == ">") return false;
    if (have[i] == "*") {
      if (want[i] == ">") return false;
      continue;
    }
    if (have[i] != want[i]) return false;
  }
  return have.size() == want.size();
}

Result<StreamCheck> ensure_stream(const Connection& connection, const std::string& name,
                                  const std::string& subjects, const ConnectOptions& options) {
  StreamCheck check;
  const int servers = connection.known_servers();
  const int wanted_replicas = std::clamp(servers, 1, 3);
  jsStreamInfo* raw = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  natsStatus s = js_GetStreamInfo(&raw, connection.js(), name.c_str(), nullptr, &code);
  StreamInfoPtr info(raw);
  if (s == NATS_NOT_FOUND || code == JSStreamNotFoundErr) {
    jsStreamConfig config;
    jsStreamConfig_Init(&config);
    const char* subject_list[] = {subjects.c_str()};
    config.Name = name.c_str();
    config.Description =
        "pgrelay's change log: row changes as JSON, and each transaction's log entry";
    config.Subjects = subject_list;
    config.SubjectsLen = 1;
    config.Storage = js_FileStorage;
    config.Replicas = wanted_replicas;
    config.Duplicates = kDuplicateWindowNanos;
    raw = nullptr;
    s = js_AddStream(&raw, connection.js(), &config, nullptr, &code);
    info.reset(raw);
    if (s != NATS_OK) {
      Error e = js_error(s, code, "could not create the JetStream stream " + name, options);
      if (code == JSStreamSubjectOverlapErr) {
        e.hint = "Another stream already takes " + subjects +
                 ": give that stream's name with "
                 "--nats-stream, or another --nats-subject-prefix.";
      }
      return e;
    }
    check.created = true;
    check.replicas = wanted_replicas;
    return check;
  }
  if (s != NATS_OK)
    return js_error(s, code, "could not read the JetStream stream " + name, options);
  const jsStreamConfig& config = *info->Config;
  bool covered = false;
  std::string have;
  for (int i = 0; i < config.SubjectsLen; ++i) {
    if (subject_covers(config.Subjects[i], subjects)) covered = true;
    have += (have.empty() ? "" : ", ") + std::string(config.Subjects[i]);
  }
  if (!covered) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "the JetStream stream " + name + " does not take pgrelay's subjects " +
                           subjects + " (it takes " + (have.empty() ? "none" : have) + ")",
                       "Add " + subjects + " to the stream's subjects (nats stream edit " + name +
                           " --subjects …), or give pgrelay a stream of its own with "
                           "--nats-stream NAME, which it creates.");
  }
  if (config.NoAck) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "the JetStream stream " + name +
                           " does not acknowledge what is published "
                           "to it (no_ack), so pgrelay cannot know what it holds",
                       "Turn no_ack off on the stream, or give pgrelay a stream of its own with "
                       "--nats-stream NAME.");
  }
  check.replicas = static_cast<int>(config.Replicas);
  if (config.Storage == js_MemoryStorage) {
    check.warnings.push_back({"the JetStream stream " + name +
                                  " keeps its messages in memory: a restart of NATS loses them",
                              "Recreate the stream with file storage, or let pgrelay create "
                              "one (another --nats-stream name)."});
  }
  if (config.Replicas < wanted_replicas) {
    check.warnings.push_back({"the JetStream stream " + name + " has " +
                                  std::to_string(config.Replicas) + " replica(s) on a cluster of " +
                                  std::to_string(servers) + " servers: losing one loses the stream",
                              "Raise its replicas: nats stream edit " + name + " --replicas " +
                                  std::to_string(wanted_replicas) + "."});
  }
  if (config.Duplicates < kDuplicateWindowNanos) {
    check.warnings.push_back(
        {"the JetStream stream " + name + " keeps Msg-Ids for " +
             std::to_string(config.Duplicates / 1'000'000'000) +
             " s, less than the 2 minutes pgrelay asks",
         "Raise its duplicate window: nats stream edit " + name + " --dupe-window 2m."});
  }
  if (config.Retention != js_LimitsPolicy) {
    check.warnings.push_back(
        {"the JetStream stream " + name +
             " removes messages once consumed (interest or work-queue retention): followers "
             "and replays miss them",
         "Give pgrelay a stream with limits retention (another --nats-stream name, which "
         "pgrelay creates)."});
  }
  return check;
}

Result<StreamBounds> read_stream_bounds(const Connection& connection, const std::string& name,
                                        const ConnectOptions& options) {
  jsStreamInfo* raw = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  natsStatus s = js_GetStreamInfo(&raw, connection.js(), name.c_str(), nullptr, &code);
  StreamInfoPtr info(raw);
  if (s == NATS_NOT_FOUND || code == JSStreamNotFoundErr) {
    return Error::make(sqlstate::kUndefinedObject,
                       "the JetStream stream " + name + " does not exist",
                       "Start the pgrelay that publishes it (pgrelay serve --nats URL "
                       "--nats-stream " +
                           name + "), or name the stream it publishes with --nats-stream.");
  }
  if (s != NATS_OK) {
    return js_error(s, code, "could not read the JetStream stream " + name, options);
  }
  return StreamBounds{info->State.FirstSeq, info->State.LastSeq};
}

Result<StreamEnd> read_stream_end(const Connection& connection, const std::string& name,
                                  const Subjects& subjects, std::uint64_t log_id,
                                  const ConnectOptions& options) {
  StreamEnd end;
  jsStreamInfo* raw = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  natsStatus s = js_GetStreamInfo(&raw, connection.js(), name.c_str(), nullptr, &code);
  StreamInfoPtr info(raw);
  if (s != NATS_OK)
    return js_error(s, code, "could not read the JetStream stream " + name, options);
  end.last_seq = info->State.LastSeq;
  if (end.last_seq == 0) return end;
  natsMsg* raw_msg = nullptr;
  code = static_cast<jsErrCode>(0);
  const std::string filter = subjects.database_subjects();
  s = js_GetLastMsg(&raw_msg, connection.js(), name.c_str(), filter.c_str(), nullptr, &code);
  MsgPtr msg(raw_msg);
  if (s == NATS_NOT_FOUND || code == JSNoMessageFoundErr) return end;
  if (s != NATS_OK) {
    return js_error(s, code, "could not read the last message of " + filter + " in " + name,
                    options);
  }
  const std::string where = "message " + std::to_string(natsMsg_GetSequence(msg.get())) +
                            " of the JetStream stream " + name + " (subject " +
                            natsMsg_GetSubject(msg.get()) + ")";
  auto not_ours = [&](const std::string& why) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       where + " was not written by pgrelay: " + why,
                       "Give pgrelay a stream of its own with --nats-stream NAME (it creates "
                       "it), or another --nats-subject-prefix.");
  };
  auto id_text = header_value(msg.get(), "Nats-Msg-Id");
  auto log_text = header_value(msg.get(), kHeaderLogId);
  auto count_text = header_value(msg.get(), kHeaderCount);
  if (!id_text || !log_text || !count_text) return not_ours("it lacks pgrelay's headers");
  auto id = parse_message_id(*id_text);
  auto log = parse_decimal(*log_text);
  auto count = parse_decimal(*count_text);
  if (!id || !log || !count || *count > UINT32_MAX)
    return not_ours("its headers are not pgrelay's");
  if (*log != log_id) {
    return Error::make(
        sqlstate::kObjectNotInPrerequisiteState,
        where + " came from another change log (log id " + std::string(*log_text) +
            ", this pgrelay's is " + std::to_string(log_id) + ")",
        "The stream belongs to another pgrelay, or to this data directory before it was made "
        "anew. Give this one a stream of its own with --nats-stream NAME, or delete the old "
        "stream (nats stream rm " +
            name + ") to publish this log from its start.");
  }
  std::optional<PartHeader> part;
  if (id->tx_part) {
    auto text = header_value(msg.get(), kHeaderPart);
    if (!text) return not_ours("a _tx message without its " + std::string(kHeaderPart) + " header");
    part = parse_part_header(*text);
    if (!part) return not_ours("its part header is not pgrelay's");
  }
  end.resume = resume_after(*id, static_cast<std::uint32_t>(*count), part ? part->count : 0);
  // An entry resumed inside its parts is cut as it was begun, whatever max_payload is now.
  end.resume->part_size = part ? part->size : 0;
  if (auto previous = header_value(msg.get(), kHeaderPrevious)) {
    auto lsn = wire::Lsn::parse(*previous);
    if (!lsn) return not_ours("its " + std::string(kHeaderPrevious) + " header is not an LSN");
    end.resume->previous = *lsn;
  }
  return end;
}

Result<std::optional<ServerFacts>> read_server_facts(const Connection& connection,
                                                     const std::string& name,
                                                     const Subjects& subjects,
                                                     const ConnectOptions& options) {
  natsMsg* raw_msg = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  const std::string& subject = subjects.server_facts();
  natsStatus s =
      js_GetLastMsg(&raw_msg, connection.js(), name.c_str(), subject.c_str(), nullptr, &code);
  MsgPtr msg(raw_msg);
  if (s == NATS_NOT_FOUND || code == JSNoMessageFoundErr) return std::optional<ServerFacts>();
  if (s != NATS_OK) {
    return js_error(s, code, "could not read the server facts " + subject + " in " + name, options);
  }
  auto facts = parse_server_facts(std::string_view(
      natsMsg_GetData(msg.get()), static_cast<std::size_t>(natsMsg_GetDataLength(msg.get()))));
  if (!facts.ok()) return facts.error();
  return std::optional<ServerFacts>(std::move(*facts));
}

}  // namespace pgrelay::nats
