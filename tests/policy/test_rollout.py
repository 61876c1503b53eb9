"""The batched multi-turn rollout engine: token bookkeeping, determinism, budget accounting."""

import pytest
import torch

from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, make_tasks, run_episode
from lopd.envs.toolworld.env import StepResult
from lopd.policy.backends import HFBackend
from lopd.policy.chat import ChatFormat, encode, render_prompt
from lopd.policy.kv_backend import CachedHFBackend, sample_rows
from lopd.policy.rollout import RolloutBudget, RolloutEngine, tokenize_episode
from tests.helpers import ReplayBackend, tiny_model, tiny_tokenizer


class CountdownEnv:
    """Ends after exactly ``n`` actions whatever they say; observations of varying length."""

    def __init__(self, task, n):
        self.task, self.n, self.turn = task, n, 0

    def initial_observation(self):
        return ToolWorldEnv(self.task).initial_observation()

    def step(self, action):
        self.turn += 1
        done = self.turn >= self.n
        obs = None if done else "ok " * (1 + 5 * (self.turn % 3))
        return StepResult(obs, 0.5 if done else 0.0, done, {"short": "ok", "success": False})


def _env(task):
    return ToolWorldEnv(task, max_turns=8)


def _expert_episodes(tok, tasks):
    episodes, expected = {}, {}
    for task in tasks:
        env = _env(task)
        messages = env.initial_observation()
        ep = run_episode(env, ScriptedExpert())
        key = tuple(encode(tok, render_prompt(tok, messages)))
        episodes[key] = ep["actions"]
        expected[task.task_id] = tokenize_episode(tok, messages, ep["actions"], ep["observations"][:-1])
    return episodes, expected


def test_chat_format_is_qwen3_style():
    fmt = ChatFormat.from_tokenizer(tiny_tokenizer())
    assert fmt.after_eos == "\n"
    assert fmt.observation_chunk("OBS", closed=True) == (
        "\n<|im_start|>user\n<tool_response>\nOBS\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert fmt.observation_chunk("OBS", closed=False).startswith("<|im_end|>\n")
    # a new user message (BFCL's next turn), framed by the template's own user turn
    assert fmt.observation_chunk("NEXT", closed=True, role="user") == "\n<|im_start|>user\nNEXT<|im_end|>\n<|im_start|>assistant\n"


def test_engine_replaying_the_expert_succeeds_and_matches_tokenize_episode():
    tok = tiny_tokenizer()
    tasks = make_tasks("dev", 12)
    episodes, expected = _expert_episodes(tok, tasks)
    engine = RolloutEngine(ReplayBackend(tok, episodes), tok, _env, max_new_tokens=64, batch_size=5, max_seq_len=4096)
    trajs = engine.run(tasks, progress=False)
    assert [t.task_id for t in trajs] == [t.task_id for t in tasks]  # refill keeps the task order
    for traj in trajs:
        ids, mask = expected[traj.task_id]
        assert traj.success and traj.reward == 1.0
        assert traj.token_ids == ids and traj.action_mask == mask  # what was generated is what is scored
        assert len(traj.logprobs) == len(traj.token_ids)
        assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.action_mask) if not m)
        actions_text = tok.decode([i for i, m in zip(traj.token_ids, traj.action_mask) if m], skip_special_tokens=True)
        assert actions_text == "".join(traj.actions)
    assert engine.stats.n_trajectories == 12 and engine.stats.gen_tokens == sum(t.n_gen_tokens for t in trajs)


@pytest.mark.parametrize("backend_cls", [HFBackend, CachedHFBackend])
def test_hf_backend_sampling_is_seeded_and_logprobs_are_valid(backend_cls):
    tok, model = tiny_tokenizer(), tiny_model()
    backend = backend_cls(model, tok, temperature=0.7, top_p=0.95)
    engine = RolloutEngine(backend, tok, lambda t: ToolWorldEnv(t, max_turns=2), max_new_tokens=12, batch_size=3, max_seq_len=4096)
    tasks = make_tasks("dev", 4)
    a = engine.run(tasks, samples_per_task=2, seed=7, progress=False)
    b = engine.run(tasks, samples_per_task=2, seed=7, progress=False)
    c = engine.run(tasks, samples_per_task=2, seed=8, progress=False)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert [t.token_ids for t in a] != [t.token_ids for t in c]
    assert len(a) == 8 and len({t.rollout_id for t in a}) == 8
    for t in a:
        gen = [lp for lp, m in zip(t.logprobs, t.action_mask) if m]
        assert len(gen) == t.n_gen_tokens > 0
        assert all(lp <= 1e-6 for lp in gen) and all(lp > -float("inf") for lp in gen)
        assert len(t.actions) <= 2 and 0.0 <= t.reward <= 1.0


def test_cached_backend_trajectories_do_not_depend_on_batch_or_shard():
    """``rollout.rng: trajectory``: each trajectory draws from its own generator: batch size 1, 3 or 8, or two shards of the
    tasks played apart (data-parallel ranks), sample the very same tokens."""
    tok, model = tiny_tokenizer(), tiny_model()
    tasks = make_tasks("dev", 4)

    def play(tasks_, batch_size):
        engine = RolloutEngine(CachedHFBackend(model, tok, 0.9, 0.95), tok, lambda t: ToolWorldEnv(t, max_turns=2), 12, batch_size, 4096,
                               per_trajectory_rng=True)
        return [t.token_ids for t in engine.run(tasks_, samples_per_task=2, seed=11, progress=False)]

    whole = play(tasks, 8)
    assert play(tasks, 3) == whole and play(tasks, 1) == whole
    assert play(tasks[:1], 8) + play(tasks[1:], 2) == whole
    assert len({tuple(ids) for ids in whole}) == len(whole)  # the two samples of a task differ


def test_sample_rows_draws_from_the_distribution_and_skips_cut_ids():
    probs_BV = torch.tensor([[0.2, 0.0, 0.5, 0.3, 0.0]]).repeat(4000, 1)
    rngs = [torch.Generator().manual_seed(i) for i in range(4000)]
    ids = sample_rows(probs_BV, torch.ones(4000, dtype=torch.bool), rngs)
    freq = torch.bincount(ids, minlength=5).float() / 4000
    assert freq[1] == 0 and freq[4] == 0  # never a zero-probability id
    torch.testing.assert_close(freq, probs_BV[0], atol=0.03, rtol=0)  # 4000 draws: σ ≤ 0.008
    # a dead row draws nothing: its generator is untouched
    g = torch.Generator().manual_seed(0)
    sample_rows(probs_BV[:1], torch.zeros(1, dtype=torch.bool), [g])
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(0).get_state())


def _assert_logprobs_match_a_full_forward(model, traj):
    with torch.no_grad():
        logits = model(torch.tensor([traj.token_ids])).logits[0].log_softmax(-1)
    ids = torch.tensor(traj.token_ids)
    recomputed = logits[:-1].gather(-1, ids[1:, None])[:, 0]
    mask = torch.tensor(traj.action_mask[1:], dtype=torch.bool)
    torch.testing.assert_close(recomputed[mask], torch.tensor(traj.logprobs[1:])[mask], atol=1e-4, rtol=1e-4)


def test_sampling_logprobs_match_a_recomputed_forward_pass():
    """At temperature 1, top-p 1 the recorded log-probs are the model's own next-token log-probs."""
    tok, model = tiny_tokenizer(), tiny_model()
    engine = RolloutEngine(HFBackend(model, tok, 1.0, 1.0), tok, lambda t: ToolWorldEnv(t, max_turns=2), 10, 2, 4096)
    traj = engine.run(make_tasks("dev", 1), seed=3, progress=False)[0]
    _assert_logprobs_match_a_full_forward(model, traj)


def test_cached_backend_is_exact_across_turns_refills_early_stops_and_compaction():
    """The KV cache kept across turns (holes, per-row positions, rows joining mid-run) gives
    exactly the log-probs of a fresh forward over each finished trajectory."""
    tok, model = tiny_tokenizer(), tiny_model()
    backend = CachedHFBackend(model, tok, 1.0, 1.0)
    backend.stop_ids = torch.arange(0, len(tok), 9)  # frequent early stops: holes after a stop
    compactions = []
    original = backend._compact
    backend._compact = lambda: (compactions.append(backend.mask_BL.shape[1]), original())
    tasks = make_tasks("dev", 7)
    turns = {t.task_id: 1 + i % 4 for i, t in enumerate(tasks)}  # episodes end at different turns
    engine = RolloutEngine(backend, tok, lambda t: CountdownEnv(t, turns[t.task_id]), 10, 3, 4096)
    trajs = engine.run(tasks, seed=5, progress=False)
    assert sorted(len(t.actions) for t in trajs) == sorted(turns.values())
    assert any(t.n_gen_tokens < 10 * len(t.actions) for t in trajs)  # some turns stopped early
    for traj in trajs:
        _assert_logprobs_match_a_full_forward(model, traj)
    assert backend.kv is None and backend.rows == []  # reset after the run: no stale cache
    assert compactions, "the run should have exercised the compaction path"


def test_budget_counts_every_trajectory_and_enforces_its_limit():
    tok = tiny_tokenizer()
    tasks = make_tasks("dev", 3)
    episodes, _ = _expert_episodes(tok, tasks)
    engine = RolloutEngine(ReplayBackend(tok, episodes), tok, _env, 64, 2, 4096)
    budget = RolloutBudget(limit=7)
    engine.run(tasks, samples_per_task=2, budget=budget, progress=False)
    assert budget.used == 6
    with pytest.raises(RuntimeError, match="rollout budget exhausted: 6 used \\+ 3 requested > limit 7"):
        engine.run(tasks, budget=budget, progress=False)


def test_context_limit_ends_the_episode_as_truncated():
    tok = tiny_tokenizer()
    tasks = make_tasks("dev", 1)
    episodes, _ = _expert_episodes(tok, tasks)
    prompt_len = len(next(iter(episodes)))
    engine = RolloutEngine(ReplayBackend(tok, episodes), tok, _env, 64, 1, max_seq_len=prompt_len + 100)
    traj = engine.run(tasks, progress=False)[0]
    assert traj.truncated and len(traj.token_ids) <= prompt_len + 100 + 64
