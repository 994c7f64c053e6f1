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
node --test --test-concurrency=1 tests/browser/
