// Fuzzes what a publications-changed marker carries: its content's parts and the catalog JSON a
// view is made from; whatever they accept must hold together, anything else is an XX001 error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "log/change_view.h"
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    fuzz_content(text);
  } else {
    fuzz_catalog(text);
  }
  return 0;
}
