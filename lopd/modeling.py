"""The policy backbone: the embedded tiny Qwen3 (tokenizer trained offline, random init) or a
local checkpoint, loaded through the same Hugging Face classes either way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from lopd.chat import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    LATENT_PH,
    QWEN3_LITE_TEMPLATE,
    THINK_TAGS,
    TOOL_CALL_TAGS,
    TOOL_RESPONSE_TAGS,
)
from lopd.config import ModelParams

SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, LATENT_PH]
# Tags stay in decoded text (the environment parses them), so they are added, not special.
TAG_TOKENS = [*TOOL_CALL_TAGS, *TOOL_RESPONSE_TAGS, *THINK_TAGS]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained offline on ``corpus``, with Qwen3's chat tokens and template."""
    tok = Tokenizer(models.BPE())
    # Digits are split one by one (as Qwen does) and spaces stand alone, so a name, an id or an
    # amount is the same token sequence in the task, in a tool result and in an action.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(" ", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The tags become whole added tokens below; keep them out of the BPE merges.
    tag_re = re.compile("|".join(re.escape(t) for t in TAG_TOKENS))
    tok.train_from_iterator((tag_re.sub(" ", text) for text in corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, LATENT_PH],
        chat_template=QWEN3_LITE_TEMPLATE,
        model_max_length=1 << 20,
    )
    fast.add_tokens(TAG_TOKENS)  # whole tokens that survive skip_special_tokens decoding
    return fast


def build_tiny_qwen3(p: ModelParams, tokenizer, seed: int) -> Qwen3ForCausalLM:
    """A randomly initialised ``Qwen3ForCausalLM`` sized by ``model.*`` params."""
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_kv_heads,
        head_dim=p.head_dim,
        max_position_embeddings=p.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype=p.dtype,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(_DTYPES[p.dtype])


def load_policy(path: str | Path, dtype: str = "float32", device: str | None = None):
    """(model, tokenizer) from a local HF directory — the tiny base, a trained student or a real Qwen3."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"no Hugging Face checkpoint at {path} (config.json missing): run `lopd bootstrap` "
            "or set model.path in params.yaml to a local checkpoint directory"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype])
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
