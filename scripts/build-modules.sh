#!/usr/bin/env bash
# Trunk post-build hook: builds the modules the page fetches only when they are needed into
# $TRUNK_STAGING_DIR, next to the app, with content-hashed names:
#   trainmem-bench-<hash>.js, trainmem-bench-<hash>_bg.wasm
#       the WebGPU benchmark: a Leptos-free wasm-bindgen library (wgpu with WebGPU and WGSL
#       only, the kernels and the sweep; no estimator), loaded when the benchmark is opened;
#   trainmem-frameworks-<hash>.js, trainmem-frameworks-<hash>_bg.wasm
#       framework config files: a Leptos-free library (the yaml_serde, toml and shlex importers
#       and the exporters), loaded when a framework file is first imported or exported;
#   trainmem-more-<hash>.js, trainmem-more-<hash>_bg.wasm
#       the panels a visitor opens later (the planner, the exercises, compare, verify, the embed
#       dialog, the benchmark's page, the config.json import; src/bin/trainmem-more.rs), loaded
#       the first time one of them is opened: the first screen's module holds none of their code.
# Each is loaded with a dynamic import() (index.html's `trainmemLoad`). The page learns the
# hashed names, and their SHA-384 digests, from
#   <meta name="trainmem-NAME" data-js=… data-wasm=… data-wasm-integrity=…>
# and an import map with the scripts' integrity, both written here into index.html. Same
# tools and versions as the main build. The service worker precaches them with the rest
# (scripts/dist.py lists every file of dist/).
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${TRUNK_PROFILE:-release}"
staging="${TRUNK_STAGING_DIR:-dist}"
target_dir="$(cargo metadata --format-version 1 --no-deps --offline | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# NAME FEATURES: one module, bound and optimised into $tmp/NAME/.
module() {
  local name="$1" features="$2"
  local flags=(--target wasm32-unknown-unknown --bin "$name" --no-default-features --features "$features" --offline)
  [ "$profile" = release ] && flags+=(--release)
  cargo build -q "${flags[@]}"
  wasm-bindgen --target web --no-typescript --out-dir "$tmp/$name" --out-name "$name" \
    "$target_dir/wasm32-unknown-unknown/$profile/$name.wasm"
  if [ -d "$tmp/$name/snippets" ]; then
    echo "build-modules.sh: the $name module has JS snippets; they would not carry a content hash" >&2
    exit 1
  fi
  if [ "$profile" = release ]; then
    wasm-opt -Oz "$tmp/$name/${name}_bg.wasm" -o "$tmp/$name/${name}_bg.wasm"
  fi
}
module trainmem-bench gpu
module trainmem-frameworks gpu
module trainmem-more app
python3 - "$tmp" "$staging" trainmem-bench trainmem-frameworks trainmem-more <<'PY'
import base64, hashlib, os, re, sys
tmp, staging, names = sys.argv[1], sys.argv[2], sys.argv[3:]
def digest(data):
    return hashlib.sha256(data).hexdigest()[:16], "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode()
index = os.path.join(staging, "index.html")
html = open(index, encoding="utf-8").read()
html = re.sub(r'\s*<script type="importmap">.*?</script>', "", html, flags=re.S)
integrity, metas = {}, []
for name in names:
    wasm = open(os.path.join(tmp, name, f"{name}_bg.wasm"), "rb").read()
    wasm_hash, wasm_sri = digest(wasm)
    wasm_name = f"{name}-{wasm_hash}_bg.wasm"
    js = open(os.path.join(tmp, name, f"{name}.js"), encoding="utf-8").read()
    js = js.replace(f"{name}_bg.wasm", wasm_name)
    js_hash, js_sri = digest(js.encode("utf-8"))
    js_name = f"{name}-{js_hash}.js"
    # Earlier builds' modules go (a long-cached deploy keeps only what this page names).
    for f in os.listdir(staging):
        if re.fullmatch(re.escape(name) + r"-[0-9a-f]{16}(_bg\.wasm|\.js)", f):
            os.remove(os.path.join(staging, f))
    open(os.path.join(staging, wasm_name), "wb").write(wasm)
    open(os.path.join(staging, js_name), "w", encoding="utf-8").write(js)
    html = re.sub(r'\s*<meta name="' + re.escape(name) + r'"[^>]*>', "", html)
    metas.append(f'<meta name="{name}" data-js="./{js_name}" data-wasm="./{wasm_name}" '
                 f'data-wasm-integrity="{wasm_sri}" />')
    integrity["./" + js_name] = js_sri
    print(f"build-modules.sh: {js_name} ({len(js.encode())} bytes), {wasm_name} ({len(wasm)} bytes)")
importmap = '<script type="importmap">{"integrity": {' + ", ".join(f'"{k}": "{v}"' for k, v in integrity.items()) + '}}</script>'
html = html.replace("<head>", "<head>\n    " + importmap + "\n    " + "\n    ".join(metas), 1)
open(index, "w", encoding="utf-8").write(html)
PY
# Last: pin the CSP over the final index.html (its inline scripts include the import map).
python3 scripts/csp.py "$staging"
