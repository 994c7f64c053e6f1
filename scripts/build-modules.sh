#!/usr/bin/env bash
# Trunk post-build hook: builds the app's lazily loaded wasm modules into $TRUNK_STAGING_DIR, next
# to the app, with content-hashed names:
#   trainmem-bench-<hash>.js, trainmem-bench-<hash>_bg.wasm            the WebGPU benchmark
#   trainmem-frameworks-<hash>.js, trainmem-frameworks-<hash>_bg.wasm  framework config files
# Each is a Leptos-free wasm-bindgen library, loaded by the app with a dynamic import() only when
# it is needed: the benchmark (wgpu with WebGPU and WGSL only, the kernels and the sweep; no
# estimator) when the benchmark is opened, the frameworks module (the yaml_serde, toml and shlex
# importers and the exporters) when a framework file is imported or exported. The page learns the
# hashed names, and their SHA-384 digests, from
#   <meta name="trainmem-bench"> and <meta name="trainmem-frameworks"> (data-js, data-wasm,
#   data-wasm-integrity)
# and an import map with the scripts' integrity, all written here into index.html. Same tools and
# versions as the main build.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${TRUNK_PROFILE:-release}"
staging="${TRUNK_STAGING_DIR:-dist}"
modules=(trainmem-bench trainmem-frameworks)
# One cargo run for both: the library is compiled once for the two.
flags=(--target wasm32-unknown-unknown --no-default-features --features gpu --offline)
for m in "${modules[@]}"; do flags+=(--bin "$m"); done
[ "$profile" = release ] && flags+=(--release)
cargo build -q "${flags[@]}"
target_dir="$(cargo metadata --format-version 1 --no-deps --offline | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for m in "${modules[@]}"; do
  wasm-bindgen --target web --no-typescript --out-dir "$tmp/$m" --out-name "$m" \
    "$target_dir/wasm32-unknown-unknown/$profile/$m.wasm"
  if [ -d "$tmp/$m/snippets" ]; then
    echo "build-modules.sh: the module $m has JS snippets; they would not carry a content hash" >&2
    exit 1
  fi
  if [ "$profile" = release ]; then
    wasm-opt -Oz "$tmp/$m/${m}_bg.wasm" -o "$tmp/$m/${m}_bg.wasm"
  fi
done
python3 - "$tmp" "$staging" "${modules[@]}" <<'PY'
import base64, hashlib, os, re, shutil, sys
tmp, staging, modules = sys.argv[1], sys.argv[2], sys.argv[3:]
def digest(data):
    return hashlib.sha256(data).hexdigest()[:16], "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode()
index = os.path.join(staging, "index.html")
html = open(index, encoding="utf-8").read()
html = re.sub(r'\s*<script type="importmap">.*?</script>', "", html, flags=re.S)
metas, integrity = [], {}
for m in modules:
    wasm = open(os.path.join(tmp, m, f"{m}_bg.wasm"), "rb").read()
    wasm_hash, wasm_sri = digest(wasm)
    wasm_name = f"{m}-{wasm_hash}_bg.wasm"
    js = open(os.path.join(tmp, m, f"{m}.js"), encoding="utf-8").read()
    js = js.replace(f"{m}_bg.wasm", wasm_name)
    js_hash, js_sri = digest(js.encode("utf-8"))
    js_name = f"{m}-{js_hash}.js"
    # Earlier builds' modules go (a long-cached deploy keeps only what this page names).
    for f in os.listdir(staging):
        if re.fullmatch(re.escape(m) + r"-[0-9a-f]{16}(_bg\.wasm|\.js)", f):
            os.remove(os.path.join(staging, f))
    open(os.path.join(staging, wasm_name), "wb").write(wasm)
    open(os.path.join(staging, js_name), "w", encoding="utf-8").write(js)
    html = re.sub(r'\s*<meta name="' + re.escape(m) + r'"[^>]*>', "", html)
    metas.append(f'<meta name="{m}" data-js="./{js_name}" data-wasm="./{wasm_name}" data-wasm-integrity="{wasm_sri}" />')
    integrity["./" + js_name] = js_sri
    print(f"build-modules.sh: {js_name} ({len(js.encode())} bytes), {wasm_name} ({len(wasm)} bytes)")
importmap = '<script type="importmap">{"integrity": {' + ", ".join(f'"{k}": "{v}"' for k, v in integrity.items()) + '}}</script>'
html = html.replace("<head>", "<head>\n    " + "\n    ".join([importmap] + metas), 1)
open(index, "w", encoding="utf-8").write(html)
PY
# Last: pin the CSP over the final index.html (its inline scripts include the import map).
python3 scripts/csp.py "$staging"
