// Names the calling thread, so that top -H, ps -L, perf and /proc tell pgrelay's threads apart.
#pragma once

#include <string_view>

namespace pgrelay {

// Linux keeps the first 15 bytes. A failure leaves the inherited name: only less legible.
void name_this_thread(std::string_view name);

}  // namespace pgrelay
