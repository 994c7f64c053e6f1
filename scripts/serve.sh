#!/usr/bin/env bash
# Builds and serves trainmem on http://127.0.0.1:8080 (rebuilding on every change).
# Installs what is missing first (scripts/setup.sh). Extra arguments go to `trunk serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
exec trunk serve --release "$@"
