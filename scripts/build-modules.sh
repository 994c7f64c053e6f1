#!/usr/bin/env bash
# Trunk post-build hook: builds the WebGPU benchmark module into $TRUNK_STAGING_DIR, next to
# the app, with content-hashed names:
#   trainmem-bench-<hash>.js, trainmem-bench-<hash>_bg.wasm
# It is a Leptos-free wasm-bindgen library (wgpu with WebGPU and WGSL only, the kernels and the
# sweep; no estimator), loaded by the app with a dynamic import() only when the benchmark is
# opened. The page learns the hashed names, and their SHA-384 digests, from
#   <meta name="trainmem-bench" data-js=… data-wasm=… data-wasm-integrity=…>
# and an import map with the script's integrity, both written here into index.html. Same
# tools and versions as the main build.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${TRUNK_PROFILE:-release}"
staging="${TRUNK_STAGING_DIR:-dist}"
flags=(--target wasm32-unknown-unknown --bin trainmem-bench --no-default-features --features gpu --offline)
[ "$profile" = release ] && flags+=(--release)
cargo build -q "${flags[@]}"
target_dir="$(cargo metadata --format-version 1 --no-deps --offline | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
wasm-bindgen --target web --no-typescript --out-dir "$tmp" --out-name trainmem-bench \
  "$target_dir/wasm32-unknown-unknown/$profile/trainmem-bench.wasm"
if [ -d "$tmp/snippets" ]; then
  echo "build-modules.sh: the benchmark module has JS snippets; they would not carry a content hash" >&2
  exit 1
fi
if [ "$profile" = release ]; then
  wasm-opt -Oz "$tmp/trainmem-bench_bg.wasm" -o "$tmp/trainmem-bench_bg.wasm"
fi
python3 - "$tmp" "$staging" <<'PY'
import base64, hashlib, os, re, shutil, sys
tmp, staging = sys.argv[1], sys.argv[2]
def digest(data):
    return hashlib.sha256(data).hexdigest()[:16], "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode()
wasm = open(os.path.join(tmp, "trainmem-bench_bg.wasm"), "rb").read()
wasm_hash, wasm_sri = digest(wasm)
wasm_name = f"trainmem-bench-{wasm_hash}_bg.wasm"
js = open(os.path.join(tmp, "trainmem-bench.js"), encoding="utf-8").read()
js = js.replace("trainmem-bench_bg.wasm", wasm_name)
js_hash, js_sri = digest(js.encode("utf-8"))
js_name = f"trainmem-bench-{js_hash}.js"
# Earlier builds' modules go (a long-cached deploy keeps only what this page names).
for f in os.listdir(staging):
    if re.fullmatch(r"trainmem-bench-[0-9a-f]{16}(_bg\.wasm|\.js)", f):
        os.remove(os.path.join(staging, f))
open(os.path.join(staging, wasm_name), "wb").write(wasm)
open(os.path.join(staging, js_name), "w", encoding="utf-8").write(js)
index = os.path.join(staging, "index.html")
html = open(index, encoding="utf-8").read()
html = re.sub(r'\s*<meta name="trainmem-bench"[^>]*>', "", html)
html = re.sub(r'\s*<script type="importmap">.*?</script>', "", html, flags=re.S)
meta = (f'<meta name="trainmem-bench" data-js="./{js_name}" data-wasm="./{wasm_name}" '
        f'data-wasm-integrity="{wasm_sri}" />')
importmap = '<script type="importmap">{"integrity": {"./' + js_name + '": "' + js_sri + '"}}</script>'
html = html.replace("<head>", "<head>\n    " + importmap + "\n    " + meta, 1)
open(index, "w", encoding="utf-8").write(html)
print(f"build-modules.sh: {js_name} ({len(js.encode())} bytes), {wasm_name} ({len(wasm)} bytes)")
PY
# Last: pin the CSP over the final index.html (its inline scripts include the import map).
python3 scripts/csp.py "$staging"
