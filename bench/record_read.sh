#!/usr/bin/env bash
# Unirecord random-read and index-load benchmark; figures go to docs/BENCHMARKS.md
# ("Record reads (bench/record_read)").
#
#   bench/record_read.sh [record_read_bench flags]     e.g. --mib 512 --reps 7 --csv out.csv
#
# Builds nothing: expects build/bin/record_read_bench (the README's bootstrap builds it; or
# `cmake --build build --target record_read_bench`). Set SLUICE_BUILD_DIR to use another build
# folder, e.g. SLUICE_BUILD_DIR=build-bench bench/record_read.sh; warns if the binary is older
# than bench/record_read.cc. Writes ~256 MiB x 3 datasets plus two 1M-record shards to $TMPDIR
# (default /tmp) and removes them; takes ~15 s on 2 cores (well under 2 minutes under load).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BUILD_DIR:-$root/build}/bin/record_read_bench"
if [[ ! -x "$bin" ]]; then
  echo "record_read.sh: $bin not found; build it first:" >&2
  echo "  cmake --build ${SLUICE_BUILD_DIR:-build} --target record_read_bench" >&2
  exit 1
fi
if [[ "$bin" -ot "$root/bench/record_read.cc" ]]; then
  echo "record_read.sh: warning: $bin is older than bench/record_read.cc; rebuild it" >&2
fi
echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  $(lscpu | sed -n 's/^Model name: *//p')" \
     " mem=$(free -g | awk '/^Mem:/{print $2}')GiB  load: $(cut -d' ' -f1-3 /proc/loadavg)"
exec "$bin" "$@"
