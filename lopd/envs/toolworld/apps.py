"""Apps and their hidden conventions (EnvScaler's idea: many small environments, each with its own rules).

Each family has eight apps. Its three conventions (``format``, ``prereq``, ``commit``) have two
options each, so there are eight combinations, and the eight apps of a family take them in an
order fixed by ``(family, world seed)``: no two apps of a family behave alike, and a new app is
never a copy of an app seen in pre-training. The system prompt lists tool signatures only, so
an agent learns an app's conventions from experience, or from the app's error messages.

The first ``n_pretrain`` apps of each family are the *pre-training apps*: the embedded base's
demonstrations come from those only. The others are *new apps*, which the base has never seen.
``SYNTHETIC_APPS`` are names for the pre-training examples whose conventions are drawn fresh
for one example (``random_conventions``): there, reading the experiences is the only way to
know the conventions.
"""

from __future__ import annotations

import itertools
import random

from .families import REGISTRY

SYNTHETIC_APPS = ("Zephyr", "Quokka", "Marlin", "Juniper", "Kestrel", "Saffron", "Tundra", "Vesper",
                  "Willow", "Yonder", "Zenith", "Aurora", "Basalt", "Cobalt", "Dune", "Fable",
                  "Garnet", "Heron", "Indigo", "Jasper", "Krypton", "Lagoon", "Mosaic", "Nimbus")
PRETRAIN, NEW = "pretrain", "new"


def conventions(family: str, app: str, world_seed: int = 0) -> dict[str, str]:
    """The hidden conventions of ``app``: a deterministic function of (family, app, world seed)."""
    fam = REGISTRY[family]
    if app not in fam.apps:
        raise ValueError(f"unknown {family} app {app!r}; expected one of {fam.apps}")
    combos = list(itertools.product(*fam.options.values()))
    random.Random(f"world/{world_seed}/{family}").shuffle(combos)
    return dict(zip(fam.options, combos[fam.apps.index(app)]))


def random_conventions(family: str, rng: random.Random) -> dict[str, str]:
    """Conventions drawn fresh (for a synthetic app that exists for one example)."""
    return {k: rng.choice(v) for k, v in REGISTRY[family].options.items()}


def pretrain_apps(family: str, n_pretrain: int) -> tuple[str, ...]:
    return REGISTRY[family].apps[:n_pretrain]


def app_group(family: str, app: str, n_pretrain: int) -> str:
    """``pretrain`` for an app the embedded base was pre-trained on, else ``new``."""
    return PRETRAIN if app in pretrain_apps(family, n_pretrain) else NEW


def entity_words() -> list[str]:
    """Every name, id, app, product, room and other entity word ToolWorld texts contain.

    The embedded tokenizer keeps each one a single token; the environment does not depend on it.
    """
    from .families.base import ID_RANGE

    words: list[str] = list(SYNTHETIC_APPS)
    for fam in REGISTRY.values():
        words += [*fam.apps, *fam.words]
        words += [f"{prefix}_{n}" for prefix in (fam.entity_prefix, fam.record_prefix)
                  for n in range(ID_RANGE[0], ID_RANGE[1] + 1)]
    return list(dict.fromkeys(words))
