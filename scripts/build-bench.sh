#!/usr/bin/env bash
# Trunk post-build hook: builds the benchmark page as its own wasm module into
# $TRUNK_STAGING_DIR/bench/, so the app loads WebGPU, wgpu and the kernels only when the
# benchmark is opened (src/ui/bench_panel.rs). Same tools and versions as the main build.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${TRUNK_PROFILE:-release}"
staging="${TRUNK_STAGING_DIR:-dist}"
flags=(--target wasm32-unknown-unknown --bin trainmem-bench --offline)
[ "$profile" = release ] && flags+=(--release)
cargo build -q "${flags[@]}"
target_dir="$(cargo metadata --format-version 1 --no-deps --offline | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
out="$staging/bench"
mkdir -p "$out"
wasm-bindgen --target web --no-typescript --out-dir "$out" --out-name trainmem-bench "$target_dir/wasm32-unknown-unknown/$profile/trainmem-bench.wasm"
if [ "$profile" = release ]; then
  wasm-opt -Oz "$out/trainmem-bench_bg.wasm" -o "$out/trainmem-bench_bg.wasm"
fi
echo "build-bench.sh: $(du -b "$out/trainmem-bench_bg.wasm" | cut -f1) bytes of wasm in bench/"
