#!/usr/bin/env bash
# The app module's size floor: the first screen's code (estimate, ledger formulas, bar, textbook,
# sequence chart; scripts/size-floor.rs) built for the browser with no UI framework, as Trunk
# builds the app. Prints its brotli size beside the app module's in dist/ (if built): what is
# left between them is Leptos and the panels. Measures; asserts nothing.
#
#   scripts/size-floor.sh
#
# Installs what is missing first, as scripts/build.sh does (scripts/setup.sh --build).
set -euo pipefail
cd "$(dirname "$0")/.."
set --
source scripts/setup.sh --build
root="$PWD"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A crate of its own: the repository as a path dependency without its default features (no
# Leptos, no wgpu), the repository's lock file, the release profile's settings of Cargo.toml.
mkdir -p "$work/src" "$work/.cargo"
cp scripts/size-floor.rs "$work/src/lib.rs"
cp Cargo.lock "$work/Cargo.lock"
cp .cargo/config.toml "$work/.cargo/config.toml"
cat > "$work/Cargo.toml" <<TOML
[package]
name = "size-floor"
version = "0.0.0"
edition = "2021"

[lib]
crate-type = ["cdylib"]

[dependencies]
trainmem = { path = "$root", default-features = false }

$(sed -n '/^\[profile.release\]/,/^$/p' Cargo.toml)

[workspace]
TOML

(cd "$work" && CARGO_TARGET_DIR="$root/target/size-floor" cargo build --quiet --release --target wasm32-unknown-unknown)
wasm-bindgen --target web --out-dir "$work/out" "$root/target/size-floor/wasm32-unknown-unknown/release/size_floor.wasm"
# As scripts/build-modules.sh optimises the benchmark module.
wasm-opt -Oz "$work/out/size_floor_bg.wasm" -o "$work/floor.wasm"

br() { brotli -q 11 -w 24 -c "$1" | wc -c; }
printf 'first screen without a UI (estimate, ledger formulas, bar, textbook, sequence chart): %s bytes raw, %s brotli\n' \
  "$(stat -c %s "$work/floor.wasm")" "$(br "$work/floor.wasm")"
app="$(ls dist/trainmem-*_bg.wasm 2>/dev/null | grep -v bench | head -n 1 || true)"
if [ -n "$app" ]; then
  printf 'the app module (%s): %s bytes raw, %s brotli\n' "$app" "$(stat -c %s "$app")" "$(br "$app")"
else
  echo "no dist/: run scripts/build.sh for the app module's size"
fi
