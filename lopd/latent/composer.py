"""The latent composer c_φ (spec: pipeline step 3).

An *encoder* LoRA on the shared frozen backbone reads "current task + one retrieved
trajectory" to last-layer hidden states; a Perceiver / Q-Former resampler compresses them to
K latent vectors of the backbone's width. ``n_ret`` experiences give ``n_ret × K`` latents,
which ``lopd.latent.teacher`` injects into the teacher's input embeddings.

One backbone serves two roles: the encoder (LoRA on) and the teacher (LoRA off, through
peft's ``disable_adapter``). peft injects the LoRA layers into the backbone *in place*, so
any forward of that backbone object outside ``Composer.teacher()`` runs with the adapter on.

φ = the LoRA tensors + the resampler. ``ComposerAnchor`` keeps a frozen copy φ₀ (the cold
start result) and evaluates it on the live modules with ``torch.func.functional_call``, so
the anchor term costs no second backbone.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Sequence

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import load_peft_weights
from safetensors.torch import load_file, load_model, save_file
from torch import Tensor, nn
from torch.func import functional_call

from lopd.config import ComposerParams
from lopd.policy.chat import encode

ADAPTER = "encoder"  # peft adapter name of the encoder LoRA
# The task comes first so that, under causal attention, every trajectory token is read in the
# light of the current task: one experience yields different latents for different tasks.
ENCODER_TEMPLATE = "Current task:\n{task}\n\nPast successful experience on a similar task:\n{experience}"
_RESAMPLER_FILE, _CONFIG_FILE = "resampler.safetensors", "composer.json"


def encoder_text(task: str, experience: str) -> str:
    """The text the encoder reads for one (current task, retrieved observation-lite trajectory) pair."""
    return ENCODER_TEMPLATE.format(task=task, experience=experience)


# ----------------------------------------------------------------------------- resampler


class LatentBlock(nn.Module):
    """Pre-norm cross-attention + feed-forward; keys/values = [encoder states ; current queries]."""

    def __init__(self, dim: int, num_heads: int, ff_mult: int):
        super().__init__()
        self.norm_q = nn.RMSNorm(dim)
        self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        self.norm_ff = nn.RMSNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, ff_mult * dim), nn.GELU(), nn.Linear(ff_mult * dim, dim))

    def forward(self, x_NKD: Tensor, states_NSD: Tensor, ignore_NSK: Tensor) -> Tensor:
        q_NKD = self.norm_q(x_NKD)
        # Attending to the queries too (Flamingo's Perceiver Resampler) lets latents exchange
        # information and gives every query a valid key even for an empty input.
        kv_NSKD = torch.cat([states_NSD, q_NKD], dim=1)
        x_NKD = x_NKD + self.attn(q_NKD, kv_NSKD, kv_NSKD, key_padding_mask=ignore_NSK, need_weights=False)[0]
        return x_NKD + self.ff(self.norm_ff(x_NKD))


class Resampler(nn.Module):
    """K learnable queries refined by ONE ``LatentBlock`` applied ``depth`` times, then projection + norm."""

    def __init__(self, dim: int, num_latents: int, num_heads: int, depth: int, ff_mult: int, out_scale: float = 1.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"composer.num_heads = {num_heads} must divide the backbone hidden size {dim}")
        self.depth = depth
        # Spec: queries ~ N(0, 1/√d), read as standard deviation d^-1/2.
        self.queries = nn.Parameter(torch.randn(num_latents, dim) * dim**-0.5)
        self.norm_states = nn.RMSNorm(dim)
        self.block = LatentBlock(dim, num_heads, ff_mult)  # shared across the depth iterations
        self.proj_out = nn.Linear(dim, dim)
        self.norm_out = nn.RMSNorm(dim)
        # Latents stand where token embeddings stand: start them at the embeddings' RMS, not at 1.
        nn.init.constant_(self.norm_out.weight, out_scale)

    def forward(self, states_NSD: Tensor, valid_NS: Tensor) -> Tensor:
        """Encoder states ``(N, S, D)`` with ``valid_NS`` (True = real token) → latents ``(N, K, D)``."""
        n = states_NSD.shape[0]
        x_NKD = self.queries.unsqueeze(0).expand(n, -1, -1)
        states_NSD = self.norm_states(states_NSD)
        ignore_NSK = torch.cat([~valid_NS.bool(), valid_NS.new_zeros(n, self.queries.shape[0], dtype=torch.bool)], dim=1)
        for _ in range(self.depth):
            x_NKD = self.block(x_NKD, states_NSD, ignore_NSK)
        return self.norm_out(self.proj_out(x_NKD))


def embedding_rms(model) -> float:
    """Mean RMS of the backbone's input-embedding rows (the scale the teacher expects at a token slot)."""
    w = model.get_input_embeddings().weight.detach().float()
    return w.pow(2).mean(-1).sqrt().mean().item()


def lora_config(cp: ComposerParams) -> LoraConfig:
    return LoraConfig(r=cp.lora_r, lora_alpha=cp.lora_alpha, lora_dropout=cp.lora_dropout, target_modules=list(cp.lora_targets))


# ----------------------------------------------------------------------------- composer


def _copy_into(module: nn.Module, state: dict[str, Tensor]) -> None:
    """``state`` copied into ``module``'s tensors in place, every key matched (safetensors' ``load_model``
    refuses parameters that are views of one flat buffer, as DeepSpeed's are)."""
    own = module.state_dict()
    if set(own) != set(state):
        raise KeyError(f"resampler weights do not match: missing {sorted(set(own) - set(state))}, unexpected {sorted(set(state) - set(own))}")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(state[k])


class Composer(nn.Module):
    """Encoder LoRA on the frozen backbone + resampler. ``forward(tasks, experiences)`` → ``(B, n_ret·K, D)``.

    ``backbone`` is the peft-wrapped shared model; ``teacher()`` is the context in which it is
    the plain base model again.
    """

    def __init__(self, backbone: PeftModel, resampler: Resampler, tokenizer, max_input_tokens: int):
        super().__init__()
        self.backbone, self.resampler = backbone, resampler
        self.tokenizer, self.max_input_tokens = tokenizer, max_input_tokens

    # -- construction

    @classmethod
    def build(cls, backbone, tokenizer, cp: ComposerParams, seed: int = 0) -> "Composer":
        """Wrap ``backbone`` (a causal LM, frozen here) with a fresh encoder LoRA and a fresh resampler."""
        backbone.requires_grad_(False)
        with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
            torch.manual_seed(seed)
            peft_model = get_peft_model(backbone, lora_config(cp), adapter_name=ADAPTER)
            resampler = Resampler(
                backbone.config.hidden_size, cp.num_latents, cp.num_heads, cp.depth, cp.ff_mult, embedding_rms(backbone)
            )
        return cls(peft_model, resampler.to(_device(backbone)), tokenizer, cp.max_input_tokens)

    @classmethod
    def load(cls, backbone, tokenizer, path: str | Path) -> "Composer":
        """A composer saved by ``save``, on ``backbone`` (the same base weights it was trained on)."""
        path = Path(path)
        cfg = _read_config(path)
        backbone.requires_grad_(False)
        peft_model = PeftModel.from_pretrained(backbone, path / ADAPTER, adapter_name=ADAPTER, is_trainable=True)
        resampler = Resampler(cfg["hidden_size"], cfg["num_latents"], cfg["num_heads"], cfg["depth"], cfg["ff_mult"])
        load_model(resampler, path / _RESAMPLER_FILE)
        return cls(peft_model, resampler.to(_device(backbone)), tokenizer, cfg["max_input_tokens"])

    def save(self, path: str | Path) -> Path:
        """``path/encoder/`` (peft adapter, safetensors) + ``path/resampler.safetensors`` + ``path/composer.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        # peft writes a non-default adapter to <path>/<adapter name>/.
        self.backbone.save_pretrained(path, selected_adapters=[ADAPTER])
        # cloned: under DeepSpeed the parameters are views of one flat buffer, which safetensors refuses
        save_file({k: v.detach().clone().contiguous() for k, v in self.resampler.state_dict().items()}, path / _RESAMPLER_FILE)
        q = self.resampler.queries
        cfg = {
            "hidden_size": q.shape[1],
            "num_latents": q.shape[0],
            "num_heads": self.resampler.block.attn.num_heads,
            "depth": self.resampler.depth,
            "ff_mult": self.resampler.block.ff[0].out_features // q.shape[1],
            "max_input_tokens": self.max_input_tokens,
        }
        (path / _CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
        return path

    def load_weights(self, path: str | Path) -> None:
        """Overwrite φ (LoRA + resampler) in place from a ``save`` directory."""
        path = Path(path)
        set_peft_model_state_dict(self.backbone, load_peft_weights(str(path / ADAPTER)), adapter_name=ADAPTER)
        _copy_into(self.resampler, load_file(path / _RESAMPLER_FILE))

    # -- parameters

    def trainable_named_parameters(self) -> dict[str, nn.Parameter]:
        """φ by name: the encoder LoRA tensors and the resampler. Never a backbone weight.

        Selected by name, not ``requires_grad``: peft flips the LoRA flags when adapters are
        disabled and re-enabled, so the flags say little about what φ is.
        """
        return {n: p for n, p in self.named_parameters() if n.startswith("resampler.") or ".lora_" in n}

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.trainable_named_parameters().values())

    # -- forward

    def teacher(self) -> AbstractContextManager:
        """Context in which ``backbone`` is the base model (encoder LoRA off): the teacher's forward."""
        return self.backbone.disable_adapter()

    def tokenize(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Right-padded ``ids_NS`` and ``valid_NS``; texts longer than ``max_input_tokens`` lose their end.

        Right padding keeps every real token at its natural position (0..n-1) under causal
        attention; cutting the end keeps the current task, which comes first.
        """
        rows = [encode(self.tokenizer, t)[: self.max_input_tokens] for t in texts]
        width = max(1, max(len(r) for r in rows))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids_NS = torch.full((len(rows), width), pad, dtype=torch.long)
        valid_NS = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            ids_NS[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            valid_NS[i, : len(r)] = True
        dev = _device(self.backbone)
        return ids_NS.to(dev), valid_NS.to(dev)

    def encoder_states(self, ids_NS: Tensor, valid_NS: Tensor) -> Tensor:
        """Last-layer hidden states ``(N, S, D)`` of the backbone with the encoder LoRA on, in the resampler's dtype."""
        decoder = self.backbone.get_base_model().get_decoder()  # LoRA layers live inside it; no LM head needed
        states_NSD = decoder(input_ids=ids_NS, attention_mask=valid_NS.long()).last_hidden_state
        return states_NSD.to(self.resampler.queries.dtype)

    def encode(self, ids_NS: Tensor, valid_NS: Tensor) -> Tensor:
        """One (task, experience) text per row → ``(N, K, D)`` latents (float32, the resampler's dtype)."""
        return self.resampler(self.encoder_states(ids_NS, valid_NS), valid_NS)

    def forward(self, tasks: Sequence[str], experiences: Sequence[Sequence[str]]) -> Tensor:
        """``tasks[b]`` with its retrieved ``experiences[b]`` (n_ret each, retrieval order) → ``(B, n_ret·K, D)``."""
        if len(tasks) != len(experiences):
            raise ValueError(f"{len(tasks)} tasks but {len(experiences)} experience lists")
        n_ret = {len(e) for e in experiences}
        if len(n_ret) != 1 or 0 in n_ret:
            raise ValueError(f"every task needs the same non-zero number of experiences, got {sorted(n_ret)}")
        texts = [encoder_text(t, e) for t, exps in zip(tasks, experiences) for e in exps]
        latents_NKD = self.encode(*self.tokenize(texts))
        k, d = latents_NKD.shape[1:]
        return latents_NKD.reshape(len(tasks), n_ret.pop() * k, d)  # experience-major within each task


class ComposerAnchor:
    """Frozen φ₀ (e.g. the cold-start composer) evaluated on a live ``Composer``'s modules.

    ``latents(tasks, experiences)`` = the composer's forward with φ replaced by φ₀, no grad:
    the ``c_φ₀`` of the anchor term ``λ·‖c_φ − c_φ₀‖²`` on the same inputs.
    """

    def __init__(self, composer: Composer, state: dict[str, Tensor] | None = None):
        self.composer = composer
        self.state = state if state is not None else {n: p.detach().clone() for n, p in composer.trainable_named_parameters().items()}

    @classmethod
    def from_dir(cls, composer: Composer, path: str | Path) -> "ComposerAnchor":
        """φ₀ from a ``Composer.save`` directory, leaving ``composer``'s own φ untouched."""
        current = cls(composer)  # copy of φ
        composer.load_weights(path)
        anchor = cls(composer)  # copy of φ₀
        with torch.no_grad():
            for n, p in composer.trainable_named_parameters().items():
                p.copy_(current.state[n])
        return anchor

    @torch.no_grad()
    def latents(self, tasks: Sequence[str], experiences: Sequence[Sequence[str]]) -> Tensor:
        return functional_call(self.composer, self.state, (tasks, experiences))


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _read_config(path: Path) -> dict:
    cfg_path = path / _CONFIG_FILE
    if not cfg_path.exists():
        raise FileNotFoundError(f"no composer at {path} ({_CONFIG_FILE} missing): save one with Composer.save or run cold start")
    return json.loads(cfg_path.read_text())
