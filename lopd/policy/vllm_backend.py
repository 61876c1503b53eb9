"""``rollout.backend: vllm``: the rollouts on a vLLM engine, the training on the Hugging Face student.

The engine is built from the checkpoint the student was loaded from (``model.name_or_path``), in
this process, and keeps its own copy of the weights; the student's are pushed into it (``load_weights``, then the
prefix cache is dropped) before the first generation after every ``reset()``, which the rollout
engine calls around every run, so every run samples from the current student.

The contract is the HF backends':

- prompts are token ids (``TokensPrompt``) and grow append-only over turns; vLLM's prefix cache
  re-uses a conversation's earlier turns as ``CachedHFBackend`` does;
- each turn stops at the end-of-turn ids, the stop id included in ``token_ids``;
- ``logprobs`` are the sampled tokens' log-probs under the *sampling* distribution (after
  temperature and top-p: ``logprobs_mode="processed_logprobs"``);
- with ``rngs`` (``rollout.rng: trajectory``) each request's seed is drawn from its trajectory's
  generator, so a trajectory does not depend on its batch-mates (vLLM's own sampler, so the
  tokens differ from the HF backends' for the same seed).

The teacher never runs here: it scores through the HF forward with ``inputs_embeds`` (the
latents), and vLLM cannot return prompt log-probs for prompt embeddings.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from lopd.policy.generation import Generation

log = logging.getLogger(__name__)


class VLLMBackend:
    def __init__(self, model, tokenizer, temperature: float, top_p: float, *, gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None, seed: int = 0, enforce_eager: bool = False):
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("rollout.backend = 'vllm' needs the vllm package: pip install -e '.[gpu]' on a CUDA machine "
                              "(`make test-vllm` builds a CPU one for the contract test)") from e
        path = Path(getattr(model, "name_or_path", "") or "")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"rollout.backend = 'vllm': the student was not loaded from a checkpoint directory "
                                    f"({str(path)!r}); vLLM builds its engine from one (model.path or models/base)")
        # The engine runs in this process, beside the trainer (as TRL's colocate mode): the weight push
        # then hands vLLM the student's tensors by reference. With vLLM's engine-core process the push
        # must serialise every tensor over RPC, which fails ("cannot pickle memoryview objects", vllm 0.32).
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            log.warning("rollout.backend = 'vllm': VLLM_ENABLE_V1_MULTIPROCESSING set to 0 (the weight push needs the engine in this process)")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.model, self.temperature, self.top_p = model, temperature, top_p
        gen_eos = model.generation_config.eos_token_id
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        self.stop_ids = sorted({tokenizer.eos_token_id, *gen_eos})
        dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[model.dtype]
        self.llm = LLM(model=str(path), tokenizer=str(path), dtype=dtype, seed=seed, enable_prefix_caching=True,
                       logprobs_mode="processed_logprobs", gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len or getattr(model.config, "max_position_embeddings", None),
                       enforce_eager=enforce_eager)
        self.stale = True  # the engine's weights may differ from the student's
        self.pushes = 0

    def reset(self) -> None:
        """The student may have stepped since the last run: push its weights before the next generation."""
        self.stale = True

    def push_weights(self) -> None:
        """Copy the student's weights into the engine (Hugging Face names; vLLM maps them) and drop the prefix cache."""
        weights = [(k, v.detach()) for k, v in self.model.state_dict().items()]
        # in place, through vLLM's loader (it re-applies the post-load processing, e.g. the CPU weight
        # repacking, which is why a plain ``model.load_weights`` fails after the first load)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.stale, self.pushes = False, self.pushes + 1

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, rngs: list[torch.Generator] | None = None) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.stale:
            self.push_weights()
        seeds = [int(torch.randint(0, 2**31 - 1, (), generator=g)) for g in rngs] if rngs else [None] * len(prompts)
        params = [SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=max_new_tokens, logprobs=0,
                                 stop_token_ids=self.stop_ids, seed=s, detokenize=False) for s in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        gens = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            logps = [step[t].logprob for t, step in zip(ids, o.logprobs)]
            gens.append(Generation(ids, logps, stopped=bool(ids) and ids[-1] in self.stop_ids))
        return gens
