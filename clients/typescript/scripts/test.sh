#!/usr/bin/env bash
# Every check of the TypeScript client, as the repo's test command runs it:
#   1. npm ci, when node_modules is missing or was installed from another package-lock.json
#   2. the generated code in src/gen is in sync with protos/ (scripts/check-generated.sh)
#   3. the package builds to dist/ (ESM and type declarations, what `exports` points at)
#   4. the web view committed in service/lane/server/web/static is the build of web/
#      (scripts/check-web.sh)
#   5. npm test: tsc --noEmit (package and web view), then every test/*.test.ts under node --test
#      (via tsx)
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

echo "== build dist/ (clients/typescript)"
rm -rf dist
npm run build --silent

echo "== the web view's build is in sync with web/ and the package"
scripts/check-web.sh

echo "== npm test (clients/typescript)"
npm test
