#!/usr/bin/env python3
"""Trunk post-build hook: pins a Content-Security-Policy into the built index.html.

Trunk inlines a small module script that loads the wasm; the policy allows exactly that script
(by its SHA-256), the page's own files, WebAssembly compilation, and no network origin at all.
Run by Trunk with TRUNK_STAGING_DIR set; runnable by hand on a dist/ folder too.
"""
import base64
import hashlib
import os
import re
import sys

staging = os.environ.get("TRUNK_STAGING_DIR") or (sys.argv[1] if len(sys.argv) > 1 else "dist")
path = os.path.join(staging, "index.html")
html = open(path, encoding="utf-8").read()

hashes = []
for m in re.finditer(r"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", html, re.S):
    digest = hashlib.sha256(m.group(1).encode("utf-8")).digest()
    hashes.append("'sha256-" + base64.b64encode(digest).decode() + "'")

# Trunk's dev server injects a live-reload script that talks over a websocket.
dev = "__TRUNK_ADDRESS__" in html or "trunk" in html and "WebSocket" in html
connect = "'self' ws: wss:" if dev else "'self'"
policy = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self' 'wasm-unsafe-eval' " + " ".join(hashes),
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self'",
        "connect-src " + connect,
        "base-uri 'none'",
        "form-action 'none'",
        "manifest-src 'self'",
    ]
)
meta = '<meta http-equiv="Content-Security-Policy" content="' + policy + '" />'
html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>\s*', "", html)
html = html.replace("<head>", "<head>\n    " + meta, 1)
open(path, "w", encoding="utf-8").write(html)
print("csp.py: pinned", len(hashes), "inline script hash(es)", "(dev)" if dev else "")
