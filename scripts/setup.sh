#!/usr/bin/env bash
# Installs everything trainmem needs on a fresh Debian machine, skipping what is already there
# at the right version. Sourced by scripts/serve.sh, scripts/test.sh and scripts/build.sh, run
# by the workflows (.github/workflows/); safe to run again.
#
#   scripts/setup.sh               everything: build, native tests, browser tests
#   scripts/setup.sh --build       only what scripts/build.sh needs (no browser, no Vulkan)
#   scripts/setup.sh --lighthouse  everything, plus Lighthouse for scripts/lighthouse.sh
#
# Why each pin: see ../shared/TOOLCHAIN.md (Trunk and wasm-bindgen must agree with Cargo.lock;
# Debian's binaryen 108 produces a wasm that fails at runtime, so wasm-opt comes from npm).
set -euo pipefail

SETUP_BROWSER=1
SETUP_LIGHTHOUSE=0
for setup_arg in "$@"; do
  case "$setup_arg" in
    --build) SETUP_BROWSER=0 ;;
    --lighthouse) SETUP_LIGHTHOUSE=1 ;;
    # Sourced without arguments, a script's own arguments show through: ignore them.
    *) ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRUNK_VERSION="0.21.14"
WASM_BINDGEN_VERSION="0.2.130"

say() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages: brotli and zopfli (precompressed .br/.gz siblings of dist/), librsvg2-bin
# (rsvg-convert: PNG icons from web/icon.svg), python3 (dist/ post-processing, static server);
# for the tests also Chromium + its driver (browser tests) and lavapipe (native wgpu without a
# GPU).
apt_packages=(brotli zopfli librsvg2-bin python3 ca-certificates)
[ "$SETUP_BROWSER" = 1 ] && apt_packages+=(chromium chromium-driver mesa-vulkan-drivers python3-venv)
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

# Python with torch and transformers at validation/requirements.txt's pins, in validation/.venv:
# the tests run the verify script and count exported configs with them on the CPU (under CI=1 a
# test that cannot run fails, so the full set-up installs them; PyPI only).
if [ "$SETUP_BROWSER" = 1 ]; then
  venv="$ROOT/validation/.venv"
  if ! "$venv/bin/python" -c "import torch, transformers" >/dev/null 2>&1 \
     || [ "$ROOT/validation/requirements.txt" -nt "$venv/.installed" ]; then
    say "installing torch and transformers into validation/.venv (validation/requirements.txt; about a minute)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check -r "$ROOT/validation/requirements.txt"
    touch "$venv/.installed"
  fi
fi

# Lighthouse (scripts/lighthouse.sh only): its own package and lockfile (scripts/lighthouse/),
# installed into .tools/lighthouse, so the tests' npm ci stays small. 12.2.3: newer releases
# want Node 22 (Debian 12 has 18/20). It drives the system Chromium (CHROME_PATH); it never
# downloads a browser.
if [ "$SETUP_LIGHTHOUSE" = 1 ]; then
  lh="$ROOT/.tools/lighthouse"
  if [ ! -x "$lh/node_modules/.bin/lighthouse" ] || ! cmp -s "$ROOT/scripts/lighthouse/package-lock.json" "$lh/package-lock.json"; then
    say "installing Lighthouse (npm, into .tools/lighthouse)"
    mkdir -p "$lh"
    cp "$ROOT/scripts/lighthouse/package.json" "$ROOT/scripts/lighthouse/package-lock.json" "$lh/"
    (cd "$lh" && npm ci --no-audit --no-fund --loglevel=error)
  fi
  export PATH="$lh/node_modules/.bin:$PATH"
fi

# Trunk runs cargo with --offline (Trunk.toml), so the dependencies must be fetched first.
# (scripts/build.sh fetches again with --locked, and fails if Cargo.lock is out of date.)
(cd "$ROOT" && cargo fetch --locked -q 2>/dev/null || cargo fetch -q)

export TRUNK_SKIP_VERSION_CHECK=true
