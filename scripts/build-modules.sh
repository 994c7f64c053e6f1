#!/usr/bin/env bash
# Trunk post-build hook: builds the app's lazily loaded wasm modules into $TRUNK_STAGING_DIR:
#   extras/  the bar, charts, textbook and config.json import (loaded right after first paint)
#   bench/   the WebGPU benchmark (loaded only when opened)
# so the first load carries only the inputs, the verdict and the ledger. Same tools and versions
# as the main build.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${TRUNK_PROFILE:-release}"
staging="${TRUNK_STAGING_DIR:-dist}"
flags=(--target wasm32-unknown-unknown --bin trainmem-extras --bin trainmem-bench --offline)
[ "$profile" = release ] && flags+=(--release)
cargo build -q "${flags[@]}"
target_dir="$(cargo metadata --format-version 1 --no-deps --offline | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
for module in extras bench; do
  out="$staging/$module"
  mkdir -p "$out"
  wasm-bindgen --target web --no-typescript --out-dir "$out" --out-name "trainmem-$module" \
    "$target_dir/wasm32-unknown-unknown/$profile/trainmem-$module.wasm"
  if [ "$profile" = release ]; then
    wasm-opt -Oz "$out/trainmem-${module}_bg.wasm" -o "$out/trainmem-${module}_bg.wasm"
  fi
  echo "build-modules.sh: $module/ $(du -b "$out/trainmem-${module}_bg.wasm" | cut -f1) bytes of wasm"
done
