// Fuzzes what a publications-changed marker carries (its content's parts and the catalog JSON a
// view is made from) and the server facts a follower reads from the stream, which carry such a
// catalog: whatever they accept must hold together and round-trip, anything else is an error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "log/change_view.h"
#include "nats/server_facts.h"
#include "pgoutput/publication_catalog.h"

using namespace pgrelay;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void fuzz_content(std::string_view content) {
  const log::PublicationsChange change = log::parse_publications_change(content);
  if (!change.xid) {
    check(!change.before && !change.after);
    return;
  }
  const std::string_view xid = content.substr(0, content.find('\n'));
  check(!xid.empty() && xid.find_first_not_of("0123456789") == std::string_view::npos);
  check(xid.find_first_not_of('0') == std::string_view::npos
            ? *change.xid == 0
            : xid.substr(xid.find_first_not_of('0')) == std::to_string(*change.xid));
  // The catalogs are the content's own lines, never empty.
  for (const auto& catalog : {change.before, change.after}) {
    if (!catalog) continue;
    check(!catalog->empty() && catalog->find('\n') == std::string::npos);
    check(content.find(*catalog) != std::string_view::npos);
  }
}

void fuzz_catalog(std::string_view json) {
  auto catalog = pgoutput::parse_publication_catalog(json);
  if (!catalog.ok()) {
    check(catalog.error().sqlstate == sqlstate::kDataCorrupted);
    return;
  }
  for (const auto& [oid, relation] : catalog->partitioned) check(relation.oid == oid);
  auto again = pgoutput::parse_publication_catalog(json);
  check(again.ok() && *again == *catalog);
}

void fuzz_facts(std::string_view payload) {
  auto facts = nats::parse_server_facts(payload);
  if (!facts.ok()) {
    check(facts.error().sqlstate == sqlstate::kObjectNotInPrerequisiteState);
    return;
  }
  auto again = nats::parse_server_facts(nats::encode_server_facts(*facts));
  check(again.ok() && again->same_server(*facts) && again->as_of == facts->as_of);
  if (facts->catalog) fuzz_catalog(*facts->catalog);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      fuzz_content(text);
      break;
    case 1:
      fuzz_catalog(text);
      break;
    default:
      fuzz_facts(text);
  }
  return 0;
}
