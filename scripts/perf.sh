#!/usr/bin/env bash
# Measures the release page: bundle sizes (raw, gzip, brotli), time to interactive in headless
# Chromium on loopback, and the latency from an input change to the updated ledger (median and
# p95 over 200 changes). Prints a report; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
trunk build --release >/dev/null
echo "== bundle (dist/)"
printf '%-44s %10s %10s %10s\n' file raw gzip brotli
total_br=0
for f in dist/*.wasm dist/*.js dist/*.css dist/index.html; do
  raw=$(stat -c %s "$f"); gz=$(gzip -9 -c "$f" | wc -c); br=$(brotli -q 11 -c "$f" | wc -c)
  total_br=$((total_br + br))
  printf '%-44s %10d %10d %10d\n' "$(basename "$f")" "$raw" "$gz" "$br"
done
echo "first load, brotli: $total_br bytes"
node scripts/perf.mjs
