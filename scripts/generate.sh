#!/usr/bin/env bash
# Regenerate the Python stubs from protos/ into clients/python/lane/v1 (or into the directory
# given as $1, which scripts/check_generated.sh uses). The generated tree is committed.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-clients/python}
rm -rf "$out/lane/v1"
mkdir -p "$out/lane/v1"
# third_party/protos: google/rpc/status.proto, imported by the contract; its Python module is
# the googleapis-common-protos wheel's google.rpc.status_pb2, so it is on the path, not generated.
python -m grpc_tools.protoc -I protos -I third_party/protos \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out=quiet:"$out" --mypy_grpc_out=quiet:"$out" \
  protos/lane/v1/*.proto
# The generated modules are typed (their .pyi files): PEP 561's marker, shipped in lane-client.
touch "$out/lane/v1/py.typed"
