"""A checkpoint the way a downloaded one looks (issue #18, part 3), through ``model.path``, end to end.

``tests/checkpoint.py`` writes a tiny random Qwen3 with its own tokenizer, its own full Qwen3-format
chat template (``enable_thinking``, tools, empty ``<think>`` blocks on the last assistant turn) and
safetensors. The whole smoke pipeline runs on it in fp32 on CPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from lopd.cli import main
from lopd.policy.chat import ChatFormat, encode, render_prompt
from lopd.policy.modeling import load_policy, resolve_dtype
from lopd.policy.rollout import tokenize_episode
from tests.checkpoint import build_qwen3_checkpoint
from tests.helpers import tiny_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_qwen3_checkpoint(tmp_path_factory.mktemp("ckpt") / "Qwen3-tiny", tiny_tokenizer())


def test_the_fixture_looks_like_a_downloaded_qwen3(checkpoint):
    files = {f.name for f in checkpoint.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert json.loads((checkpoint / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    model, tok = load_policy(checkpoint)
    assert next(model.parameters()).dtype == torch.float32  # model.dtype default on CPU
    auto, _ = load_policy(checkpoint, "auto", device="cpu")  # model.dtype=auto: fp32 on CPU ...
    assert next(auto.parameters()).dtype == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16 and resolve_dtype("auto", "cuda:1") == torch.bfloat16  # ... bf16 on CUDA
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, tools=[{"type": "function", "function": {"name": "f"}}]).count("# Tools") == 1


def test_chat_format_reads_the_appended_pieces_off_a_full_qwen3_template(checkpoint):
    """A full Qwen3 template re-renders the last assistant turn without its think block once it is
    history, so the rendered conversation is no prefix-extension; the appended pieces are still exact."""
    _, tok = load_policy(checkpoint)
    fmt = ChatFormat.from_tokenizer(tok)
    assert fmt.after_eos == "\n"
    assert fmt.tool_prefix == "<|im_start|>user\n<tool_response>\n"
    assert fmt.tool_suffix == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert fmt.user_suffix == "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    ids, mask = tokenize_episode(tok, msgs, ["A1", "A2"], ["O1"])
    text = tok.decode(ids)
    # exactly what the policy saw: its prompt (with the empty think block), its actions, the framed result
    assert text == render_prompt(tok, msgs) + "A1<|im_end|>" + fmt.observation_chunk("O1", closed=True) + "A2<|im_end|>"
    assert sum(mask) == len(encode(tok, "A1")) + len(encode(tok, "A2")) + 2


def test_the_whole_smoke_pipeline_runs_on_the_checkpoint(checkpoint, tmp_path, repo):
    args = ["--params", str(repo / "params.yaml"), "--profile", "smoke", "--set", f"paths.root={tmp_path}",
            "--set", f"model.path={checkpoint}"]
    assert main(["-q", "run", *args]) == 0
    metrics = tmp_path / "metrics"
    boot = json.loads((metrics / "bootstrap.json").read_text())
    assert boot["base_source"] == "model.path" and not (tmp_path / "models" / "base").exists()  # nothing pre-trained
    distill = json.loads((metrics / "distill.json").read_text())
    for m in ("lopd", "opsd", "grpo", "sft"):
        assert distill["details"][m]["rollouts"] == distill["budget"]
        assert (tmp_path / "models" / ("student" if m == "lopd" else f"students/{m}") / "model.safetensors").exists()
    assert all(v == v for v in (distill["details"]["lopd"]["kl_final"], distill["details"]["lopd"]["delta_final"]))  # finite
    evaluate = json.loads((metrics / "evaluate.json").read_text())
    assert set(evaluate) == {"vanilla", "lopd", "opsd", "grpo", "sft", "chance"}
    # the students keep the checkpoint's own tokenizer and template
    student_tok = json.loads((tmp_path / "models" / "student" / "tokenizer_config.json").read_text())
    assert "enable_thinking" in (student_tok.get("chat_template") or (tmp_path / "models" / "student" / "chat_template.jinja").read_text())
