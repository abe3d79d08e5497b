#!/usr/bin/env bash
# Idempotent: installs (with apt-get) whatever the build, the demo and the test
# suite need and is not already on the machine. Safe to run again and again;
# it asks apt nothing when every package is present.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git
  libevent-dev libsqlite3-dev sqlite3 libjansson-dev libssl-dev openssl
  # The PostgreSQL store (src/server/store/store_pg.c links libpq) and the
  # real PostgreSQL its tests start in a temporary directory
  # (tests/integration/pg.py: initdb and postgres from
  # /usr/lib/postgresql/*/bin; Debian's package also enables a cluster on
  # :5432 that the tests do not use: `systemctl disable --now postgresql`).
  libpq-dev postgresql
  libcurl4-openssl-dev curl
  libcmocka-dev
  python3 systemd file
  nodejs npm
  clang libclang-rt-14-dev
  # promtool (tests/integration/test_metrics.py validates /metrics with
  # `promtool check metrics`); Debian ships it only in the server package.
  # Its unit is enabled on install: `systemctl disable --now prometheus` on
  # a dev box that does not want a Prometheus on :9090.
  prometheus
  # Headless Chromium drives the dashboard's browser test
  # (tests/integration/test_dashboard.py, over the DevTools protocol).
  chromium
  # HAProxy runs conf/haproxy.cfg in front of two servers
  # (tests/integration/test_haproxy.py). Installed, its unit starts with
  # Debian's default config, which listens on no port.
  haproxy
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

# node and npm may come from outside Debian's packages (the machine image has
# its own); accept any working node >= 18 rather than fight it.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  tmp=()
  for p in "${missing[@]}"; do
    case "$p" in nodejs|npm) ;; *) tmp+=("$p") ;; esac
  done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >&2
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
