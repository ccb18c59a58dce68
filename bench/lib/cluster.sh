# What the bench/ scripts that run a real cluster share. Sourced (never run) after the script has
# set `bin` (the folder of the sluice binaries):
#
#   bench_start NAME          $work: a new folder (removed at exit); processes started below are
#                             stopped at exit; prints the header line (date, cores, CPU, load)
#   make_dataset IMAGES DIR [SEED]   IMAGES synthetic JPEGs (sluice datagen, seed 0) in
#                             DIR.jpegs, as a dataset in DIR
#   await_file FILE           waits up to 10 s for FILE to be non-empty, else exits
#   start_dispatcher DIR [FLAG...]   a sluice-dispatcher on a free port, its work dir and log in
#                             DIR; sets $dispatcher (host:port)
#   start_worker DIR NAME [FLAG...]  a sluice-worker of $dispatcher on a free port, its log in
#                             DIR/NAME.log; sets $worker_pid
#   stop_cluster              stops every process started above (SIGTERM, then waits)
#   cpu_seconds PID...        user + system CPU seconds of the processes so far
#   summary [DECIMALS]        "median [min-max]" of the numbers on stdin (default 2 decimals)
#   per_round COMMAND         COMMAND's number for each round r in 1..$rounds, one a line
#   free_port                 a free TCP port on loopback

bench_pids=()

stop_cluster() {
  local p
  for p in "${bench_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${bench_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bench_pids=()
}

bench_start() {
  work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-$1-XXXXXX")"
  trap 'stop_cluster; rm -rf "$work"' EXIT
  echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  $(lscpu | sed -n 's/^Model name: *//p')  uptime: $(uptime)"
}

make_dataset() {
  "$bin/sluice" datagen --output "$2.jpegs" --images "$1" --seed "${3:-0}" >/dev/null 2>&1
  "$bin/sluice" record convert --input "$2.jpegs" --output "$2" >/dev/null 2>&1
}

await_file() {
  for _ in $(seq 200); do [[ -s "$1" ]] && return 0; sleep 0.05; done
  echo "no $1 after 10 s" >&2
  exit 1
}

start_dispatcher() {
  local dir="$1"
  shift
  mkdir -p "$dir/dispatcher"
  "$bin/sluice-dispatcher" --port 0 --address-file "$dir/dispatcher.address" \
    --work-dir "$dir/dispatcher" "$@" >"$dir/dispatcher.log" 2>&1 &
  bench_pids+=($!)
  await_file "$dir/dispatcher.address"
  dispatcher="$(cat "$dir/dispatcher.address")"
}

start_worker() {
  local dir="$1" name="$2"
  shift 2
  "$bin/sluice-worker" --dispatcher "$dispatcher" --port 0 --address-file "$dir/$name.address" \
    "$@" >"$dir/$name.log" 2>&1 &
  worker_pid=$!
  bench_pids+=($!)
  await_file "$dir/$name.address"
}

cpu_seconds() {
  local ticks=0 p
  for p in "$@"; do ticks=$((ticks + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.3f", t / hz}'
}

summary() {
  sort -g | awk -v d="${1:-2}" '{v[NR] = $1} END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    f = "%." d "f"
    printf f " [" f "-" f "]", m, v[1], v[NR] }'
}

per_round() {
  for r in $(seq "$rounds"); do eval "$1"; echo; done | sed '/^$/d'
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
