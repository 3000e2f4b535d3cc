#!/usr/bin/env bash
# The local-underspecification test (issue 23 item 3): recall-cpu with the loss at the
# 1-after targets weighted by w (every other observation by 1), dense checkpoints.
# Resumable: a finished run is skipped, an interrupted one continues from its last.pt.
# Usage: bash examples/underspecification/train_runs.sh [RUNS_DIR [STEPS [W:SEED ...]]]
# (defaults: runs/underspec, 12000, the six runs w in {1, 4, 16} x seed {0, 1}). Then score
# every checkpoint and analyse (docs/reproduction.md, "The local-underspecification test"):
#   for r in runs/underspec/w*-seed*; do mechlab recall --checkpoints "$r" --out "$r/recall" --traces 500 \
#       --threads 1 --no-progress; done
#   python examples/underspecification/analyze.py runs/underspec --collect
set -euo pipefail
runs=${1:-runs/underspec}; steps=${2:-12000}
shift $(( $# < 2 ? $# : 2 ))  # (a plain `shift 2` with one argument shifts nothing)
pairs=${*:-"1:0 4:0 16:0 1:1 4:1 16:1"}
export OMP_NUM_THREADS=1
for pair in $pairs; do
  w=${pair%%:*}; seed=${pair##*:}; out="$runs/w${w}-seed${seed}"
  if [ -f "$out/last.pt" ]; then
    done_step=$(python -c "import torch,sys; print(torch.load(sys.argv[1], weights_only=True)['step'])" "$out/last.pt")
    if [ "$done_step" -ge "$steps" ]; then echo "$out: done (step $done_step)"; continue; fi
    mechlab train --resume "$out" --steps "$steps" --no-progress
  else
    mechlab train --preset recall-cpu --out "$out" --steps "$steps" --no-progress \
      --set seed="$seed" --set target_weights.1-after="$w" \
      --set checkpoint_every=250 --set eval_every=250
  fi
done
