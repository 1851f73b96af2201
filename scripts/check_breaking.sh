#!/usr/bin/env bash
# Fail when protos/ breaks the contract as committed on main (buf breaking, FILE rules).
# Skipped only while main has no protos yet: there is nothing to break.
set -euo pipefail
cd "$(dirname "$0")/.."
against=${LANE_BREAKING_AGAINST:-main}
if ! git rev-parse --verify --quiet "$against" >/dev/null; then
  echo "no '$against' branch here: nothing to compare against"
  exit 0
fi
if [ -z "$(git ls-tree -d "$against" protos 2>/dev/null)" ]; then
  echo "'$against' has no protos yet: nothing to compare against"
  exit 0
fi
buf breaking --against ".git#ref=$(git rev-parse "$against")"
echo "no breaking change against $against"
