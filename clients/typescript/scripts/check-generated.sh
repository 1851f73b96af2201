#!/usr/bin/env bash
# Fail when regenerating would change the committed TypeScript code in src/gen.
set -euo pipefail
pkg=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$pkg/scripts/generate.sh" "$tmp"
if ! diff -r "$pkg/src/gen" "$tmp/clients/typescript/src/gen" >"$tmp/diff"; then
  echo "TypeScript generated code is stale: run clients/typescript/scripts/generate.sh and commit src/gen" >&2
  head -40 "$tmp/diff" >&2
  exit 1
fi
echo "TypeScript generated code is in sync"
