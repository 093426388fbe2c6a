// Thread names: a part's thread carries its name, cut to what Linux keeps.
#include "base/thread_name.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <string>
#include <thread>

#include "base/background_thread.h"

namespace pgrelay {
namespace {

std::string this_thread_name() {
  char name[64] = {};
  EXPECT_EQ(pthread_getname_np(pthread_self(), name, sizeof name), 0);
  return name;
}

TEST(ThreadName, NamesTheCallingThread) {
  std::string seen;
  std::thread([&] {
    name_this_thread("log-sync");
    seen = this_thread_name();
  }).join();
  EXPECT_EQ(seen, "log-sync");
}

TEST(ThreadName, KeepsTheFirstFifteenBytesOfALongName) {
  std::string seen;
  std::thread([&] {
    name_this_thread("a-name-longer-than-linux-keeps");
    seen = this_thread_name();
  }).join();
  EXPECT_EQ(seen, "a-name-longer-t");
}

TEST(ThreadName, ABackgroundThreadRunsUnderItsName) {
  std::string seen;
  BackgroundThread thread;
  thread.start("nats-publish", [&] { seen = this_thread_name(); });
  thread.stop();
  EXPECT_EQ(seen, "nats-publish");
}

}  // namespace
}  // namespace pgrelay
