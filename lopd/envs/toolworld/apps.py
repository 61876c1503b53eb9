"""Apps and their hidden conventions (EnvScaler's idea: many small environments, each with its own rules).

Each family has eight apps and three conventions (``format``, ``prereq``, ``commit``) of two
options each. The system prompt lists tool signatures only, so an agent learns an app's
conventions from experience, or from the app's error messages.

The first ``n_pretrain`` apps of each family are the *pre-training apps*: the embedded base's
demonstrations come from those only. The others are *new apps*, which the base has never seen.

**The balance rule** (``conventions``). Each group (pre-training apps, new apps) is dealt its
conventions on its own, so that nothing true of one group as a whole predicts the other:

* within a group, every option of every convention is held by half of the apps (as near as
  the group's size allows), so no majority guess is right more often than chance;
* the two *silent* conventions (``format`` and ``commit``: getting them wrong raises no error)
  take each of their four joint options at one app in four, so no fixed guess of both is right
  at more than a quarter of a group's apps;
* four apps and three two-option conventions cannot be independent: a group's apps lie on a
  *relation* between ``prereq`` and one silent convention ("a check is required exactly when
  the format is cents", or "... when it is not"). The pre-training group and the new group get
  relations with different silent conventions, so whatever pattern the pre-training apps share
  holds at exactly half of the new apps.

A group's apps come in complementary pairs (an app and one with every option flipped), so
groups of other sizes are balanced as well as their counts allow. Which relations and which
apps get which combination is a deterministic function of ``(family, world seed)``. (Dealing the eight combinations once over the eight apps, as an
earlier version did, gives the new apps exactly the combinations the pre-training apps lack:
every family-wide habit of the pre-training apps is then wrong at the new apps.)

``SYNTHETIC_APPS`` are names for the pre-training examples whose conventions are drawn fresh
for one example (``random_conventions``): there, reading the experiences is the only way to
know the conventions.
"""

from __future__ import annotations

import functools
import itertools
import random

from .families import REGISTRY

SYNTHETIC_APPS = ("Zephyr", "Quokka", "Marlin", "Juniper", "Kestrel", "Saffron", "Tundra", "Vesper",
                  "Willow", "Yonder", "Zenith", "Aurora", "Basalt", "Cobalt", "Dune", "Fable",
                  "Garnet", "Heron", "Indigo", "Jasper", "Krypton", "Lagoon", "Mosaic", "Nimbus")
PRETRAIN, NEW = "pretrain", "new"
# Convention pairs a group's relation may tie, as indices into (format, prereq, commit): prereq
# with one silent convention, never format with commit (the balance rule).
RELATIONS = ((0, 1), (1, 2))


def group_combinations(n: int, rng: random.Random, avoid: frozenset[int] = frozenset()) -> list[tuple[int, int, int]]:
    """``n`` option-index triples for one group of apps (the balance rule above).

    Blocks of four: two complementary pairs lying on ``x[i] ^ x[j] == k`` for a pair ``(i, j)`` of
    :data:`RELATIONS` not in ``avoid`` (when one is left); repeated for groups of more than four.
    Returns the triples in app order, shuffled within each block.
    """
    out: list[tuple[int, int, int]] = []
    while len(out) < n:
        choices = [q for q in range(len(RELATIONS)) if q not in avoid] or list(range(len(RELATIONS)))
        i, j = RELATIONS[rng.choice(choices)]
        k = rng.randint(0, 1)
        on_relation = [x for x in itertools.product((0, 1), repeat=3) if x[i] ^ x[j] == k]
        first = rng.choice(on_relation)
        second = rng.choice([x for x in on_relation if x != first and x != tuple(1 - b for b in first)])
        block = [first, tuple(1 - b for b in first), second, tuple(1 - b for b in second)]
        # complementary pairs first: a group of two (or six) is then balanced too
        pair_order = rng.sample([0, 2], 2)
        out += [block[p + d] for p in pair_order for d in rng.sample([0, 1], 2)]
    return out[:n]


@functools.lru_cache(maxsize=None)
def _world(family: str, world_seed: int, n_pretrain: int) -> dict[str, tuple[int, int, int]]:
    fam = REGISTRY[family]
    rng = random.Random(f"world/{world_seed}/{family}")
    n_new = len(fam.apps) - n_pretrain
    pre = group_combinations(n_pretrain, rng)
    relation = _relation(pre)
    new = group_combinations(n_new, rng, avoid=frozenset() if relation is None else frozenset({relation}))
    return dict(zip(fam.apps, pre + new))


def _relation(combos: list[tuple[int, int, int]]) -> int | None:
    """Index in :data:`RELATIONS` of the pair whose XOR is constant over ``combos`` (None if none is)."""
    for q, (i, j) in enumerate(RELATIONS):
        if len(combos) > 2 and len({x[i] ^ x[j] for x in combos}) == 1:
            return q
    return None


def conventions(family: str, app: str, world_seed: int = 0, n_pretrain: int = 4) -> dict[str, str]:
    """The hidden conventions of ``app``: a deterministic function of (family, app, world seed,
    the number of pre-training apps), dealt by the balance rule above."""
    fam = REGISTRY[family]
    if app not in fam.apps:
        raise ValueError(f"unknown {family} app {app!r}; expected one of {fam.apps}")
    combo = _world(family, world_seed, n_pretrain)[app]
    return {key: options[c] for (key, options), c in zip(fam.options.items(), combo)}


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
