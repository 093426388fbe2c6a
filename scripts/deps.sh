# Sourced by run.sh and test.sh: makes sure the Debian packages pgrelay needs are installed.
# As root it installs what is missing with apt-get; otherwise it prints the exact command to run.

# Packages to build and run pgrelay.
PGRELAY_BUILD_PACKAGES=(
  g++ cmake ninja-build pkg-config
  libssl-dev libpq-dev libcli11-dev libidn-dev libicu-dev nlohmann-json3-dev
  libasio-dev libpg-query-dev libprotobuf-c-dev libnats-dev libcpp-httplib-dev
)
# The server programs pgrelay's private PostgreSQL (the default, without --upstream) runs.
PGRELAY_RUN_PACKAGES=(postgresql-15)
# Additional packages to build and run every test, fuzzer and benchmark.
PGRELAY_TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  postgresql-15 postgresql-client-15
  python3-psycopg2
  nats-server openssl
  chromium
)
# The end-to-end tests install postgres.js and zero-cache with npm; a machine that already has
# Node (e.g. from NodeSource, which bundles npm) keeps it, otherwise Debian's npm brings both.
if ! command -v npm >/dev/null 2>&1; then
  PGRELAY_TEST_PACKAGES+=(npm)
fi

pgrelay_missing_packages() {
  local missing=()
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  echo "${missing[@]}"
}

# pgrelay_ensure_packages PKG...: installs missing packages as root, or explains and fails.
pgrelay_ensure_packages() {
  local missing
  missing=$(pgrelay_missing_packages "$@")
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "pgrelay: these Debian packages are missing: $missing" >&2
    echo "pgrelay: install them, then run this command again:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y $missing" >&2
    return 1
  fi
  echo "pgrelay: installing missing packages: $missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || return 1
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >&2 || return 1
}
