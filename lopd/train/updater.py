"""The optimiser step of every distill method: plain torch Adam, or a DeepSpeed ZeRO engine.

``distill.engine: single`` (default) is the spec's optimiser: Adam, no weight decay, the
gradient clipped to ``distill.grad_clip``. ``distill.engine: deepspeed`` hands the same step to
DeepSpeed (``distill.zero_config``, e.g. ``infra/deepspeed/zero2.json``): its ``"auto"`` fields
take the learning rate, the clip and the batch sizes from params, and DeepSpeed reduces the
gradients over ranks, clips, steps and partitions optimiser states (ZeRO-2) or parameters too
(ZeRO-3). Both report the pre-clip norm of the global gradient.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Sequence

import torch

from lopd.config import Params, ParamsError
from lopd.train.onpolicy import make_adam, optimizer_step
from lopd.train.parallel import DataParallel


class TorchAdam:
    """``distill.engine: single``: torch Adam + clip; optimiser state travels in the checkpoint's state dict."""

    def __init__(self, params: Sequence[torch.nn.Parameter], lr: float, grad_clip: float):
        self.params, self.grad_clip = list(params), grad_clip
        self.opt = make_adam(self.params, lr)

    def step(self, loss: torch.Tensor) -> float:
        return optimizer_step(self.opt, loss, self.params, self.grad_clip)

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def save(self, path: Path) -> None:
        """Nothing beside the state dict."""

    def load(self, state: dict, path: Path) -> None:
        self.opt.load_state_dict(state)

    def gathered(self):
        return contextlib.nullcontext()

    def for_generation(self):
        return contextlib.nullcontext()


class DeepSpeedAdam:
    """``distill.engine: deepspeed``: one DeepSpeed engine around ``module``, optimising ``params``.

    The forward passes stay the trainers' own (``module`` is used directly); ``backward`` and
    ``step`` are the engine's, so gradients are reduced over ranks, clipped and applied by it.
    """

    def __init__(self, module: torch.nn.Module, params: Sequence[torch.nn.Parameter], config: dict):
        import deepspeed

        self.module, self.params = module, list(params)
        self.zero3 = config.get("zero_optimization", {}).get("stage", 0) == 3
        self.engine, *_ = deepspeed.initialize(model=module, model_parameters=self.params, config=config)

    def step(self, loss: torch.Tensor) -> float:
        self.engine.backward(loss)
        self.engine.step()
        return float(self.engine.get_global_grad_norm())

    def state_dict(self) -> None:
        return None  # the optimiser state is partitioned over ranks: ``save`` writes it

    def save(self, path: Path) -> None:
        """Collective: every rank writes its ZeRO partition under ``path``."""
        self.engine.save_checkpoint(str(path), tag="zero", save_latest=False, exclude_frozen_parameters=True)

    def load(self, state: dict | None, path: Path) -> None:
        load_path, _ = self.engine.load_checkpoint(str(path), tag="zero", load_module_strict=False)
        if load_path is None:
            raise FileNotFoundError(f"distill.resume: no DeepSpeed checkpoint under {path} (was it written with distill.engine=single?)")

    def gathered(self):
        """Full parameters on every rank for the block (ZeRO-3; collective), e.g. to save the student."""
        if not self.zero3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)

    def for_generation(self):
        """ZeRO-3 gathers every layer's weights per forward, in lockstep over ranks; rollouts of
        different lengths would hang. Gather them once for the whole rollout instead."""
        return _zero3_generation(self.engine) if self.zero3 else contextlib.nullcontext()


@contextlib.contextmanager
def _zero3_generation(engine):
    """DeepSpeed's ``unwrap_model_for_generation`` (weights gathered, module hooks off), and also
    without the root module's start-of-forward hook: it checks the module trace across ranks on
    every forward (a collective), which ranks that generate different token counts never match."""
    from deepspeed.runtime.zero import unwrap_model_for_generation

    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    offload.fwd_pre_hook.remove()
    try:
        with unwrap_model_for_generation(engine):
            yield
    finally:  # the same hook back, first in line as DeepSpeed registers it
        offload.fwd_pre_hook = offload.module.register_forward_pre_hook(
            lambda module, *args: offload.get_param_coordinator().reset_step(), prepend=True)


def save_hf(model, tokenizer, path: Path, updater=None, dp: DataParallel = DataParallel()) -> None:
    """A plain Hugging Face checkpoint of ``model`` at ``path``, written by rank 0 alone (collective
    under ZeRO-3: every rank takes part in gathering the partitioned weights)."""
    with updater.gathered() if updater is not None else contextlib.nullcontext():
        if dp.is_main:
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)


def deepspeed_config(template: dict, *, lr: float, grad_clip: float, batch: int, world: int, bf16: bool, max_stage: int | None = None) -> dict:
    """``template`` with its ``"auto"`` fields filled from params; ZeRO stage capped at ``max_stage``.

    ``train_batch_size`` is the step's global batch (``distill.batch_tasks``), split evenly over
    ranks; DeepSpeed only checks it (the trainers batch their own episodes).
    """
    cfg = json.loads(json.dumps(template))
    fill = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": max(1, batch // world),
        "gradient_accumulation_steps": 1,
        "gradient_clipping": grad_clip,
    }
    if batch % world:
        fill["train_batch_size"] = fill["train_micro_batch_size_per_gpu"] * world
    for key, value in fill.items():
        if cfg.get(key, "auto") == "auto":
            cfg[key] = value
    opt = cfg.setdefault("optimizer", {"type": "Adam", "params": {}}).setdefault("params", {})
    if opt.get("lr", "auto") == "auto":
        opt["lr"] = lr
    if cfg.setdefault("bf16", {}).get("enabled", "auto") == "auto":
        cfg["bf16"]["enabled"] = bf16
    zero = cfg.setdefault("zero_optimization", {"stage": 0})
    if max_stage is not None:
        zero["stage"] = min(int(zero.get("stage", 0)), max_stage)
    left = [k for k, v in _items(cfg) if v == "auto"]
    if left:
        raise ParamsError(f"params: distill.zero_config has 'auto' at {left} that params cannot fill: give a value there")
    return cfg


def _items(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _items(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def make_updater(p: Params, module: torch.nn.Module, params: Sequence[torch.nn.Parameter], lr: float, dp: DataParallel,
                 *, max_stage: int | None = None):
    """The optimiser step of ``distill.engine`` for ``params`` of ``module`` at rate ``lr``."""
    if p.distill.engine == "single":
        return TorchAdam(params, lr, p.distill.grad_clip)
    from lopd.policy.modeling import resolve_dtype

    device = next(module.parameters()).device.type
    template = json.loads(Path(p.distill.zero_config).read_text())
    cfg = deepspeed_config(template, lr=lr, grad_clip=p.distill.grad_clip, batch=p.distill.batch_tasks, world=dp.world,
                           bf16=resolve_dtype(p.model.dtype, device) == torch.bfloat16, max_stage=max_stage)
    return DeepSpeedAdam(module, params, cfg)
