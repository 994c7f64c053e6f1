#!/usr/bin/env bash
# Runs a workflow job's `run:` lines, unchanged and in order, the way GitHub Actions runs them
# (bash -e -o pipefail, in the checkout), in a clean checkout of this working tree with an empty
# cargo target dir — so the test suite proves the deploy workflow builds as written.
#
#   scripts/workflow-steps.sh [WORKFLOW] [JOB] [--keep DIR]
#     WORKFLOW  default .github/workflows/pages.yml;  JOB  default build
#     --keep    copy the checkout's dist/ to ./dist and its _site/ to DIR afterwards
#
# The clean checkout: `git clone` of this repository at HEAD, with the working tree's
# uncommitted changes laid over it (so a developer tests what they have; CI's clone has none);
# without .git, a copy of the tree less its ignored build outputs. Tools installed on the
# machine (rustup, ~/.cargo/bin, the cargo registry cache, Debian packages) are shared, as a
# runner's image would have them; node_modules and target/ are not: the steps install and
# build everything they need. Only the variables the steps cannot have here are replaced:
# TRAINMEM_RELEASES (GitHub releases are unreachable) is taken from the caller's environment,
# and the `${{ }}` expressions of the job's env are dropped.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
workflow="$ROOT/.github/workflows/pages.yml"
job="build"
keep=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep="$(realpath -m "${2:?}")"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[ "${#args[@]}" -ge 1 ] && workflow="$(cd "$(dirname "${args[0]}")" && pwd)/$(basename "${args[0]}")"
[ "${#args[@]}" -ge 2 ] && job="${args[1]}"
say() { printf '\033[1mworkflow-steps:\033[0m %s\n' "$*" >&2; }

# The job's run: lines (one per step; a multi-line run block is refused, see pages.yml).
mapfile -t steps < <(python3 - "$workflow" "$job" <<'PY'
import re, sys
path, job = sys.argv[1], sys.argv[2]
lines = open(path, encoding="utf-8").read().splitlines()
in_jobs = in_job = False
job_indent = None
for ln in lines:
    if re.match(r"^jobs:\s*$", ln):
        in_jobs = True
        continue
    if not in_jobs:
        continue
    m = re.match(r"^(\s+)([A-Za-z0-9_-]+):\s*$", ln)
    if m and (job_indent is None or len(m.group(1)) <= job_indent):
        job_indent = len(m.group(1))
        in_job = m.group(2) == job
        continue
    if in_job:
        m = re.match(r"^\s*(?:-\s+)?run:\s*(.*)$", ln)
        if m:
            cmd = m.group(1).strip()
            if cmd in ("|", ">", "|-", ">-", "") or cmd.startswith(("|", ">")):
                sys.exit(f"{path}: job {job}: a multi-line run block; keep each step's run: on one line")
            print(cmd)
PY
)
[ "${#steps[@]}" -gt 0 ] || { say "no run: steps in job $job of $workflow"; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/trainmem-checkout-XXXXXX")"
trap 'rm -rf "$work"' EXIT
src="$work/src"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  say "clean checkout: git clone at $(git -C "$ROOT" rev-parse --short HEAD), plus the working tree's changes"
  git clone -q --no-hardlinks "$ROOT" "$src"
  git -C "$src" checkout -q --detach "$(git -C "$ROOT" rev-parse HEAD)"
  (cd "$ROOT" && git ls-files -z -m -o --exclude-standard) | (cd "$ROOT" && xargs -0 -r cp --parents -t "$src" 2>/dev/null || true)
  (cd "$ROOT" && git ls-files -z -d) | (cd "$src" && xargs -0 -r rm -f)
else
  say "clean checkout: a copy of the tree (no .git)"
  mkdir -p "$src"
  tar -C "$ROOT" --exclude=./target --exclude=./dist --exclude=./node_modules --exclude=./_site -cf - . | tar -C "$src" -xf -
fi

# As on a runner: no target dir of ours, no tools left on PATH by the caller's setup.sh.
unset CARGO_TARGET_DIR TRUNK_SKIP_VERSION_CHECK
export PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v "^$ROOT/" | paste -sd:)"
cd "$src"
start=$SECONDS
for cmd in "${steps[@]}"; do
  say "run: $cmd"
  t=$SECONDS
  bash --noprofile --norc -e -o pipefail -c "$cmd"
  say "  ($((SECONDS - t)) s)"
done
say "job $job: ${#steps[@]} steps in $((SECONDS - start)) s from a clean checkout (target/ was empty)"

[ -f dist/index.html ] && [ -f dist/sw.js ] || { say "the steps made no dist/"; exit 1; }
if [ -n "$keep" ]; then
  rm -rf "$ROOT/dist"
  cp -r dist "$ROOT/dist"
  if [ -d _site ]; then
    rm -rf "$keep"
    mkdir -p "$(dirname "$keep")"
    cp -r _site "$keep"
  fi
  say "kept dist/ in $ROOT/dist and _site/ in $keep"
fi
