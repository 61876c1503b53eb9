"""The committed embedded base: ``lopd/assets/base`` (float16 safetensors, tokenizer, model card).

Pre-training the embedded base to a useful level takes about 25 minutes on 2 CPU cores, beyond
the demo's budget (docs/environments.md, The embedded base, gives the measurements), so the demo uses a
base pre-trained once with the same code and committed here. ``bootstrap.source: committed``
copies it to ``models/base``; ``bootstrap.source: train`` rebuilds it from scratch, and
``lopd export-base`` writes a rebuilt one here (with its model card and record).

``lopd_base.json`` records the *recipe* (every param that shapes the base: model, bootstrap,
the world and its pre-training apps, the seed), the training time and the metrics measured on
the exported weights, so a test can check that the recorded dev success reproduces and a run
with other recipe params refuses the committed base instead of silently using it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lopd.config import Params, ParamsError

ASSET_DIR = Path(__file__).resolve().parents[1] / "assets" / "base"  # lopd/assets/base
RECORD = "lopd_base.json"
CARD = "README.md"
# Params that do not change the base's weights (evaluation sizes, where it comes from).
_NOT_RECIPE = {"model.path", "model.dtype", "bootstrap.source", "bootstrap.eval_dev_tasks", "bootstrap.expert_check_tasks"}


def recipe(p: Params) -> dict:
    """Every param that shapes the pre-trained base (the key a committed base must match)."""
    flat = p.flat()
    keep = [k for k in flat if k.split(".")[0] in ("model", "bootstrap") or k == "seed"
            or k.startswith("toolworld.") or k in ("env.name", "env.task_seed", "env.max_turns", "env.success_threshold")]
    out = {k: flat[k] for k in sorted(keep) if k not in _NOT_RECIPE}
    from lopd.envs.registry import get_environment

    world = get_environment(p).fingerprint  # the hidden rules themselves, not only the seed that deals them
    if world is not None:
        out["env.world_sha"] = world
    return out


def read_record(asset: Path = ASSET_DIR) -> dict:
    path = asset / RECORD
    if not path.exists():
        raise FileNotFoundError(f"no committed base at {asset} ({RECORD} missing): set bootstrap.source=train to pre-train one")
    return json.loads(path.read_text())


def check_recipe(p: Params, asset: Path = ASSET_DIR) -> dict:
    """The asset's record, after checking that ``p`` asks for the base it holds (else a ParamsError naming the keys)."""
    record = read_record(asset)
    want, have = recipe(p), record["recipe"]
    diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if diff:
        shown = ", ".join(f"{k} = {want.get(k)!r} (committed base: {have.get(k)!r})" for k in diff[:4])
        raise ParamsError(
            f"params: bootstrap.source = committed, but the committed base was built with other params: {shown}"
            f"{' ...' if len(diff) > 4 else ''}. Restore them, or set bootstrap.source=train to pre-train a base for these params"
        )
    return record


def install(p: Params, dest: Path, asset: Path = ASSET_DIR) -> dict:
    """Copy the committed base (weights and tokenizer, not the card) to ``dest`` atomically; return its record."""
    from lopd.io import atomic_path

    record = check_recipe(p, asset)
    with atomic_path(dest) as tmp:
        shutil.copytree(asset, tmp, ignore=shutil.ignore_patterns(CARD, RECORD))
    return record


def write_asset(model, tokenizer, out: Path, record: dict, card: str) -> None:
    """Save ``model`` as float16 safetensors with its tokenizer, record and model card, atomically."""
    import torch

    from lopd.io import atomic_path

    with atomic_path(out) as tmp:
        model.to(torch.float16).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        (tmp / CARD).write_text(card)


def model_card(record: dict) -> str:
    """The asset's README: what it is, how to rebuild it, what it scores."""
    m, r = record["metrics"], record["recipe"]
    groups, chance = m["dev_success_by_group"], m["dev_chance"]
    acc = ", ".join(f"{k} {v:.2f}" for k, v in m["dev_action_accuracy"].items() if "/" not in k)
    return f"""# Embedded base policy (tiny Qwen3) for ToolWorld

A `Qwen3ForCausalLM` with {m['n_params']:,} parameters (hidden {r['model.hidden_size']}, {r['model.num_layers']} layers,
{r['model.num_heads']} heads, {r['model.num_kv_heads']} KV heads) and its own tokenizer (byte-level BPE of
{r['model.vocab_size']} tokens plus every ToolWorld entity word as one token), pre-trained by `lopd bootstrap` on
noisy-expert demonstrations at the {r['toolworld.pretrain_apps']} pre-training apps of each ToolWorld family. Weights are
float16 safetensors; they load as float32 with `AutoModelForCausalLM.from_pretrained`.

## Rebuild from scratch

```bash
{record['command']}
```

Seed {r['seed']}; pre-training took {record['pretrain_s'] / 60:.1f} min ({record['pretrain_steps']} steps) on
{record['machine']}. The full recipe (every param that shapes the base) is in `{RECORD}`.

## Metrics (on these float16 weights, {m['eval']['dev_tasks']} dev tasks, seed {m['eval']['seed']}, temperature {m['eval']['temperature']})

| | this base | chance |
|---|---|---|
| dev success | {m['dev_success_rate']:.3f} | {chance['success_rate']:.3f} |
| dev success, pre-training apps | {groups['pretrain']:.3f} | {chance['success_by_group']['pretrain']:.3f} |
| dev success, new apps | {groups['new']:.3f} | {chance['success_by_group']['new']:.3f} |
| dev mean reward | {m['dev_mean_reward']:.3f} | {chance['mean_reward']:.3f} |
| scripted expert success (min over splits) | {m['expert_success_rate']:.3f} | |
| teacher-forced action exact match | {acc} | |

chance: on the same dev tasks, the best (figure by figure) of the policies that learn nothing
(`lopd/envs/toolworld/chance.py`: fixed guesses of an app's conventions, or rules that set them from the check's errors).

`tests/policy/test_base_asset.py` loads this directory and checks that the dev success above reproduces.
"""
