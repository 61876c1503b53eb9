"""``lopd sweep``: the headline from one command — every method × every seed, the profile's ablations
over the same seeds, and the report, in ``metrics/<name>.{md,json,csv}``.

1. :func:`check` (before any compute): the seeds, the methods and every ablation of
   ``sweep.ablations`` (params keys checked by :mod:`lopd.config`; here, that an ablation changes
   only what distillation and evaluation read, since it reuses the main sweep's shared outputs);
2. :func:`lopd.experiments.sweep.run` for the methods (sweep ``<name>``);
3. each ablation as its own LOPD sweep ``<name>-<ablation>`` over the same seeds (``--name`` of
   :func:`lopd.experiments.sweep.run`: its seeds under ``runs/<name>-<ablation>/``, its tables
   ``metrics/<name>-<ablation>.*``);
4. :func:`lopd.experiments.sweep_report.build` with those ablations: efficiency per seed, the
   chance row's policies, the ablation rows and the plots folded into ``metrics/<name>.*``.

Ablations run only when the methods include ``lopd`` (they are LOPD's rows) and ``ablations`` is
true (``lopd sweep --no-ablations``: e.g. one part of a sweep that another will ``--join``).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from lopd.config import AblationParams, Params, ParamsError, validate_params
from lopd.experiments import sweep, sweep_report
from lopd.train.onpolicy import check_methods

log = logging.getLogger(__name__)

# Keys no ablation may set: where things live and what the sweep itself chooses.
NOT_ABLATABLE = ("seed", "paths", "tracking", "distill.methods", "profile")


def ablation_name(name: str, ab: AblationParams) -> str:
    """The ablation's own sweep name: ``sweep`` + ``joint`` → ``sweep-joint``."""
    return sweep.check_name(f"{name}-{ab.name}")


def ablation_params(p: Params, ab: AblationParams) -> Params:
    """``p`` with the ablation's overrides (and no ablations of its own)."""
    data: dict[str, Any] = p.model_dump()
    data["sweep"]["ablations"] = []
    for key, value in ab.set.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return validate_params(data)


def _covers(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".") or prefix.startswith(key + ".")


def check(p: Params, seeds: Sequence[int], methods: Sequence[str], name: str, ablations: bool = True) -> list[AblationParams]:
    """The ablations this sweep will run, after checking them (a :class:`ParamsError` naming the field)."""
    if not ablations or "lopd" not in methods:
        return []
    from lopd.ops.tracking import tracking_uri

    uri = tracking_uri(p)
    shared = [s for s in sweep.SHARED_STAGES if s in sweep.NEEDS["lopd"]]
    out = []
    for i, ab in enumerate(p.sweep.ablations):
        field = f"sweep.ablations[{i}] ({ab.name}).set"
        for key in ab.set:
            if any(_covers(key, k) for k in NOT_ABLATABLE):
                raise ParamsError(f"params: {field}: {key} is not an ablation's to set (the sweep chooses seeds, methods, paths and tracking)")
            if key in sweep.DISTILL_ONLY:
                continue
            stage = next((s for s in shared if any(_covers(key, k) for k in sweep.SHARED_PARAMS[s])), None)
            if stage is not None:
                raise ParamsError(f"params: {field}: {key} changes what the shared {stage} stage builds, which the ablation reuses from "
                                  f"the main sweep; an ablation may change only what distill and evaluate read (run this one as its own "
                                  f"sweep: lopd sweep --name ... --set {key}=... --set paths.root=<another root>)")
        pa, sub = ablation_params(p, ab), ablation_name(name, ab)
        for k in seeds:
            check_methods(sweep.seed_params(pa, k, ["lopd"], uri, sub), ["lopd"])
        out.append(ab)
    return out


def run(p: Params, seeds: Sequence[int] | str = sweep.DEFAULT_SEEDS, methods: Sequence[str] | str = sweep.DEFAULT_METHODS,
        name: str = "sweep", ablations: bool = True) -> dict:
    """The methods' sweep, each ablation's sweep, then the report; returns the report (``metrics/<name>.json``)."""
    seeds, methods, name = sweep.parse_seeds(seeds), sweep.parse_methods(methods), sweep.check_name(name)
    todo = check(p, seeds, methods, name, ablations)
    result = sweep.run(p, seeds, methods, name)
    names = []
    for ab in todo:
        sub = ablation_name(name, ab)
        log.info("sweep %s: ablation %s (%s) over seeds %s", name, ab.name, ab.set, seeds)
        sweep.run(ablation_params(p, ab), seeds, ["lopd"], sub)
        names.append(sub)
    report = sweep_report.build(p, names, name)
    return {**result, **report}
