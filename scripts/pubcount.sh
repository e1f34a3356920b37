#!/usr/bin/env bash
# Counts `pub` items in library code (issue 28 item 9): lines declaring a `pub` (not `pub(crate)` or
# `pub(super)`) fn, struct, enum, trait, type, const, static, mod or use in crates/*/src, test files
# (`tests.rs`, `*_tests.rs`, anything under a `tests/` folder) left out. One line per crate, then the total.
#
#   scripts/pubcount.sh [ROOT]
set -eu
cd "${1:-$(dirname "$0")/..}"
total=0
for crate in crates/*/; do
  n=$(find "$crate/src" -name '*.rs' ! -name 'tests.rs' ! -name '*_tests.rs' ! -path '*/tests/*' -print0 |
    xargs -0 grep -hE '^\s*pub (unsafe )?(async )?(fn|struct|enum|trait|type|const|static|mod|use)\b' | wc -l)
  printf '%-22s %5d\n' "$(basename "$crate")" "$n"
  total=$((total + n))
done
printf '%-22s %5d\n' total "$total"
