"""The policy backbone: the embedded tiny Qwen3 (tokenizer trained offline, random init) or a
local checkpoint, loaded through the same Hugging Face classes either way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Sequence

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from lopd.config import ModelParams
from lopd.policy.chat import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    LATENT_PH,
    QWEN3_LITE_TEMPLATE,
    THINK_TAGS,
    TOOL_CALL_TAGS,
    TOOL_RESPONSE_TAGS,
)

SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, LATENT_PH]
# Tags stay in decoded text (the environment parses them), so they are added, not special.
TAG_TOKENS = [*TOOL_CALL_TAGS, *TOOL_RESPONSE_TAGS, *THINK_TAGS]

NUMBER_TOKENS = [f"{i:02d}" for i in range(100)] + [str(i) for i in range(10, 100)] + [str(i) for i in range(10)]
NUMBER_TOKENS = list(dict.fromkeys(NUMBER_TOKENS))  # "00".."99" and "0".."9"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: str | None = None) -> torch.dtype:
    """``model.dtype`` as a torch dtype; ``auto`` is bfloat16 on CUDA and float32 on CPU."""
    if name == "auto":
        on_cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
        return torch.bfloat16 if on_cuda else torch.float32
    return _DTYPES[name]


def train_tokenizer(corpus: Iterable[str], vocab_size: int, words: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained offline on ``corpus``, with Qwen3's chat tokens and template.

    ``words`` (names, ids, apps, ...) become whole tokens, matched only as whole words: a small
    model copies one token from its context far sooner than a run of BPE pieces (a copy-mechanism
    probe measured when the base was designed: with every name and id one token, a model of this
    size copied a name out of the task by step 500 and an id out of a one-result lookup by step
    1,000, batch 32, peak lr 3e-3). Numbers are read in chunks of two digits from the left, each one
    token (``7200`` = ``72`` ``00``): copying ``72`` digit by digit out of a context full of
    other numbers was the most common error of the base with experiences in its prompt.
    ``vocab_size`` counts the BPE part; words and numbers come on top.
    """
    tok = Tokenizer(models.BPE())
    # Digits are split one by one (as Qwen does), so an amount is the same token sequence in the
    # task, in a tool result and in an action. No regex split otherwise: merges may cross spaces
    # and punctuation, so the JSON skeleton of a tool call costs a few tokens, not twenty.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Chat tokens, tags and words become whole tokens below; keep them out of the BPE merges.
    tag_re = re.compile("|".join(re.escape(t) for t in [*SPECIAL_TOKENS, *TAG_TOKENS]))
    word_re = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r")(?!\w)") if words else None
    clean = lambda text: tag_re.sub(" ", word_re.sub(" ", text) if word_re else text)  # noqa: E731
    tok.train_from_iterator((clean(text) for text in corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, LATENT_PH],
        chat_template=QWEN3_LITE_TEMPLATE,
        model_max_length=1 << 20,
    )
    fast.add_tokens(TAG_TOKENS)  # whole tokens that survive skip_special_tokens decoding
    fast.add_tokens([AddedToken(w, single_word=True, normalized=False) for w in words])
    # Leftmost-longest matching splits any digit run into two-digit chunks from the left.
    fast.add_tokens([AddedToken(n, normalized=False) for n in NUMBER_TOKENS])
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
        dtype=str(resolve_dtype(p.dtype)).removeprefix("torch."),
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(resolve_dtype(p.dtype))


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
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, device))
    return model.to(device).eval(), tokenizer


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
