"""One rank of ``test_vllm_backend.py``'s data-parallel check: a gloo process group already up (as
DeepSpeed leaves it), then a ``VLLMBackend`` of its own on this rank; prints the rank's tokens.

    python -m torch.distributed.run --nproc_per_node 2 tests/policy/vllm_rank.py CHECKPOINT
"""

import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from lopd.policy.vllm_backend import VLLMBackend


def main() -> None:
    dist.init_process_group("gloo")
    path = sys.argv[1]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    backend = VLLMBackend(model, PreTrainedTokenizerFast.from_pretrained(path), 0.7, 0.95, gpu_memory_utilization=0.3,
                          max_model_len=512, enforce_eager=True)
    gen = backend.generate([[3, 4, 5, 6 + dist.get_rank()]], 8, [torch.Generator().manual_seed(dist.get_rank())])[0]
    print(f"rank {dist.get_rank()} pushes {backend.pushes} tokens {gen.token_ids}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
