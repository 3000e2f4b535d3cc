#!/usr/bin/env bash
# The GPU check (issue 24): in about 6 minutes on one GPU, from the repository root,
#   1. the CUDA tests (`pytest -m cuda`: models, hooks, patching, both masked-forward paths
#      with their gradients, pruning, attribution and training, each against the CPU);
#   2. `mechlab bench hooks / prune / train --device cuda`;
#   3. a short training of the study's `medium` preset (examples/s, peak GPU memory);
#   4. `mechlab report --device cuda` on the bundled checkpoint.
# Every log, figure and the report go to one folder, packed as one archive beside a summary.
#
#   bash scripts/gpu_check.sh [OUT_DIR]          # OUT_DIR: $OUT if set (the device tool), else gpu-check/
#
# On a GPU machine that reaches no package registry, run `bash scripts/gpu_wheels.sh` first on a
# machine that does, and carry .whl/ along: the missing dependencies are installed from it into
# /tmp/site (nothing in the tree changes). A dry run on a CPU checks the script and every test
# body, not the GPU:  DEVICE=cpu QUICK=1 bash scripts/gpu_check.sh /tmp/gpu-dry
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check}}
device=${DEVICE:-cuda}
quick=${QUICK:-0}
work=$(mktemp -d /tmp/mechlab-gpu-check.XXXX)
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
failed=0
export PYTHONUNBUFFERED=1 MECHLAB_TEST_ACCELERATOR=$device

note() { echo "$*" | tee -a "$summary"; }

# step NAME LIMIT_S COMMAND...: run it with a time limit, log to $work/NAME.log, record the outcome
step() {
  local name=$1 limit=$2; shift 2
  note "== $name: $*"
  local start=$SECONDS
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  note "   exit $rc after $((SECONDS - start)) s$([ $rc -eq 124 ] && echo " (stopped at its ${limit} s limit)")"
  [ $rc -eq 0 ] || failed=1
  tail -n 40 "$work/$name.log" | sed 's/^/   | /' >> "$summary"
}

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import mechlab.cli, nnsight, transformer_lens" 2> /dev/null && ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site" || exit 2
fi
mechlab() { python3 -m mechlab "$@"; }

note "mechlab GPU check, $(date -u +%FT%TZ), device $device, quick=$quick, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
note "load average: $(cut -d' ' -f1-3 /proc/loadavg), CPUs: $(nproc)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary"
python3 - <<'PY' 2>&1 | tee -a "$summary" || exit 2
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"GPU visible: {torch.cuda.is_available()}")
import mechlab  # noqa: F401  (the dependencies are all there)
PY

if [ "$quick" = 1 ]; then
  families=transformer,lstm; presets=tiny; repeats=2; train_preset=tiny; train_steps=3; batch=16; report_args=(--seed 0 --eval-traces 32 --prune-traces 32 --recall-traces 16 --steps 5 --no-components)
else
  families=transformer,lstm,dense_ssm,mamba; presets=tiny,small,medium; repeats=5; train_preset=medium; train_steps=200; batch=0; report_args=()
fi

step pytest-cuda 240 python3 -m pytest -q -p no:cacheprovider -m cuda tests/cuda -rs
step bench-hooks 120 mechlab bench hooks --device "$device" --families "$families" --repeats "$repeats"
step bench-prune 120 mechlab bench prune --device "$device" --presets "$presets" --repeats "$repeats"
step bench-train 120 mechlab bench train --device "$device" --preset "$train_preset" --repeats "$repeats" $([ "$batch" = 0 ] || echo --batch "$batch")
step train-"$train_preset" 150 python3 - "$work/train-$train_preset" "$device" "$train_steps" "$train_preset" "$batch" <<'PY'
import json, statistics, sys
import torch
from mechlab.train import train
from mechlab.train.config import resolve_config

out, device, steps, preset, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
sizes = {"batch_size": batch, "grad_accum": 1} if batch else {}  # 0: the preset's own batch
cfg = resolve_config(preset, steps=steps, **sizes, device=device, log_every=max(1, steps // 20), eval_every=0, n_checkpoints=1)
if device.startswith("cuda"):
    torch.cuda.reset_peak_memory_stats()
result = train(cfg, out, progress=False)
rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
speeds = [r["examples_per_s"] for r in rows if "examples_per_s" in r]
speeds = speeds[1:] or speeds  # the first includes the warm-up
peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
print(f"{preset} preset, {steps} steps of batch {cfg.batch_size} on {device}: final loss {result.final_loss:.4g}, "
      f"median {statistics.median(speeds):.0f} examples/s, peak GPU memory {peak:.2f} GiB")
PY
step report 300 mechlab report --ckpt examples/checkpoints/recall-cpu/last.pt --out "$work/report" \
  --device "$device" --no-progress "${report_args[@]}"

cp "$work"/*.log "$out/" 2> /dev/null
tar -czf "$out/gpu-check.tar.gz" -C "$work" . && rm -f "$out"/*.log
note "everything (logs, the report and its figures): $out/gpu-check.tar.gz"
note "result: $([ $failed = 0 ] && echo 'every step passed' || echo 'some step FAILED (see above)')"
exit $failed
