// The hubs of an upstream's databases: the capture scope, starting a database's capture once, on
// first need, and what a session's preparation tells the catalog.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "log_test_util.h"
#include "server/replication_hubs.h"

namespace pgrelay::server {
namespace {

using log::testing::TempDir;

TEST(CaptureScopeTest, TheUrlsDatabaseAlwaysTheNamedOnesOrAll) {
  CaptureScope named("postgres", {"app1", "app2"});
  EXPECT_TRUE(named.admits("postgres"));
  EXPECT_TRUE(named.admits("app1"));
  EXPECT_FALSE(named.admits("app3"));
  EXPECT_FALSE(named.admits("App1"));  // names are exact, as Postgres's
  CaptureScope all("postgres", {"*"});
  EXPECT_TRUE(all.admits("anything"));
  CaptureScope only_url("postgres", {});
  EXPECT_FALSE(only_url.admits("app1"));
}

TEST(CaptureScopeTest, RefusalNamesTheDatabaseAndTheOption) {
  CaptureScope scope("postgres", {"app1"});
  Error plain = scope.refusal("app2");
  EXPECT_EQ(plain.sqlstate, "55000");
  EXPECT_EQ(plain.message, "database \"app2\" is not captured by pgrelay");
  EXPECT_NE(plain.hint.find("--capture-database app2 "), std::string::npos) << plain.hint;
  EXPECT_NE(plain.hint.find("--capture-database '*'"), std::string::npos) << plain.hint;
  EXPECT_EQ(plain.detail,
            "pgrelay captures \"postgres\", \"app1\"; a slot here would stream nothing.");
  // A name the shell would split or expand is quoted, a quote in it escaped.
  Error odd = scope.refusal("it's a db");
  EXPECT_NE(odd.hint.find("--capture-database 'it'\\''s a db'"), std::string::npos) << odd.hint;
}

class ReplicationHubsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto slots = log::SlotRegistry::open(dir_.path() + "/slots");
    ASSERT_TRUE(slots.ok()) << slots.error().message;
    slots_ = std::move(*slots);
    upstream_.dbname = "postgres";
  }

  // A starter that opens a log per database (a fake capture: none), counting starts, and
  // failing for the names in fail_.
  CaptureStarter starter() {
    return [this](const std::string& database) -> Result<CapturedParts> {
      ++starts_[database];
      if (database == "missing") {
        return Error::make(sqlstate::kInvalidCatalogName, "database \"missing\" does not exist");
      }
      if (fail_.count(database)) return Error::make("42501", "permission denied for database");
      log::LogOptions options;
      options.dir = dir_.path() + "/" + database;
      options.sync = log::SyncPolicy::kNone;
      auto opened = log::ChangeLog::open(options);
      if (!opened.ok()) return opened.error();
      std::shared_ptr<log::ChangeLog> owned = std::move(*opened);
      return CapturedParts{owned.get(), nullptr, owned};
    };
  }
  DatabasePreparer preparer() {
    return [this](const std::string& database, const std::optional<Error>& refusal) {
      told_.push_back({database, refusal ? refusal->message : std::string("captured")});
    };
  }

  TempDir dir_;
  std::unique_ptr<log::SlotRegistry> slots_;
  upstream::UpstreamConfig upstream_;
  asio::io_context io_;
  asio::thread_pool pool_{1};
  std::map<std::string, int> starts_;
  std::set<std::string> fail_;
  std::vector<std::pair<std::string, std::string>> told_;
};

TEST_F(ReplicationHubsTest, EachDatabaseHasItsOwnHubStartedOnce) {
  ReplicationHubs hubs(io_.get_executor(), pool_, *slots_, upstream_,
                       CaptureScope("postgres", {"*"}), starter(), preparer());
  auto first = hubs.open("postgres");
  auto app = hubs.open("app");
  ASSERT_TRUE(first.ok() && app.ok());
  EXPECT_NE(*first, *app);
  EXPECT_NE(&(*first)->log(), &(*app)->log());
  EXPECT_EQ((*app)->upstream().dbname, "app");
  EXPECT_EQ(&(*first)->slots(), &(*app)->slots());            // one registry
  EXPECT_EQ(&(*first)->walsenders(), &(*app)->walsenders());  // one walsender table
  EXPECT_EQ(*hubs.open("app"), *app);
  EXPECT_EQ(hubs.find("app"), *app);
  EXPECT_EQ(hubs.find("other"), nullptr);
  EXPECT_EQ(starts_["app"], 1);
  EXPECT_EQ(hubs.captured(), (std::vector<std::string>{"app", "postgres"}));
}

TEST_F(ReplicationHubsTest, ConcurrentFirstUsesStartOneCapture) {
  ReplicationHubs hubs(io_.get_executor(), pool_, *slots_, upstream_,
                       CaptureScope("postgres", {"*"}), starter(), preparer());
  std::vector<std::thread> threads;
  std::atomic<int> opened{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      hubs.prepare("app");
      if (hubs.open("app").ok()) ++opened;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(opened.load(), 8);
  EXPECT_EQ(starts_["app"], 1);
  EXPECT_EQ(told_, (std::vector<std::pair<std::string, std::string>>{{"app", "captured"}}));
  EXPECT_TRUE(hubs.prepared("app"));
}

TEST_F(ReplicationHubsTest, OutOfScopeIsRefusedAndNeverStarted) {
  ReplicationHubs hubs(io_.get_executor(), pool_, *slots_, upstream_,
                       CaptureScope("postgres", {"app"}), starter(), preparer());
  auto refused = hubs.open("other");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().sqlstate, "55000");
  hubs.prepare("other");
  EXPECT_EQ(starts_.count("other"), 0u);
  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].second, "database \"other\" is not captured by pgrelay");
}

TEST_F(ReplicationHubsTest, AFailedStartIsToldThenRetriedByOpen) {
  fail_.insert("locked");
  ReplicationHubs hubs(io_.get_executor(), pool_, *slots_, upstream_,
                       CaptureScope("postgres", {"*"}), starter(), preparer());
  hubs.prepare("locked");
  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].second, "permission denied for database");
  hubs.prepare("locked");  // prepared once: not tried at every session
  EXPECT_EQ(starts_["locked"], 1);
  fail_.clear();
  auto now = hubs.open("locked");  // a slot command tries again
  ASSERT_TRUE(now.ok()) << now.error().message;
  EXPECT_EQ(starts_["locked"], 2);
  // and the catalog, refusing until now, hears that it captures.
  ASSERT_EQ(told_.size(), 2u);
  EXPECT_EQ(told_[1], (std::pair<std::string, std::string>{"locked", "captured"}));
}

TEST_F(ReplicationHubsTest, ReleaseBeforeDropUnlessASlotOrASessionHoldsIt) {
  std::vector<std::string> forgotten;
  ReplicationHubs hubs(io_.get_executor(), pool_, *slots_, upstream_,
                       CaptureScope("postgres", {"*"}), starter(), preparer(),
                       [&](const std::string& database) { forgotten.push_back(database); });
  ASSERT_TRUE(hubs.open("postgres").ok());
  hubs.prepare("app");
  ASSERT_NE(hubs.find("app"), nullptr);
  EXPECT_FALSE(hubs.release("postgres"));  // the URL's database always stays
  EXPECT_FALSE(hubs.release("never_used"));

  log::Slot slot;
  slot.name = "s";
  slot.plugin = "pgoutput";
  slot.database = "app";
  ASSERT_TRUE(slots_->create(slot).ok());
  EXPECT_FALSE(hubs.release("app"));  // as Postgres: a database with slots is in use
  ASSERT_TRUE(slots_->drop("s").ok());

  auto session = hubs.use("app");  // a replication session there
  EXPECT_FALSE(hubs.release("app"));
  session.reset();

  EXPECT_TRUE(hubs.release("app"));
  EXPECT_EQ(hubs.find("app"), nullptr);
  EXPECT_FALSE(hubs.prepared("app"));
  EXPECT_EQ(forgotten, std::vector<std::string>{"app"});
  // A database of that name made again is captured afresh by its first session.
  hubs.prepare("app");
  EXPECT_NE(hubs.find("app"), nullptr);
  EXPECT_EQ(starts_["app"], 2);
}

// A session's frame may be destroyed after the hubs (with the io_context, at shutdown).
TEST_F(ReplicationHubsTest, AUseMayOutliveTheHubs) {
  std::shared_ptr<void> session;
  {
    ReplicationHubs hubs(io_.get_executor(), pool_, *slots_, upstream_,
                         CaptureScope("postgres", {"*"}), starter(), preparer());
    session = hubs.use("app");
  }
  session.reset();  // ASan: no use after free
  SUCCEED();
}

TEST_F(ReplicationHubsTest, NoSuchDatabaseIsLeftToTheSessionsLogin) {
  ReplicationHubs hubs(io_.get_executor(), pool_, *slots_, upstream_,
                       CaptureScope("postgres", {"*"}), starter(), preparer());
  hubs.prepare("missing");
  EXPECT_TRUE(told_.empty());
  EXPECT_FALSE(hubs.prepared("missing"));  // created later, it is prepared then
}

}  // namespace
}  // namespace pgrelay::server
