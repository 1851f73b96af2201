#!/usr/bin/env bash
# Every check of the TypeScript client, as the repo's test command runs it:
#   1. npm ci, when node_modules is missing or was installed from another package-lock.json
#   2. the generated code in src/gen is in sync with protos/ (scripts/check-generated.sh)
#   3. npm test: tsc --noEmit, then every test/*.test.ts under node --test (via tsx)
set -euo pipefail
cd "$(dirname "$0")/.."

stamp=node_modules/.lane-installed   # the package-lock.json hash node_modules was installed from
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== npm ci (clients/typescript)"
  npm ci --no-audit --no-fund
  echo "$want" >"$stamp"
fi

echo "== TypeScript generated code is in sync with protos/"
scripts/check-generated.sh

echo "== npm test (clients/typescript)"
npm test
