#!/usr/bin/env bash
# Installs everything trainmem needs on a fresh Debian machine, skipping what is already there
# at the right version. Sourced by scripts/serve.sh and scripts/test.sh; safe to run again.
#
# Why each pin: see ../shared/TOOLCHAIN.md (Trunk and wasm-bindgen must agree with Cargo.lock;
# Debian's binaryen 108 produces a wasm that fails at runtime, so wasm-opt comes from npm).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRUNK_VERSION="0.21.14"
WASM_BINDGEN_VERSION="0.2.130"

say() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages: Chromium + its driver (browser tests), lavapipe (native wgpu without a GPU),
# brotli (size report), python3 (static server).
apt_packages=(chromium chromium-driver mesa-vulkan-drivers brotli python3 ca-certificates)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust toolchain and the wasm target.
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    say "installing rustup (crates.io toolchain)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustup >/dev/null
    rustup default stable
  fi
fi
export PATH="$HOME/.cargo/bin:$PATH"
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  say "adding the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown
fi

# Trunk (builds and serves the app) — looks its tools up on PATH, never downloads (Trunk.toml).
if ! trunk --version 2>/dev/null | grep -qx "trunk $TRUNK_VERSION"; then
  say "installing trunk $TRUNK_VERSION (several minutes on 2 cores)"
  cargo install --locked trunk --version "$TRUNK_VERSION"
fi

# wasm-bindgen CLI: must equal the wasm-bindgen crate version pinned in Cargo.toml.
# Not --locked: its lockfile pins a webpki-roots version the registry here lacks.
if ! wasm-bindgen --version 2>/dev/null | grep -q "wasm-bindgen $WASM_BINDGEN_VERSION"; then
  say "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION"
  cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
fi

# npm tools: binaryen's wasm-opt (≥ 116; Debian's 108 breaks the wasm) and playwright-core
# (drives the system Chromium; never downloads a browser).
if [ ! -x "$ROOT/node_modules/.bin/wasm-opt" ] || [ ! -d "$ROOT/node_modules/playwright-core" ] \
   || [ "$ROOT/package-lock.json" -nt "$ROOT/node_modules/.package-lock.json" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    say "installing nodejs and npm"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  say "installing npm tools (binaryen, playwright-core)"
  (cd "$ROOT" && npm ci --no-audit --no-fund --loglevel=error)
fi
export PATH="$ROOT/node_modules/.bin:$PATH"

# Trunk runs cargo with --offline (Trunk.toml), so the dependencies must be fetched first.
(cd "$ROOT" && cargo fetch --locked -q 2>/dev/null || cargo fetch -q)

export TRUNK_SKIP_VERSION_CHECK=true
