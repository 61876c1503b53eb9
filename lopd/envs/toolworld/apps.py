"""Apps and their hidden conventions (EnvScaler's idea: many small environments, each with its own rules).

Each family has eight apps and three conventions (``format``, ``prereq``, ``commit``) of two
options each. The system prompt lists tool signatures only, so an agent learns an app's
conventions from experience, or from the app's error messages.

The first ``n_pretrain`` apps of each family are the *pre-training apps*: the embedded base's
demonstrations come from those only. The others are *new apps*, which the base has never seen.

**The balance rule** (``conventions``). Each group (pre-training apps, new apps) is dealt its
conventions on its own, so that nothing true of one group as a whole predicts the other.
Within one family's group:

* every option of every convention is held by half of the apps (as near as the group's size
  allows), so no majority guess is right more often than chance;
* the two *silent* conventions (``format`` and ``commit``: getting them wrong raises no error)
  take each of their four joint options at one app in four, so no fixed guess of both is right
  at more than a quarter of a group's apps;
* four apps and three two-option conventions cannot be independent: a group's apps lie on a
  *relation* between ``prereq`` (the check) and one silent convention ("a check is required
  exactly when the format is the literal one", or "... when commit is not needed", ...). The
  pre-training group and the new group of a family get relations with different silent
  conventions, so whatever pattern the pre-training apps share holds at exactly half of the new
  apps.

**The conditional balance** (across the families of a group). The check is the one convention
an agent learns from the tools' errors, so a rule that reads it and sets the silent pair from
that one bit ("commit exactly when no check is needed") would be right wherever the relations
happen to agree. The relations are therefore dealt jointly: among a group's families whose
relation ties the check to ``commit``, as many have "check exactly when commit is required" as
"... when it is not", and likewise for ``format`` (as the literal option). Then, for each check
setting, every (format, commit) pair is held by the same number of apps of the group, and none
of the 16 rules that read the check and fix format and commit from it is right at more than a
quarter of the group (``chance.py`` plays all of them).

A group's apps come in complementary pairs (an app and one with every option flipped), so
groups of other sizes are balanced as well as their counts allow. Which relations and which
apps get which combination is a deterministic function of the world seed (of ``(family, world
seed)`` for the order within a family). (Dealing the eight combinations once over the eight
apps, as an earlier version did, gives the new apps exactly the combinations the pre-training
apps lack: every family-wide habit of the pre-training apps is then wrong at the new apps.
Dealing each family's relations on its own, as the version before this one did, left world 0
with one check-reading rule right at 12 of 16 apps of both groups.)

``SYNTHETIC_APPS`` are names for the pre-training examples whose conventions are drawn fresh
for one example (``random_conventions``): there, reading the experiences is the only way to
know the conventions.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random

from .families import REGISTRY

SYNTHETIC_APPS = ("Zephyr", "Quokka", "Marlin", "Juniper", "Kestrel", "Saffron", "Tundra", "Vesper",
                  "Willow", "Yonder", "Zenith", "Aurora", "Basalt", "Cobalt", "Dune", "Fable",
                  "Garnet", "Heron", "Indigo", "Jasper", "Krypton", "Lagoon", "Mosaic", "Nimbus")
PRETRAIN, NEW = "pretrain", "new"
# A relation ties the check (prereq) to one silent convention: ("commit", k) means the check is
# required exactly when the commit option index is k; ("format", k) when the format is literal
# (k = 0) or the other option (k = 1). Never format with commit (the balance rule).
SILENT = ("format", "commit")


def group_combinations(n: int, rng: random.Random, relation: tuple[str, int]) -> list[tuple[int, int, int]]:
    """``n`` triples ``(other_format, prereq, commit)`` of option indices for one family's group.

    ``other_format`` is 0 for the literal format; ``prereq`` 0 = required, ``commit`` 0 = required.
    Blocks of four: the four triples on ``relation`` (two complementary pairs), repeated for groups
    of more than four, each later block on the relation with the other constant. Shuffled within
    each block, complementary pairs first (a group of two, or six, is then balanced too).
    """
    silent, k = relation
    s = 0 if silent == "format" else 2
    out: list[tuple[int, int, int]] = []
    while len(out) < n:
        on_relation = [x for x in itertools.product((0, 1), repeat=3) if (x[1] == 0) == (x[s] == k)]
        first = rng.choice(on_relation)
        second = rng.choice([x for x in on_relation if x != first and x != tuple(1 - b for b in first)])
        block = [first, tuple(1 - b for b in first), second, tuple(1 - b for b in second)]
        pair_order = rng.sample([0, 2], 2)
        out += [block[p + d] for p in pair_order for d in rng.sample([0, 1], 2)]
        k = 1 - k
    return out[:n]


@functools.lru_cache(maxsize=None)
def relations(world_seed: int) -> dict[str, tuple[tuple[str, int], tuple[str, int]]]:
    """Each family's ``(pre-training relation, new relation)`` (the conditional balance above).

    Families (all of the registry, so a subset played keeps its conventions) are shuffled and
    dealt in fours: two tie the check to ``commit`` at the pre-training apps and to ``format`` at
    the new apps, two the other way round; within each (group, silent convention) the constants
    alternate, from a coin per pair of families. An odd family out gets a coin of its own.
    """
    rng = random.Random(f"world/{world_seed}/relations")
    families = sorted(REGISTRY)
    rng.shuffle(families)
    out = {}
    coins: dict[tuple[int, str], int] = {}
    for i, fam in enumerate(families):
        pre_silent = SILENT[(i // 2) % 2]
        new_silent = SILENT[1 - SILENT.index(pre_silent)]
        pair = i // 2  # the two families of a pair share (group, silent): opposite constants
        ks = []
        for group, silent in ((PRETRAIN, pre_silent), (NEW, new_silent)):
            coin = coins.setdefault((pair, group), rng.randint(0, 1))
            ks.append(coin ^ (i % 2))
        out[fam] = ((pre_silent, ks[0]), (new_silent, ks[1]))
    return out


@functools.lru_cache(maxsize=None)
def _world(family: str, world_seed: int, n_pretrain: int) -> dict[str, tuple[int, int, int]]:
    fam = REGISTRY[family]
    rng = random.Random(f"world/{world_seed}/{family}")
    pre_rel, new_rel = relations(world_seed)[family]
    combos = group_combinations(n_pretrain, rng, pre_rel) + group_combinations(len(fam.apps) - n_pretrain, rng, new_rel)
    literal = fam.formats.index(fam.literal_format)
    # other_format → the index of the format option (0 = literal here, whatever its place in fam.formats)
    return {app: (literal ^ o, p, c) for app, (o, p, c) in zip(fam.apps, combos)}


def conventions(family: str, app: str, world_seed: int = 0, n_pretrain: int = 4) -> dict[str, str]:
    """The hidden conventions of ``app``: a deterministic function of (family, app, world seed,
    the number of pre-training apps), dealt by the balance rule above."""
    fam = REGISTRY[family]
    if app not in fam.apps:
        raise ValueError(f"unknown {family} app {app!r}; expected one of {fam.apps}")
    combo = _world(family, world_seed, n_pretrain)[app]
    return {key: options[c] for (key, options), c in zip(fam.options.items(), combo)}


def world_fingerprint(world_seed: int = 0, n_pretrain: int = 4) -> str:
    """A short hash of every app's conventions in this world: a base pre-trained in another world
    (another seed, or another dealing rule of this file) does not match it."""
    table = {f: {a: conventions(f, a, world_seed, n_pretrain) for a in fam.apps} for f, fam in sorted(REGISTRY.items())}
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:12]


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
