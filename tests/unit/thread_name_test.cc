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

// The name a new thread reports once it named itself `name`.
std::string name_after_naming(const std::string& name) {
  std::string seen;
  std::thread([&] {
    name_this_thread(name);
    seen = this_thread_name();
  }).join();
  return seen;
}

TEST(ThreadName, NamesTheCallingThread) {
  EXPECT_EQ(name_after_naming("log-sync"), "log-sync");
}

TEST(ThreadName, KeepsTheFirstFifteenBytesOfALongName) {
  EXPECT_EQ(name_after_naming("a-name-longer-than-linux-keeps"), "a-name-longer-t");
}

TEST(ThreadName, AStartedThreadRunsUnderItsName) {
  std::string seen;
  start_named_thread("relay-loop", [&] { seen = this_thread_name(); }).join();
  EXPECT_EQ(seen, "relay-loop");
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
