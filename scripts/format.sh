#!/usr/bin/env bash
# Formats every C++ file of the repository with clang-format (.clang-format: Google style,
# 100 columns). --check changes nothing and fails naming the files that are not formatted
# (scripts/test.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc')
if [[ "${1:-}" == --check ]]; then
  clang-format --dry-run --Werror "${files[@]}"
else
  clang-format -i "${files[@]}"
fi
