#!/usr/bin/env python3
"""Post-processes Trunk's dist/ into what every deploy ships (run by scripts/build.sh).

    dist.py process DIST          after `trunk build --release`
    dist.py site DIST SITE [DIR]  the Pages site: DIST at the root, every released version's
                                  dist/ (DIR/trainmem-web-vX.Y.Z.tar.gz) under SITE/vX.Y.Z/

`process` discovers the files from DIST itself (whatever the app's build lays out), then:
  1. icons: PNGs (180, 192, 512, maskable 512) rendered from web/icon*.svg with rsvg-convert,
     and the SVG, all under content-hashed names;
  2. checks that every file except index.html carries a content hash in its name (a 16-hex
     token, as Trunk and scripts/build-modules.sh write them), failing loudly otherwise
     (web/unhashed.txt lists the exceptions still allowed);
  3. manifest.webmanifest (web/manifest.json plus the icons);
  4. index.html: theme colour, manifest and touch-icon links, and web/register.js inline
     (the service worker's registration and the "updated" notice); the CSP is pinned again by
     scripts/csp.py so that it allows exactly the page's inline scripts; checks that every URL
     in the page is relative and names a file of DIST; stamps the build id; the app's wasm
     is fetched after the first paint and compiled in a worker (`after_first_paint`,
     web/compile-worker.js under a hashed name), not preloaded with the page;
  5. sw.js from web/sw.js: the build id and the precache list (every file, by hashed name);
  6. _headers (Netlify, Cloudflare Pages): the page's CSP on the page and the worker, one-year
     immutable caching for hashed files, no-cache for the page, the worker, the manifest and
     anything not named by its content;
  7. .br (brotli -q 11 -w 24) and .gz (zopfli, or gzip -9 without it) siblings of every
     compressible file, kept where smaller, for hosts that serve precompressed files;
and prints every file's raw, gzip and brotli size.
"""
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEB = os.path.join(ROOT, "web")

#: A content hash in a file or folder name: 16 hex digits between separators.
# Trunk prints its 64-bit content hash in hex without leading zeros: 16 digits, or fewer
# (one in sixteen builds has 15).
HASH_TOKEN = re.compile(r"(?:^|[-_.])[0-9a-f]{12,16}(?=[-_.]|$)")
#: wasm-bindgen's snippet folders are named for the crate, not for their content.
SNIPPETS = re.compile(r"(?:^|/)snippets/")
#: Served with no-cache and named without a hash, by design.
STABLE_NAMES = {"index.html", "sw.js", "manifest.webmanifest"}
#: Written by this script; never precached, hashed or compressed.
META_FILES = {"_headers", "versions.json"}
COMPRESSIBLE = {".html", ".js", ".mjs", ".css", ".wasm", ".svg", ".json", ".webmanifest", ".txt", ".map"}
IMMUTABLE = "public, max-age=31536000, immutable"
NO_CACHE = "no-cache"
#: (file name stem, source svg, pixels, manifest purpose or None for the touch icon only)
PNG_ICONS = [
    ("icon-180", "icon.svg", 180, None),
    ("icon-192", "icon.svg", 192, "any"),
    ("icon-512", "icon.svg", 512, "any"),
    ("icon-maskable-512", "icon-maskable.svg", 512, "maskable"),
]
THEME_COLOR = "#0a62a8"
HEX16 = 16


def fail(msg):
    print(f"dist.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def say(msg):
    print(f"dist.py: {msg}")


def files_of(dist):
    """Every file under dist, as a relative path with '/' separators, sorted."""
    out = []
    for here, _, names in os.walk(dist):
        for n in names:
            out.append(os.path.relpath(os.path.join(here, n), dist).replace(os.sep, "/"))
    return sorted(out)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read(path, mode="r"):
    with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        return f.read()


def write(path, data):
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
        f.write(data)


def hashed_name(stem, data, ext):
    return f"{stem}-{sha256(data)[:HEX16]}{ext}"


# ---------------------------------------------------------------------------------------------
# process


def make_icons(dist):
    """Renders the PNG icons and copies the SVG, under content-hashed names; returns
    (manifest icon entries, touch icon name)."""
    if not shutil.which("rsvg-convert"):
        fail("rsvg-convert is missing (Debian package librsvg2-bin; scripts/setup.sh installs it)")
    icons, touch = [], None
    svg = read(os.path.join(WEB, "icon.svg"), "rb")
    svg_name = hashed_name("icon", svg, ".svg")
    write(os.path.join(dist, svg_name), svg)
    icons.append({"src": svg_name, "sizes": "any", "type": "image/svg+xml", "purpose": "any"})
    for stem, source, px, purpose in PNG_ICONS:
        png = subprocess.run(
            ["rsvg-convert", "--width", str(px), "--height", str(px), "--format", "png", os.path.join(WEB, source)],
            check=True,
            capture_output=True,
        ).stdout
        if not png.startswith(b"\x89PNG"):
            fail(f"rsvg-convert did not write a PNG for {source}")
        name = hashed_name(stem, png, ".png")
        write(os.path.join(dist, name), png)
        if purpose:
            icons.append({"src": name, "sizes": f"{px}x{px}", "type": "image/png", "purpose": purpose})
        else:
            touch = name
    return icons, touch


def allowed_unhashed(files):
    path = os.path.join(WEB, "unhashed.txt")
    allowed = [ln.strip() for ln in read(path).splitlines() if ln.strip() and not ln.startswith("#")]
    for a in allowed:
        if a not in files:
            say(f"warning: web/unhashed.txt names {a}, which the build no longer has: delete the entry")
    return set(allowed)


def classify(files):
    """Splits the app's files into content-hashed and revalidated ones; fails on a file that is
    neither named by its content nor allowed."""
    allowed = allowed_unhashed(files)
    hashed, revalidate, bad = [], [], []
    for f in files:
        if f in STABLE_NAMES or f in META_FILES:
            continue
        if SNIPPETS.search(f) and any(HASH_TOKEN.search(seg) for seg in f.split("/")):
            revalidate.append(f)  # named for its crate: may change under the same name
        elif HASH_TOKEN.search(os.path.basename(f)):
            hashed.append(f)
        elif f in allowed:
            say(f"warning: {f} has no content hash (allowed by web/unhashed.txt): served no-cache")
            revalidate.append(f)
        else:
            bad.append(f)
    if bad:
        fail(
            "these files carry no content hash in their names, so a long cache could pair them with "
            "another build's page: " + ", ".join(bad)
        )
    return hashed, revalidate


def check_urls(html, dist):
    """Every URL the page names is relative and names a file of dist."""
    names = set(files_of(dist))
    problems = []
    for attr, url in re.findall(r'\s((?:src|href|data-[a-z-]+))="([^"]*)"', html):
        if attr.startswith("data-") and not url.startswith("./"):
            continue
        if re.match(r"^(?:[a-z][a-z0-9+.-]*:|//|/)", url, re.I):
            problems.append(f"{attr}={url} is not relative")
            continue
        path = url.split("#")[0].split("?")[0]
        path = path[2:] if path.startswith("./") else path
        if path and path not in names:
            problems.append(f"{attr}={url} names no file of the build")
    static_imports = r"""\bimport\s+(?:[\w$*{},\s]+?\s+from\s*)?['"]([^'"]+)['"]"""
    for url in re.findall(static_imports, html):
        if not url.startswith("./"):
            problems.append(f"import {url} is not relative")
        elif url[2:] not in names:
            problems.append(f"import {url} names no file of the build")
    if problems:
        fail("index.html: " + "; ".join(problems))


def inline_script(js):
    """web/register.js without its whole-line comments."""
    return "\n".join(ln for ln in js.splitlines() if not ln.lstrip().startswith("//")).strip()


#: Trunk's preload of the app's wasm: `<link rel="preload" href=… integrity=… as="fetch" …>`.
WASM_PRELOAD = re.compile(r'<link rel="preload" href="(\./[^"]+_bg\.wasm)" crossorigin="anonymous" integrity="([^"]+)" as="fetch" type="application/wasm">')
GLUE_IMPORT = re.compile(r"import init, \* as bindings from '(\./[^']+\.js)';")


def after_first_paint(html, worker):
    """Starts the app's wasm after the page's first paint, compiled off the main thread.

    index.html paints the page's header at once; preloaded with the page, the 500 KB wasm would
    compete with it for a slow link (Lighthouse's simulated mobile network counts every request
    that starts before the largest paint). So the loader waits for a frame (or 100 ms where
    frames are throttled, as in a hidden tab), then has `worker` (web/compile-worker.js) fetch
    and compile the wasm, with the subresource integrity the preload carried, and instantiates
    the compiled module; without workers it fetches the wasm itself, as Trunk's loader does.
    The worker gets the glue's URL and the page's query too: before it hands the module back,
    it runs the first screen's analysis once, so that code is compiled off the main thread
    (src/ui/warm.rs). Warmed, it stays as the page's analysis worker (`trainmemAnalysis`, with
    the page's first answers as `trainmemFound`: src/ui/analysis.rs); else it closes.
    """
    m = WASM_PRELOAD.search(html)
    if not m:
        fail("index.html: Trunk's preload of the app's wasm is not where expected")
    href, sri = m.group(1), m.group(2)
    html = html.replace(m.group(0), "", 1)
    glue_import = GLUE_IMPORT.search(html)
    if not glue_import:
        fail("index.html: Trunk's import of the app's glue is not where expected")
    glue = glue_import.group(1)
    call = f"const wasm = await init({{ module_or_path: '{href}' }});"
    if html.count(call) != 1:
        fail("index.html: Trunk's loader call is not where expected")
    later = (
        "await new Promise((go) => { requestAnimationFrame(() => setTimeout(go, 0)); setTimeout(go, 100); });\n"
        "const compiled = await new Promise((ok, no) => {\n"
        f"  const w = new Worker('./{worker}');\n"
        "  w.onmessage = (e) => {\n"
        "    w.onmessage = null;\n"
        "    w.onerror = null;\n"
        "    if (!(e.data?.module instanceof WebAssembly.Module)) { w.terminate(); return no(new Error(e.data)); }\n"
        "    if (e.data.warmed) {\n"
        "      performance.mark('trainmem:warmed');\n"
        "      window.trainmemAnalysis = w;\n"
        "      window.trainmemFound = e.data.found;\n"
        "    } else w.terminate();\n"
        "    ok(e.data.module);\n"
        "  };\n"
        "  w.onerror = (e) => { w.terminate(); no(e); };\n"
        f"  w.postMessage({{ url: new URL('{href}', document.baseURI).href, integrity: '{sri}', glue: new URL('{glue}', document.baseURI).href, query: location.search }});\n"
        f"}}).catch(() => fetch('{href}', {{ integrity: '{sri}' }}));\n"
        "const wasm = await init({ module_or_path: compiled });"
    )
    return html.replace(call, later, 1)


def process(dist):
    index = os.path.join(dist, "index.html")
    if not os.path.exists(index):
        fail(f"{dist}/index.html is missing: run `trunk build --release` first")
    if os.path.exists(os.path.join(dist, "sw.js")):
        fail(f"{dist} was processed already (it has sw.js): build it again")

    icons, touch = make_icons(dist)
    worker_js = read(os.path.join(WEB, "compile-worker.js"), "rb")
    worker = hashed_name("compile-worker", worker_js, ".js")
    write(os.path.join(dist, worker), worker_js)
    hashed, revalidate = classify(files_of(dist))

    manifest = json.loads(read(os.path.join(WEB, "manifest.json")))
    manifest["icons"] = icons
    write(os.path.join(dist, "manifest.webmanifest"), json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")

    html = after_first_paint(read(index), worker)
    head = "\n".join(
        [
            f'    <meta name="theme-color" content="{THEME_COLOR}" />',
            '    <link rel="manifest" href="./manifest.webmanifest" />',
            f'    <link rel="apple-touch-icon" href="./{touch}" />',
            "    <script>\n" + inline_script(read(os.path.join(WEB, "register.js"))) + "\n    </script>",
        ]
    )
    if html.count("</head>") != 1:
        fail("index.html: expected one </head>")
    html = html.replace("</head>", "\n" + head + "\n  </head>", 1)
    write(index, html)
    # The CSP must allow the inline script just added (and every other one, by its hash).
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "csp.py"), dist], check=True)
    html = read(index)
    check_urls(html, dist)

    # The build id: a digest of every file the worker will cache (the page before the id).
    precache_files = ["manifest.webmanifest", *sorted(hashed + revalidate)]
    digest = hashlib.sha256(sha256(html.encode()).encode())
    for f in precache_files:
        digest.update(f"\n{f} {sha256(read(os.path.join(dist, f), 'rb'))}".encode())
    build = digest.hexdigest()[:HEX16]
    html = html.replace("\n  </head>", f'\n    <meta name="trainmem-build" content="{build}" />\n  </head>', 1)
    write(index, html)

    precache = ["./", *precache_files]
    sw = read(os.path.join(WEB, "sw.js"))
    for key, value in (
        ("'__BUILD__'", json.dumps(build)),
        ("__PRECACHE__", json.dumps(precache, indent=2)),
        ("__REVALIDATE__", json.dumps(["./", "manifest.webmanifest", *sorted(revalidate)])),
    ):
        if sw.count(key) != 1:
            fail(f"web/sw.js: expected one {key}")
        sw = sw.replace(key, value)
    write(os.path.join(dist, "sw.js"), sw)

    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)"', html)
    if not csp:
        fail("index.html has no CSP meta tag (scripts/csp.py)")
    write(os.path.join(dist, "_headers"), headers(csp.group(1), hashed, revalidate, "/"))

    compress(dist)
    say(f"build {build}: {len(precache)} files precached, {len(hashed)} content-hashed, {len(revalidate)} revalidated")
    report(dist)


def headers(csp, hashed, revalidate, base):
    """The _headers rules: exact paths only, so each path gets exactly one Cache-Control and
    one CSP (both hosts merge the headers of every rule that matches)."""
    rules = []

    def rule(path, *lines):
        rules.append(base + path + "\n" + "".join(f"  {ln}\n" for ln in lines))

    page = (f"Content-Security-Policy: {csp}", "X-Content-Type-Options: nosniff", f"Cache-Control: {NO_CACHE}")
    rule("", *page)
    rule("index.html", *page)
    rule("sw.js", f"Content-Security-Policy: {csp}", "X-Content-Type-Options: nosniff", f"Cache-Control: {NO_CACHE}")
    rule("manifest.webmanifest", "X-Content-Type-Options: nosniff", f"Cache-Control: {NO_CACHE}")
    for f in sorted(revalidate):
        rule(f, "X-Content-Type-Options: nosniff", f"Cache-Control: {NO_CACHE}")
    for f in sorted(hashed):
        rule(f, "X-Content-Type-Options: nosniff", f"Cache-Control: {IMMUTABLE}")
    head = (
        "# Netlify and Cloudflare Pages response headers, written by scripts/dist.py.\n"
        "# The pages' CSP is the one pinned in their meta tag; hashed files are immutable.\n"
    )
    return head + "\n".join(rules)


def compressor():
    if shutil.which("zopfli"):
        return "zopfli", lambda p: subprocess.run(["zopfli", "--i15", "-c", p], check=True, capture_output=True).stdout
    return "gzip -9", lambda p: subprocess.run(["gzip", "-9", "-n", "-c", p], check=True, capture_output=True).stdout


def compress(dist):
    if not shutil.which("brotli"):
        fail("brotli is missing (Debian package brotli; scripts/setup.sh installs it)")
    gz_name, gz = compressor()

    def one(f):
        p = os.path.join(dist, f)
        raw = os.path.getsize(p)
        br = subprocess.run(["brotli", "-q", "11", "-w", "24", "-c", p], check=True, capture_output=True).stdout
        g = gz(p)
        for ext, data in ((".br", br), (".gz", g)):
            if len(data) < raw:
                write(p + ext, data)

    todo = [f for f in files_of(dist) if os.path.splitext(f)[1] in COMPRESSIBLE]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(one, todo))
    say(f"compressed {len(todo)} files (brotli -q 11, {gz_name})")


def report(dist):
    rows = []
    for f in files_of(dist):
        if f.endswith((".br", ".gz")) or f in META_FILES:
            continue
        p = os.path.join(dist, f)
        raw = os.path.getsize(p)
        gz = os.path.getsize(p + ".gz") if os.path.exists(p + ".gz") else raw
        br = os.path.getsize(p + ".br") if os.path.exists(p + ".br") else raw
        rows.append((f, raw, gz, br))
    width = max(len(r[0]) for r in rows)
    print(f"{'file':<{width}} {'raw':>10} {'gzip':>10} {'brotli':>10}")
    for f, raw, gz, br in rows:
        print(f"{f:<{width}} {raw:>10,} {gz:>10,} {br:>10,}")
    total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    print(f"{'total':<{width}} {total[0]:>10,} {total[1]:>10,} {total[2]:>10,}")


# ---------------------------------------------------------------------------------------------
# site

VERSION_DIR = re.compile(r"^v\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?$")
TARBALL = re.compile(r"^trainmem-web-(v\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?)\.tar\.gz$")


def prefixed_headers(text, prefix):
    """A version's _headers with every path moved under /prefix/."""
    out = []
    for ln in text.splitlines():
        out.append(f"/{prefix}{ln}" if ln.startswith("/") else ln)
    return "\n".join(out) + "\n"


def site(dist, out, releases):
    if not os.path.exists(os.path.join(dist, "sw.js")):
        fail(f"{dist} is not a processed build (no sw.js)")
    if os.path.exists(out):
        shutil.rmtree(out)
    shutil.copytree(dist, out)
    versions = []
    tarballs = sorted(f for f in os.listdir(releases) if TARBALL.match(f)) if releases else []
    for t in tarballs:
        version = TARBALL.match(t).group(1)
        dest = os.path.join(out, version)
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(os.path.join(releases, t)) as tar:
            tar.extractall(tmp, filter="data")
            top = os.path.join(tmp, f"trainmem-web-{version}")
            if not os.path.exists(os.path.join(top, "index.html")):
                fail(f"{t}: no trainmem-web-{version}/index.html inside")
            shutil.copytree(top, dest)
        versions.append(version)
    versions.sort(key=lambda v: [int(x) if x.isdigit() else x for x in re.split(r"[.-]", v[1:])], reverse=True)
    extra = [prefixed_headers(read(os.path.join(out, v, "_headers")), v) for v in versions if os.path.exists(os.path.join(out, v, "_headers"))]
    for v in versions:
        if os.path.exists(os.path.join(out, v, "_headers")):
            os.remove(os.path.join(out, v, "_headers"))
    rules = read(os.path.join(out, "_headers")) + "".join("\n" + e for e in extra)
    rules += "\n/versions.json\n  Cache-Control: no-cache\n"
    write(os.path.join(out, "_headers"), rules)
    listing = {"latest": "./", "versions": [{"version": v, "path": f"{v}/"} for v in versions]}
    write(os.path.join(out, "versions.json"), json.dumps(listing, indent=2) + "\n")
    say(f"site {out}: this build at ./, released versions: {', '.join(versions) or 'none'}")


def main(argv):
    if len(argv) >= 2 and argv[0] == "process":
        process(argv[1])
    elif len(argv) >= 3 and argv[0] == "site":
        site(argv[1], argv[2], argv[3] if len(argv) > 3 and argv[3] else None)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
