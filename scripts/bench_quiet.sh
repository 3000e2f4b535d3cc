#!/usr/bin/env bash
# Run every benchmark docs/benchmarks.md shows, on a quiet machine, and regenerate its tables.
#
#   bash scripts/bench_quiet.sh               # everything: 25-30 minutes on 2 idle cores
#   ONLY="hooks-1 prune-1" bash scripts/bench_quiet.sh   # some steps (names below)
#   ALLOW_LOAD=1 bash scripts/bench_quiet.sh  # run on a busy machine; the records say "provisional"
#   QUICK=1 bash scripts/bench_quiet.sh [DIR] # tiny sizes into DIR (default: a new temp folder),
#                                             # the page rendered there; what tests/scripts runs
#   REFERENCE=/tmp/edge-pruning REFERENCE_PYTHON=PY4 bash scripts/bench_quiet.sh
#                                             # also Edge Pruning beside ours (docs: "Against the
#                                             # reference implementation"; needs transformers 4.x)
#
# Before the first benchmark the script waits up to WAIT seconds (600) for a quiet machine:
# 1-minute load average and other processes' running threads at most 0.5 per core
# (python -m mechlab.bench.quiet); still busy, it refuses (exit 2), saying the load. Between
# two benchmarks it waits up to COOL seconds (180) for the load the last one left to decay.
# Every step writes its record to docs/bench/<step>.json (--json ... --force: these files
# exist to be refreshed) with the load before and after, threads, torch and BLAS build and
# machine; a run under load is marked provisional in its record and on the page. Then
# `python -m mechlab.bench.tables docs/benchmarks.md` renders every table of the
# page from the records, each with its command, load and threads, and the goal beside each
# row (mechlab.bench.goals). The prose around the tables is written by hand: read the new
# tables, then the prose. A benchmark that fails does not stop the others; exit 1 when one
# failed or a record came out provisional.
#
# Before the first benchmark and after the page is rendered, the script lists the records
# older than the code they measured (python -m mechlab.bench.stale: the files each
# benchmark exercises, mechlab/bench/code_paths.py, changed since the commit its record
# names), or that cannot be told current; a stale record left at the end (a step ONLY
# skipped) is said, not an error: the page says it too, above its table.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
MECHLAB=${MECHLAB:-mechlab}
QUICK=${QUICK:-0}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

if [[ "$QUICK" == 1 ]]; then
  ROOT=${1:-$(mktemp -d "${TMPDIR:-/tmp}/bench-quiet.XXXXXX")}
  ALLOW_LOAD=1
  mkdir -p "$ROOT/docs"
  cp docs/benchmarks.md "$ROOT/docs/benchmarks.md"
else
  ROOT=.
fi
if [[ "$ROOT" == . ]]; then OUT=docs/bench; else OUT=$ROOT/docs/bench; fi  # records name their command
PAGE=$ROOT/docs/benchmarks.md
mkdir -p "$OUT"
ALLOW_LOAD=${ALLOW_LOAD:-0}
WAIT=${WAIT:-600}
COOL=${COOL:-180}

quiet() {  # quiet SECONDS: wait for load <= 0.5 per core; status 2 when still busy
  "$PYTHON" -m mechlab.bench.quiet --wait "$1"
}
stale() {  # stale WHEN: list the records older than the code (never fails the script)
  echo "bench_quiet: records older than the code, $1 (python -m mechlab.bench.stale $OUT):"
  "$PYTHON" -m mechlab.bench.stale "$OUT" || true
}
stale "before the benchmarks"

if [[ "$ALLOW_LOAD" != 1 ]]; then
  quiet "$WAIT" || { echo "bench_quiet: refused (the machine is busy); ALLOW_LOAD=1 records provisional figures" >&2; exit 2; }
fi

started=$(date +%s)
if [[ -z "${ONLY:-}" && "$QUICK" != 1 ]]; then
  echo "bench_quiet: every step, about 25 minutes on 2 idle cores (each step says its own)"
fi
ran=()
failed=()
# step NAME SECONDS FULL_ARGS QUICK_ARGS: one benchmark (SECONDS: its expected time on 2
# idle cores, from its CPU time at --repeats 1 under load, scaled to its repeats), its
# record in $OUT/NAME.json
step() {
  local name=$1 expect=$2 full=$3 small=$4
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then return 0; fi
  local args=$full
  [[ "$QUICK" == 1 ]] && args=$small
  if [[ "$ALLOW_LOAD" != 1 && ${#ran[@]} -gt 0 ]]; then
    quiet "$COOL" || echo "bench_quiet: still busy after $COOL s; $name will be recorded as provisional" >&2
  fi
  local t0; t0=$(date +%s)
  echo; echo "== $name (about $expect s): $MECHLAB bench $args"
  # shellcheck disable=SC2086  # the arguments are words
  if $MECHLAB bench $args --json "$OUT/$name.json" --force; then
    echo "== $name: $(( $(date +%s) - t0 )) s"
    ran+=("$name")
  else
    echo "== $name: FAILED after $(( $(date +%s) - t0 )) s (its old record, if any, is kept)" >&2
    failed+=("$name")
  fi
}

Q="--batch 2 --pos 8 --repeats 1"
# issue 25: what caching costs, every family, beside nnsight, at 1 and 2 threads
step hooks-1 60 "hooks --repeats 5 --threads 1" "hooks $Q --threads 1"
step hooks-2 40 "hooks --repeats 5 --threads 2" "hooks $Q --threads 2"
# issue 25: a pruning step vs forward+backward, memory vs naive stacking
step prune-1 45 "prune --presets tiny,small,medium --threads 1 --straightforward" \
  "prune --presets tiny $Q --threads 1 --straightforward"
step prune-big-1 80 "prune --presets big --threads 1 --no-memory --straightforward --repeats 3" \
  "prune --presets tiny $Q --threads 1 --no-memory --straightforward"
step prune-scale-1 100 "prune --presets gpt2_small_shape,mamba_130m_shape --threads 1 --batch 4 --pos 32 --repeats 3 --straightforward" \
  "prune --presets tiny,st_mamba_small $Q --threads 1 --straightforward"
if [[ -n "${REFERENCE:-}" ]]; then
  step prune-reference-1 240 "prune --presets tiny,small,medium --threads 1 --reference $REFERENCE --reference-python ${REFERENCE_PYTHON:-$PYTHON}" \
    "prune --presets tiny $Q --threads 1 --reference $REFERENCE --reference-python ${REFERENCE_PYTHON:-$PYTHON}"
fi
step scan-1 55 "scan --repeats 5 --threads 1" "scan $Q --threads 1"
step train-tiny-1 165 "train --preset tiny --batch 256 --repeats 3 --threads 1" \
  "train --preset tiny --batch 2 --repeats 1 --threads 1"
step train-recall-1 65 "train --preset recall-cpu --steps 10 --repeats 7 --threads 1" \
  "train --preset recall-cpu --batch 2 --repeats 1 --threads 1"
# a Llama-3.2-1B and a Gemma-2-2B shape (random bfloat16 weights): import, cache, EAP-IG, beside
# TransformerLens' bridge and nnsight, each tool in its own process (needs ~10 GB of free memory)
step lm-1 600 "lm --threads 2" "lm --shapes llama-tiny,gemma-tiny --pos 16 --steps 2 --threads 2"
step startup 25 "startup --repeats 5" "startup --repeats 1"
step ensemble-1 170 "ensemble --presets st_transformer_small,st_lstm_small,st_dense_ssm_small,st_mamba_small --steps 30 --repeats 3" \
  "ensemble --presets st_lstm_small --steps 1 --n-train 16 --repeats 1"

"$PYTHON" -m mechlab.bench.tables "$PAGE" --root "$ROOT"
stale "after them"
provisional=$("$PYTHON" - "$OUT" "${ran[@]}" <<'EOF'
import sys
from pathlib import Path
from mechlab.bench.record import BenchRecord
out = Path(sys.argv[1])
print(" ".join(n for n in sys.argv[2:] if BenchRecord.read(out / f"{n}.json").provisional))
EOF
)
echo "bench_quiet: ${#ran[@]} benchmark(s) in $(( $(date +%s) - started )) s; records in $OUT, tables in $PAGE"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "bench_quiet: FAILED: ${failed[*]}" >&2
  exit 1
fi
if [[ -n "$provisional" ]]; then
  echo "bench_quiet: provisional (measured under load): $provisional" >&2
  [[ "$QUICK" == 1 ]] || exit 1
fi
echo "review docs/benchmarks.md's prose against the new tables"
