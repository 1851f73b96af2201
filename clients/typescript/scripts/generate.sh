#!/usr/bin/env bash
# Regenerate the TypeScript code of clients/typescript/src/gen from the repo's protos/ (with
# buf.gen.yaml at the repo root) plus google/rpc/error_details.proto, which ships inside the
# googleapis-common-protos wheel of the Python venv (needed to decode google.rpc.ErrorInfo).
#
#   scripts/generate.sh          regenerate in place (the generated tree is committed)
#   scripts/generate.sh ROOT     write ROOT/clients/typescript/src/gen instead (check-generated.sh)
#
# Needs: node_modules (npm ci) for the pinned protoc-gen-es, and buf + googleapis-common-protos
# from the repo's Python venv (.venv, created by ./dev); an explicit buf on PATH also works.
set -euo pipefail
pkg=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$pkg/../.." && pwd)
root=$(cd "${1:-$repo}" && pwd)
gen_rel=clients/typescript/src/gen

if [ ! -x "$pkg/node_modules/.bin/protoc-gen-es" ]; then
  echo "protoc-gen-es not installed: run 'npm ci' in clients/typescript" >&2
  exit 1
fi
export PATH="$pkg/node_modules/.bin:$PATH"
if [ -d "$repo/.venv/bin" ]; then
  export PATH="$repo/.venv/bin:$PATH"
fi
python=$(command -v python3 || command -v python)
if ! command -v buf >/dev/null; then
  echo "buf not found: create the Python venv (./dev test) or put buf on PATH" >&2
  exit 1
fi

# Locate error_details.proto through the installed module, not a guessed site-packages path.
error_details=$("$python" - <<'PY'
import os
import google.rpc.error_details_pb2 as m
print(os.path.join(os.path.dirname(os.path.abspath(m.__file__)), "error_details.proto"))
PY
)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/google/rpc"
cp "$error_details" "$stage/google/rpc/error_details.proto"

rm -rf "${root:?}/$gen_rel"
cd "$repo"
buf generate --template buf.gen.yaml -o "$root"
# An input on the command line replaces the template's inputs; plugins and out stay the same.
buf generate "$stage" --template buf.gen.yaml -o "$root"
