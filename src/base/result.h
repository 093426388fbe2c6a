// Errors as values: Error carries a SQLSTATE, message, detail and hint; Result<T> is a T or an
// Error.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace pgrelay {

// SQLSTATE codes used across layers (Postgres's errcodes.txt names them).
namespace sqlstate {
inline constexpr const char* kProtocolViolation = "08P01";
inline constexpr const char* kConnectionException = "08000";
inline constexpr const char* kConnectionFailure = "08006";
inline constexpr const char* kInvalidAuthorization = "28000";
inline constexpr const char* kInvalidPassword = "28P01";
inline constexpr const char* kSyntaxError = "42601";
inline constexpr const char* kInvalidParameterValue = "22023";
inline constexpr const char* kInvalidName = "42602";
inline constexpr const char* kUndefinedObject = "42704";
inline constexpr const char* kInvalidCatalogName = "3D000";  // no such database
inline constexpr const char* kDuplicateObject = "42710";
inline constexpr const char* kInsufficientPrivilege = "42501";
inline constexpr const char* kFeatureNotSupported = "0A000";
inline constexpr const char* kObjectInUse = "55006";
inline constexpr const char* kObjectNotInPrerequisiteState = "55000";
inline constexpr const char* kProgramLimitExceeded = "54000";
inline constexpr const char* kDataCorrupted = "XX001";
inline constexpr const char* kInternalError = "XX000";
inline constexpr const char* kIoError = "58030";
inline constexpr const char* kDiskFull = "53100";
inline constexpr const char* kInsufficientResources = "53000";
inline constexpr const char* kSystemError = "58000";
inline constexpr const char* kUndefinedFile = "58P01";
inline constexpr const char* kAdminShutdown = "57P01";
inline constexpr const char* kQueryCanceled = "57014";
}  // namespace sqlstate

struct Error {
  std::string sqlstate = sqlstate::kInternalError;
  std::string message;
  std::string detail;
  std::string hint;

  static Error protocol(std::string msg, std::string hint_text = {}) {
    return Error{sqlstate::kProtocolViolation, std::move(msg), {}, std::move(hint_text)};
  }
  static Error make(const char* code, std::string msg, std::string hint_text = {},
                    std::string detail_text = {}) {
    return Error{code, std::move(msg), std::move(detail_text), std::move(hint_text)};
  }
  // "message (detail) hint": for logs and command-line output.
  std::string to_string() const {
    std::string s = message;
    if (!detail.empty()) s += "\nDETAIL:  " + detail;
    if (!hint.empty()) s += "\nHINT:  " + hint;
    return s;
  }
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }
  Error&& take_error() {
    assert(!ok());
    return std::get<1>(std::move(v_));
  }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Error> v_;
};

// Result<void>: success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}  // NOLINT

  static Status ok_status() { return Status(); }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(failed_);
    return error_;
  }

 private:
  Error error_;
  bool failed_ = false;
};

}  // namespace pgrelay

// Propagate an error from an expression yielding Result<T> or Status.
#define PGRELAY_TRY(expr)                                              \
  do {                                                                 \
    auto&& pgrelay_try_result_ = (expr);                               \
    if (!pgrelay_try_result_.ok()) return pgrelay_try_result_.error(); \
  } while (0)

// The same inside a coroutine (co_return instead of return).
#define PGRELAY_CO_TRY(expr)                                              \
  do {                                                                    \
    auto&& pgrelay_try_result_ = (expr);                                  \
    if (!pgrelay_try_result_.ok()) co_return pgrelay_try_result_.error(); \
  } while (0)
