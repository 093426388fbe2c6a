// Names the calling thread, so that top -H, ps -L, perf and /proc tell pgrelay's threads apart.
#pragma once

#include <functional>
#include <string_view>
#include <thread>

namespace pgrelay {

// Linux keeps the first 15 bytes. A failure leaves the inherited name: only less legible.
void name_this_thread(std::string_view name);

// A new thread that names itself `name`, then runs `job`.
std::thread start_named_thread(std::string_view name, std::function<void()> job);

}  // namespace pgrelay
