#!/usr/bin/env bash
# Run HERE (a machine with PyPI), before scripts/gpu_check.sh runs on a lent GPU machine
# that reaches no registry: downloads into .whl/ the wheels of mechlab's runtime
# dependencies that the GPU machine's image lacks, for its Python (3.12, manylinux x86-64),
# at the versions this machine's resolver picks. Nothing is installed here.
#
#   bash scripts/gpu_wheels.sh            # then carry .whl with the device run
#
# The image's package list (the device tool's KINDS.md, read 2026-11-17) is below; torch,
# CUDA and Triton come from the image and are never downloaded. About 24 MB of wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.whl
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
image="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio
h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp"
norm() { tr 'A-Z_.' 'a-z--'; }
report=$(mktemp)
python3 -m pip install --dry-run --ignore-installed --quiet --report "$report" -e . > /dev/null
wanted=$(python3 - "$report" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    if meta["name"] != "mechlab":
        print(f"{meta['name']}=={meta['version']}")
PY
)
mkdir -p "$dest"
missing=()
for spec in $wanted; do
  name=$(echo "${spec%%==*}" | norm)
  case " $(echo $image | norm) " in *" $name "*) continue ;; esac
  case "$name" in nvidia-*|cuda-*|triton|torch) continue ;; esac
  # wandb (20 MB) and what only it needs: transformer-lens imports it for training runs
  # only, never on import, and the device run's files must stay under 64 MiB in all
  case "$name" in wandb|opentelemetry-*|googleapis-common-protos|cwevals) continue ;; esac
  missing+=("$spec")
done
echo "downloading ${#missing[@]} wheels the GPU image lacks: ${missing[*]}"
for spec in "${missing[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$dest" "$spec" \
  || python3 -m pip download -q --no-deps --no-binary=:none: -d "$dest" "$spec"
done
du -sh "$dest"
