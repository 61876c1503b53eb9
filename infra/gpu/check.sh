#!/usr/bin/env bash
# The prepared device check (docs/scale.md), for a session that is lent a GPU. It runs within the
# device's image (torch, transformers, peft, accelerate) plus wheels that travel with the tree:
#
#   bash infra/gpu/wheels.sh            # here, once: pydantic (+ deepspeed and its small deps) into infra/gpu/wheels/
#   run(command="bash infra/gpu/check.sh", carry=["infra/gpu/wheels"], timeout_s=480)
#
# Prints and writes $OUT/gpu_check.json: rollout tokens/s (bf16 and fp32), a demo-scale GRPO update's
# trained tokens/s, the DeepSpeed ZeRO-2 update against torch Adam, whether vLLM imports. Under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-.}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'peft', peft.__version__)"
if [ -d infra/gpu/wheels ]; then
  # --no-deps: only what the image lacks; anything already there stays as it is
  for pkg in annotated_types typing_inspection pydantic_core pydantic hjson py_cpuinfo msgpack ninja einops deepspeed; do
    python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('${pkg/py_cpuinfo/cpuinfo}') is None)" 2>/dev/null && continue
    pip install -q --no-index --no-deps --find-links infra/gpu/wheels "${pkg//_/-}" 2>&1 | tail -1 || echo "could not install $pkg"
  done
fi
DS_BUILD_OPS=0 timeout 450 python infra/gpu/check.py --device cuda --out "$OUT"
echo "check.py exit status: $?"
