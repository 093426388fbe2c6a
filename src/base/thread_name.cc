// Names the calling thread, so that top -H, ps -L, perf and /proc tell pgrelay's threads apart.
#include "base/thread_name.h"

#include <pthread.h>

#include <string>

namespace pgrelay {

void name_this_thread(std::string_view name) {
  constexpr std::size_t kMaxName = 15;  // TASK_COMM_LEN less its terminating zero
  const std::string kept(name.substr(0, kMaxName));
  (void)pthread_setname_np(pthread_self(), kept.c_str());
}

std::thread start_named_thread(std::string_view name, std::function<void()> job) {
  return std::thread([name = std::string(name), job = std::move(job)] {
    name_this_thread(name);
    job();
  });
}

}  // namespace pgrelay
