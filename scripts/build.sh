#!/usr/bin/env bash
# The one build for every deploy: the Pages workflow, the release workflow and scripts/test.sh
# all call it. Produces dist/, ready for any static host:
#   - every file content-hashed except index.html, sw.js and manifest.webmanifest (checked);
#   - a service worker (offline use, clean updates), a web app manifest and icons;
#   - _headers for Netlify / Cloudflare Pages (the page's CSP, immutable hashed files);
#   - .br and .gz siblings at maximum levels for hosts that serve precompressed files.
#
#   scripts/build.sh              dist/
#   scripts/build.sh --site DIR   dist/, then DIR: dist/ at the root and every released version
#                                 under DIR/vX.Y.Z/ (the GitHub Pages site), taken from the
#                                 releases' web tarballs, found where TRAINMEM_RELEASES says:
#                                   github  the repository's GitHub releases (gh, GH_TOKEN)
#                                   a path  a folder of trainmem-web-vX.Y.Z.tar.gz
#                                   unset   none: the site is dist/ alone
#
# Installs what is missing first (scripts/setup.sh --build). The commit shown by the page and
# the CLI comes from git, or TRAINMEM_COMMIT / GITHUB_SHA without a .git (build.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

site=""
while [ $# -gt 0 ]; do
  case "$1" in
    --site) site="${2:?--site needs a folder}"; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

set --
source scripts/setup.sh --build
step() { printf '\033[1mbuild.sh:\033[0m %s\n' "$*"; }

# Trunk runs cargo with --offline (Trunk.toml), so the dependencies are fetched first, exactly
# as Cargo.lock pins them.
step "cargo fetch --locked"
cargo fetch --locked

step "trunk build --release"
trunk build --release

step "post-processing dist/ (scripts/dist.py)"
python3 scripts/dist.py process dist

if [ -n "$site" ]; then
  releases="${TRAINMEM_RELEASES:-}"
  if [ "$releases" = github ]; then
    releases="$(mktemp -d)"
    # Every published release's web tarball (drafts have none; a release without one is skipped).
    tags="$(gh release list --limit 1000 --exclude-drafts --json tagName --jq '.[].tagName')"
    for tag in $tags; do
      gh release download "$tag" --pattern "trainmem-web-$tag.tar.gz" --dir "$releases" \
        || step "release $tag has no trainmem-web-$tag.tar.gz: not in the site"
    done
  fi
  step "assembling the site in $site"
  python3 scripts/dist.py site dist "$site" "$releases"
fi
