#!/usr/bin/env bash
# The files of commit REF (a branch, a tag, a hash) in _ab/ of this checkout, for
# `bench/gpu_session.sh ab`: an unmerged change measured against this tree in one device call
# (carry "_ab"; git ignores it). `bench/ab_tree.sh --clean` removes it.
#   e.g.  bench/ab_tree.sh wt-q && AB_CMD='python3 bench/decode.py ... --json "$OUT/q_$AB_TAG.json"'
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ "${1:-}" = "--clean" ] && { rm -rf _ab; exit 0; }
[ -n "${1:-}" ] || { echo "usage: bench/ab_tree.sh REF | --clean" >&2; exit 2; }
git rev-parse --verify --quiet "$1^{commit}" > /dev/null || { echo "ab_tree: $1 is not a commit here" >&2; exit 2; }
rm -rf _ab && mkdir _ab
git archive "$1" pyproject.toml pto orchestration incore runtime_c bench | tar -x -C _ab
echo "_ab/: $(git rev-parse --short "$1") ($(du -sh _ab | cut -f1)); carry \"_ab\" with the device call"
