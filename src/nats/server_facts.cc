// The primary's server facts message, to JSON and back.
#include "nats/server_facts.h"

#include <nlohmann/json.hpp>

namespace pgrelay::nats {

std::string encode_server_facts(const ServerFacts& facts) {
  // An array of pairs keeps the upstream's order (a JSON object need not).
  nlohmann::json parameters = nlohmann::json::array();
  for (const auto& [name, value] : facts.parameters) parameters.push_back({name, value});
  nlohmann::json j = {{"parameters", std::move(parameters)},
                      {"catalog", facts.catalog ? nlohmann::json(*facts.catalog) : nullptr},
                      {"as_of", facts.as_of.to_string()}};
  return j.dump();
}

Result<ServerFacts> parse_server_facts(std::string_view payload) {
  const auto bad = [](const std::string& why) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "invalid server facts message: " + why,
                       "The message on the stream's server facts subject was not written by "
                       "pgrelay; point the follower at the stream its primary publishes.");
  };
  const nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return bad("not a JSON object");
  ServerFacts facts;
  const auto parameters = j.find("parameters");
  if (parameters == j.end() || !parameters->is_array()) return bad("no \"parameters\" array");
  for (const auto& pair : *parameters) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string()) {
      return bad("a parameter is not a [name, value] pair of strings");
    }
    facts.parameters.emplace_back(pair[0].get<std::string>(), pair[1].get<std::string>());
  }
  const auto catalog = j.find("catalog");
  if (catalog == j.end() || !(catalog->is_null() || catalog->is_string())) {
    return bad("\"catalog\" is neither text nor null");
  }
  if (catalog->is_string()) facts.catalog = catalog->get<std::string>();
  const auto as_of = j.find("as_of");
  if (as_of == j.end() || !as_of->is_string()) return bad("no \"as_of\" LSN");
  const auto lsn = wire::Lsn::parse(as_of->get<std::string>());
  if (!lsn) return bad("\"as_of\" is not an LSN");
  facts.as_of = *lsn;
  return facts;
}

}  // namespace pgrelay::nats
