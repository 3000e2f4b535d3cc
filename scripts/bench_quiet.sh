#!/usr/bin/env bash
# Run the benchmarks docs/benchmarks.md shows, on a quiet machine, and refresh its tables.
#
#   bash scripts/bench_quiet.sh                 # everything (about 15 minutes on 2 idle cores)
#   ONLY="hooks prune" bash scripts/bench_quiet.sh
#   ALLOW_LOAD=1 bash scripts/bench_quiet.sh    # run anyway; the records say "provisional"
#
# Every run writes its record to docs/bench/<name>.json (--json ... --force: these files
# exist to be refreshed), with the load, threads, torch build and machine it ran on, then
# `python -m mechlab.bench.tables docs/benchmarks.md` renders the page's tables from them.
# A run during which other processes kept more than one thread busy on average is marked
# provisional in its record and on the page (mechlab.bench.record), so a run that turns
# out noisy says so; this script also refuses to start while the machine is busy.
# The prose around the tables is written by hand: read the new tables, then the prose.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=docs/bench
ONLY=${ONLY:-"hooks prune scan startup train ensemble"}
PYTHON=${PYTHON:-python}
MECHLAB=${MECHLAB:-mechlab}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

busy() {  # other threads running on average over 5 s (this shell's own are about 0)
  "$PYTHON" - <<'EOF'
import time
from mechlab.bench.record import _running_threads_elsewhere
xs = []
for _ in range(10):
    n = _running_threads_elsewhere()
    xs.append(0 if n is None else n)
    time.sleep(0.5)
print(f"{sum(xs) / len(xs):.1f}")
EOF
}

load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
others=$(busy)
echo "load average $load, other threads running $others on average"
if [[ "${ALLOW_LOAD:-0}" != 1 ]] && awk -v o="$others" 'BEGIN { exit !(o > 1.0) }'; then
  echo "bench_quiet: the machine is busy (other threads running $others on average, limit 1);" >&2
  echo "stop the other jobs, or run with ALLOW_LOAD=1 to record provisional figures" >&2
  exit 2
fi
mkdir -p "$OUT"
started=$(date +%s)

step() {  # step NAME COMMAND...: run one benchmark, timed, its record in $OUT/NAME.json
  local name=$1; shift
  local t0; t0=$(date +%s)
  echo; echo "== $name: $*"
  "$@" --json "$OUT/$name.json" --force
  echo "== $name: $(( $(date +%s) - t0 )) s"
}
wanted() { [[ " $ONLY " == *" $1 "* ]]; }

for threads in 1 2; do
  if wanted hooks; then  # issue 25: caching costs, every family, beside nnsight
    step "hooks-$threads" "$MECHLAB" bench hooks --repeats 5 --threads "$threads"
  fi
  if wanted prune; then  # pruning step vs forward+backward, memory vs naive stacking
    step "prune-$threads" "$MECHLAB" bench prune --presets tiny,small,medium --threads "$threads" --straightforward
  fi
done
if wanted scan; then
  step scan-1 "$MECHLAB" bench scan --repeats 5 --threads 1
fi
if wanted startup; then
  step startup "$MECHLAB" bench startup --repeats 5
fi
if wanted train; then
  step train-tiny-1 "$MECHLAB" bench train --preset tiny --batch 256 --threads 1
fi
if wanted ensemble; then
  step ensemble-1 "$MECHLAB" bench ensemble \
    --presets st_transformer_small,st_lstm_small,st_dense_ssm_small,st_mamba_small --steps 30 --repeats 3
fi
"$PYTHON" -m mechlab.bench.tables docs/benchmarks.md
echo "bench_quiet: done in $(( $(date +%s) - started )) s; review docs/benchmarks.md's prose against the new tables"
