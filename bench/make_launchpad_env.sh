#!/usr/bin/env bash
# Build the dm-launchpad 0.5.2 reference environment (Python 3.10 only) used by
# bench/local.py for comparison. It is a benchmark reference, never a dependency.
#   bash bench/make_launchpad_env.sh [DIR]     (default: bench/.lp-venv)
set -euo pipefail
dir=${1:-"$(dirname "$0")/.lp-venv"}
py=""
for cand in python3.10 "$HOME"/.pyenv/versions/3.10*/bin/python; do
  if "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then py=$cand; break; fi
done
[ -n "$py" ] || { echo "no Python 3.10 found: dm-launchpad 0.5.2 installs only there" >&2; exit 1; }
"$py" -m venv "$dir"
"$dir/bin/pip" install -q "dm-launchpad==0.5.2" "tensorflow~=2.8.0" "numpy<2" "protobuf<3.20"
"$dir/bin/python" -c 'import launchpad; print("launchpad ready in", "'"$dir"'")'
