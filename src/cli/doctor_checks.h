// The checks of `pgrelay doctor`: facts about an upstream judged OK, WARN or FAIL, with fixes.
#pragma once

#include <string>
#include <vector>

#include "cli/doctor_facts.h"

namespace pgrelay::cli::doctor {

enum class Verdict { kOk, kWarn, kFail, kSkip };

const char* to_string(Verdict v);  // "OK", "WARN", "FAIL", "SKIP"

// A fix: where or how to apply it ("SQL, as a superuser", "postgresql.conf, then restart"),
// and the exact lines to run or write.
struct Fix {
  std::string how;
  std::vector<std::string> lines;
};

struct Check {
  std::string name;  // stable, for --json: "connection", "tls", ...
  Verdict verdict = Verdict::kOk;
  std::string summary;               // one line
  std::vector<std::string> details;  // further lines worth reading
  std::vector<Fix> fixes;            // empty when OK
};

struct Report {
  std::string target;          // user@host:port/dbname, never a password
  std::string server_version;  // empty when not connected
  std::vector<Check> checks;
  bool connected = false;

  // 0: pgrelay can serve this upstream; 1: a check failed; 2: no connection.
  int exit_status() const;
};

// Judges every fact. Trigger capture is what pgrelay serve uses; what only native capture would
// need is reported, and blocks nothing.
Report evaluate(const Facts& facts);

// The report of a failed connection: one FAIL check, with a fix guessed from libpq's message
// (which must already be free of passwords).
Report connection_failed(const std::string& target, const std::string& libpq_message);

// pg_hba.conf quoting for a database or user name.
std::string hba_quote(const std::string& name);

}  // namespace pgrelay::cli::doctor
