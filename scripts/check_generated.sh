#!/usr/bin/env bash
# Fail when regenerating the stubs from protos/ would change the committed generated code.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scripts/generate.sh "$tmp"
# Bytecode caches are not generated code (a run without PYTHONDONTWRITEBYTECODE leaves them).
if ! diff -r -x __pycache__ clients/python/lane/v1 "$tmp/lane/v1" >"$tmp/diff"; then
  echo "generated code is stale: run scripts/generate.sh and commit the result" >&2
  head -40 "$tmp/diff" >&2
  exit 1
fi
echo "generated code is in sync"
