#!/usr/bin/env bash
# Runs every test of trainmem: formatting, the native unit and integration tests (estimator,
# codec, CLI, charts as SVG, the wgpu benchmark on Mesa's lavapipe), the deploy build as the
# Pages workflow runs it, and the browser tests in headless Chromium (the app, the charts, the
# benchmark, and the deploy: sub-path hosting, caching, offline, updates, installability). Installs what is missing first (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

# Native wgpu runs on lavapipe (Vulkan on the CPU) when there is no GPU.
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
chmod 700 "$XDG_RUNTIME_DIR"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "cargo fmt --check"
cargo fmt --check

step "native tests (cargo test)"
cargo test --locked

# The deploy build, exactly as the Pages workflow runs it: its `run:` lines, from a clean checkout
# with an empty target dir (CI's clone is fresh anyway, so this costs CI little beyond the
# build it needs). Its dist/ is the one every browser test below loads. For quick local
# iterations, TRAINMEM_QUICK_BUILD=1 runs scripts/build.sh in place instead (incremental).
if [ "${TRAINMEM_QUICK_BUILD:-0}" = 1 ]; then
  step "web build in place (scripts/build.sh; TRAINMEM_QUICK_BUILD=1)"
  scripts/build.sh
else
  step "the Pages workflow's build steps from a clean checkout (scripts/workflow-steps.sh)"
  scripts/workflow-steps.sh .github/workflows/pages.yml build --keep target/pages-site
  export TRAINMEM_PAGES_SITE="$PWD/target/pages-site"
fi

step "browser tests (headless Chromium)"
# One file at a time, each bounded: a test that hangs fails after its own limit
# (TEST_TIMEOUT_MS in tests/browser/harness.mjs), and a file that hangs past FILE_LIMIT_S anyway
# (a wedged browser) is stopped, so nothing can hold CI until its own limit. A file that fails
# runs once more, alone: a failure that repeats fails the run; one that does not is printed in
# full and named at the end as flaky, so that it is seen and fixed, not hidden.
FILE_LIMIT_S="${TRAINMEM_BROWSER_FILE_LIMIT_S:-1200}"
run_file() { timeout --kill-after=30 "$FILE_LIMIT_S" node --test --test-force-exit "$1"; }
flaky=()
failed=()
for file in tests/browser/*.test.mjs; do
  printf '\n\033[1m-- %s\033[0m (%s)\n' "$file" "$(date -u +%H:%M:%S)"
  run_file "$file" && continue
  rc=$?
  printf '\n\033[1m-- %s failed (exit %s%s); running it once more\033[0m\n' "$file" "$rc" "$([ "$rc" = 124 ] && echo ", stopped after ${FILE_LIMIT_S} s")"
  if run_file "$file"; then flaky+=("$file"); else failed+=("$file"); fi
done
if [ "${#flaky[@]}" -gt 0 ]; then
  printf '\n\033[1;33mFLAKY\033[0m (failed, then passed alone; the first run is printed above): %s\n' "${flaky[*]}"
fi
if [ "${#failed[@]}" -gt 0 ]; then
  printf '\n\033[1;31mFAILED\033[0m (twice): %s\n' "${failed[*]}"
  exit 1
fi
