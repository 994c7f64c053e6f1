#!/usr/bin/env bash
# Runs every test of trainmem: formatting, the native unit and integration tests (estimator,
# codec, CLI, charts as SVG, the wgpu benchmark on Mesa's lavapipe), the release web build, and
# the browser tests in headless Chromium. Installs what is missing first (scripts/setup.sh).
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

step "release web build (trunk build --release)"
trunk build --release

step "browser tests (headless Chromium)"
node --test --test-concurrency=1 tests/browser/
