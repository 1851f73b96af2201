#!/usr/bin/env bash
# Fail when the committed web view (service/lane/server/web/static, served by the service) is not
# the build of web/ and of the package it bundles: build dist/ first (npm run build; test.sh does).
set -euo pipefail
pkg=$(cd "$(dirname "$0")/.." && pwd)
committed=$(cd "$pkg/../../service/lane/server/web/static" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
node "$pkg/web/build.mjs" "$tmp/static"
if ! diff -rq "$committed" "$tmp/static" >&2; then
  echo "the web view's build is stale: run 'npm run build && npm run build:web' in" \
    "clients/typescript and commit service/lane/server/web/static" >&2
  exit 1
fi
echo "the web view's build is in sync"
