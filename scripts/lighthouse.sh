#!/usr/bin/env bash
# Lighthouse, mobile preset, on dist/ served gzip-compressed from a sub-path, driving the system
# Chromium (CHROME_PATH=/usr/bin/chromium; never a downloaded browser): performance,
# best practices, accessibility, SEO (median of 3 runs), what weighs on them, and whether
# Chromium finds the app installable. Reports; asserts nothing (speed is measured, not tested).
#
#   scripts/lighthouse.sh [--runs N] [--encoding gzip|br|none] [--json FILE] [--report FILE]
# Builds dist/ with scripts/build.sh first unless it is already a build of it
# (TRAINMEM_LIGHTHOUSE_REBUILD=1 forces a new build).
set -euo pipefail
cd "$(dirname "$0")/.."
set -- "$@"
lh_args=("$@")
set --
source scripts/setup.sh --lighthouse
if [ ! -f dist/sw.js ] || [ "${TRAINMEM_LIGHTHOUSE_REBUILD:-0}" = 1 ]; then
  scripts/build.sh
fi
export CHROME_PATH="${CHROME_PATH:-/usr/bin/chromium}"
exec node scripts/lighthouse.mjs "${lh_args[@]}"
