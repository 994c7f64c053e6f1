#!/usr/bin/env bash
# Measures the release page and prints a report; asserts nothing.
#   1. the files: raw, gzip -9 and brotli -q 11 sizes; what the default page loads; the
#      later panels' module and the benchmark module (each loaded only when opened) and the
#      frameworks module (the first framework file imported or exported);
#   2. what is in each wasm module, by crate (twiggy, on names kept by wasm-opt -g): Leptos and
#      the estimator are in the app's module once, and not in the benchmark's;
#   3. page speed by the page's own clock (scripts/perf.mjs): navigation start to the first
#      verdict and to the first input reflected (median of 7 loads), input to every visible view
#      updated (p95 of 200 changes), and the charts' sweep + draw (p95).
# Usage: scripts/perf.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
[ "${1:-}" = "--no-build" ] || scripts/build.sh >/dev/null

echo "== files (dist/), bytes"
printf '%-48s %10s %10s %10s\n' file raw gzip brotli
first=0; bench=0; more=0; frameworks=0
for f in dist/*; do
  [ -f "$f" ] || continue
  # The .br and .gz siblings are the same files compressed: counted once, by their originals.
  case "$f" in *.br | *.gz) continue ;; esac
  raw=$(stat -c %s "$f"); gz=$(gzip -9 -c "$f" | wc -c); br=$(brotli -q 11 -c "$f" | wc -c)
  printf '%-48s %10d %10d %10d\n' "$(basename "$f")" "$raw" "$gz" "$br"
  case "$(basename "$f")" in
    trainmem-bench-*) bench=$((bench + br)) ;;
    trainmem-more-*) more=$((more + br)) ;;
    trainmem-frameworks-*) frameworks=$((frameworks + br)) ;;
    *) first=$((first + br)) ;;
  esac
done
echo "default page (index.html, app js + wasm, css, icon), brotli: $first bytes"
echo "later panels' module (js + wasm, fetched when one is opened), brotli: $more bytes"
echo "benchmark module (js + wasm, fetched on open), brotli: $bench bytes"
echo "frameworks module (js + wasm, fetched on the first import or export), brotli: $frameworks bytes"

target_dir="$(cargo metadata --format-version 1 --no-deps --offline | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
if ! command -v twiggy >/dev/null 2>&1; then
  echo
  echo "(twiggy not on PATH — \`cargo install twiggy\` — skipping the module contents)"
elif [ ! -f "$target_dir/wasm32-unknown-unknown/release/trainmem-bench.wasm" ]; then
  echo
  echo "(the modules' release wasm are not in $target_dir: run without --no-build to list their contents)"
else
  echo
  echo "== what each wasm module holds, by crate (twiggy; code and data bytes before compression)"
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  for bin in trainmem trainmem-bench; do
    wasm-bindgen --target web --no-typescript --out-dir "$tmp/$bin" "$target_dir/wasm32-unknown-unknown/release/$bin.wasm"
    wasm-opt -Oz -g "$tmp/$bin/${bin}_bg.wasm" -o "$tmp/$bin.wasm"
    twiggy top -n 1000000 -f csv "$tmp/$bin.wasm" > "$tmp/$bin.csv"
  done
  python3 - "$tmp/trainmem.csv" "$tmp/trainmem-bench.csv" <<'PY'
import csv, re, sys, collections
GROUPS = ["leptos", "tachys", "reactive_graph", "trainmem::estimator", "trainmem::ui", "trainmem::plots", "trainmem::config",
          "trainmem::bench", "wgpu", "plotters", "serde_json", "core", "alloc"]
def groups(path):
    agg = collections.Counter()
    for r in csv.DictReader(open(path)):
        name, size = r["Name"], int(r["ShallowSize"])
        if name.startswith(("\"function names\"", "custom section")):
            continue
        for g in GROUPS:
            if re.match(r"^<?&?(mut )?" + re.escape(g) + r"(\[[0-9a-f]+\])?::", name):
                agg[g] += size
                break
        else:
            agg["other (generic instances, data, glue)"] += size
    return agg
app, bench = groups(sys.argv[1]), groups(sys.argv[2])
print(f"{'':40} {'app':>10} {'bench':>10}")
for g in GROUPS + ["other (generic instances, data, glue)"]:
    print(f"{g:40} {app[g]:>10} {bench[g]:>10}")
for g in ["leptos", "tachys", "reactive_graph", "trainmem::estimator", "trainmem::ui"]:
    print(f"{g} in the benchmark module: {'yes' if bench[g] else 'no'}")
PY
fi

echo
echo "== page speed (the page's own clock, headless Chromium on loopback)"
node scripts/perf.mjs
