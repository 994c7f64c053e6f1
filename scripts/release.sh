#!/usr/bin/env bash
# Builds a release's files (the release workflow runs it on a tag; anyone can run it):
#   release/trainmem-web-vX.Y.Z.tar.gz                    dist/ of scripts/build.sh, in a folder
#                                                         trainmem-web-vX.Y.Z/ (any static host,
#                                                         any sub-path; the Pages site serves it
#                                                         at /vX.Y.Z/)
#   release/trainmem-vX.Y.Z-x86_64-unknown-linux-gnu.tar.gz  the CLI (`trainmem`), README,
#                                                         CHANGELOG
#   release/SHA256SUMS, release/NOTES.md                  checksums; this version's CHANGELOG
#                                                         section (the release's text)
#
#   scripts/release.sh [--version vX.Y.Z] [--out DIR] [--web-only] [--no-build]
#     --version   defaults to v + Cargo.toml's version; must equal it unless --web-only
#                 (a tag that disagrees with Cargo.toml fails here, before anything ships)
#     --web-only  skip the CLI;  --no-build  package the dist/ already built
set -euo pipefail
cd "$(dirname "$0")/.."

cargo_version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
version="v$cargo_version"
out="release"
web_only=0
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    --web-only) web_only=1; shift ;;
    --no-build) build=0; shift ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "release.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
if ! [[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]]; then
  echo "release.sh: version $version is not vMAJOR.MINOR.PATCH" >&2
  exit 2
fi
if [ "$web_only" = 0 ] && [ "$version" != "v$cargo_version" ]; then
  echo "release.sh: version $version, but Cargo.toml says $cargo_version: bump Cargo.toml (and CHANGELOG.md) first" >&2
  exit 1
fi
step() { printf '\033[1mrelease.sh:\033[0m %s\n' "$*"; }

[ "$build" = 1 ] && scripts/build.sh
[ -f dist/sw.js ] || { echo "release.sh: dist/ is not a build of scripts/build.sh" >&2; exit 1; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Reproducible archives: sorted names, no owners, one timestamp.
tar_flags=(--sort=name --owner=0 --group=0 --numeric-owner --mtime=@0)

step "web: trainmem-web-$version.tar.gz"
cp -r dist "$tmp/trainmem-web-$version"
tar "${tar_flags[@]}" -C "$tmp" -cf - "trainmem-web-$version" | gzip -9 -n > "$out/trainmem-web-$version.tar.gz"

if [ "$web_only" = 0 ]; then
  source scripts/setup.sh --build
  target="x86_64-unknown-linux-gnu"
  step "CLI: cargo build --release --locked --bin trainmem ($target)"
  cargo build --release --locked --bin trainmem --target "$target"
  target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  name="trainmem-$version-$target"
  mkdir -p "$tmp/$name"
  cp "$target_dir/$target/release/trainmem" README.md CHANGELOG.md "$tmp/$name/"
  "$tmp/$name/trainmem" --version
  tar "${tar_flags[@]}" -C "$tmp" -cf - "$name" | gzip -9 -n > "$out/$name.tar.gz"
fi

# This version's section of CHANGELOG.md ("## vX.Y.Z ..." up to the next "## ").
awk -v v="$version" '/^## / { on = ($2 == v) } on' CHANGELOG.md > "$out/NOTES.md"
[ -s "$out/NOTES.md" ] || echo "No CHANGELOG.md section for $version." > "$out/NOTES.md"
(cd "$out" && sha256sum trainmem-*.tar.gz > SHA256SUMS)
step "done: $(cd "$out" && ls | tr '\n' ' ')"
