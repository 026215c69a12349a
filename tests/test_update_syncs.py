"""Issue 35 item 2: an update that does not wait on the device between micro-batches, and whose gradient does not
depend on how the batch is cut.

* The host reads (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``float(t)``, ``int(t)``, ``bool(t)``: a
  device sync each on CUDA) made during one :class:`GRPOUpdate` call on CPU are counted with wrappers on
  ``torch.Tensor``; the count is the same for 2 and for 8 micro-batches and small (reads per minibatch, not per
  micro-batch). On the code before this change (12cbc7b) a 2-micro-batch update made 57 reads, an 8-micro-batch one
  207 (83 and 293 with a reference and a recomputed anchor): one to eight per micro-batch.
* The same batch through any micro-batch plan (one pass, one episode per pass, count limits, token budgets that
  sort episodes by length) gives the same gradient and the same step metrics within float tolerance, with and
  without the no-grad recomputes (reference for the KL term, a recomputed anchor).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import traceback

import pytest
import torch
from tensordict import TensorDict

from torchrl_grpo.objectives.loss import GRPOLoss
from torchrl_grpo.training.update import GRPOUpdate

_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
MAX_READS = 10


@contextlib.contextmanager
def count_host_reads():
    """Counts calls of the ``torch.Tensor`` methods in :data:`_READS` while open (any tensor, any caller: ours,
    torch's, transformers'); yields a Counter of ``"method file:line"`` of the first caller outside torch."""
    seen: collections.Counter = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in _READS}

    def wrap(name, fn):
        def counted(self, *args, **kwargs):
            where = next((f for f in reversed(traceback.extract_stack()[:-1])
                          if "/torch/" not in f.filename or "/torch/_tensor.py" in f.filename), None)
            seen[f"{name} {where.filename.rsplit('/', 2)[-1] if where else '?'}:{where.lineno if where else 0}"] += 1
            return fn(self, *args, **kwargs)
        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def _gsm8k_like_batch(groups=4, samples=4, seed=0, vocab=700):
    """``groups`` prompts of different lengths, each sampled ``samples`` times with responses of different lengths
    (right padding), as the collector lays out a GSM8K batch: tokens, masks, behaviour log-probs, advantages."""
    g = torch.Generator().manual_seed(seed)
    rows, starts = [], []
    for _ in range(groups):
        prompt = torch.randint(3, vocab, (int(torch.randint(8, 20, (1,), generator=g)),), generator=g)
        for _ in range(samples):
            resp = torch.randint(3, vocab, (int(torch.randint(2, 25, (1,), generator=g)),), generator=g)
            rows.append(torch.cat([prompt, resp]))
            starts.append(len(prompt))
    n, T = len(rows), max(len(r) for r in rows)
    tokens = torch.zeros(n, T, dtype=torch.long)
    am = torch.zeros(n, T, dtype=torch.bool)
    rm = torch.zeros(n, T, dtype=torch.bool)
    for i, (r, s) in enumerate(zip(rows, starts)):
        tokens[i, : len(r)], am[i, : len(r)], rm[i, s : len(r)] = r, True, True
    behav = torch.where(rm, -torch.rand(n, T, generator=g) - 0.5, torch.zeros(n, T))
    return TensorDict(tokens=tokens, attention_mask=am, response_mask=rm, sample_log_probs=behav,
                      advantage=torch.randn(n, generator=g), response_tokens=rm.sum(-1),
                      group_id=torch.arange(n) // samples, batch_size=[n])


def _update(model, *, micro_batch_size, max_tokens_per_mb, anchor="behaviour", kl=False, lr=0.0):
    loss = GRPOLoss(model, kl_coef=0.05 if kl else 0.0)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    reference = None
    if kl:
        ref_model = copy.deepcopy(model).eval()
        with torch.no_grad():  # a reference that differs from the policy
            for p in ref_model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        reference = lambda: contextlib.nullcontext(ref_model)  # noqa: E731
    return GRPOUpdate(model, loss, opt, reference=reference, device=torch.device("cpu"),
                      autocast=lambda: torch.autocast("cpu", enabled=False), ppo_epochs=1, minibatch_size=0,
                      micro_batch_size=micro_batch_size, max_tokens_per_mb=max_tokens_per_mb, max_grad_norm=1e9,
                      anchor=anchor, exact_log_probs=True, seed=0)


@pytest.fixture()
def policy(tiny_model_and_tokenizer):
    model = copy.deepcopy(tiny_model_and_tokenizer[0]).float()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.train()


def _record_micro_batches(upd):
    calls = []
    fwd = upd.loss_fn.forward

    def recorder(td, **kw):
        calls.append((td.shape[0], td["tokens"].shape[-1]))
        return fwd(td, **kw)

    upd.loss_fn.forward = recorder
    return calls


@pytest.mark.parametrize("anchor,kl", [("behaviour", False), ("recompute", True)], ids=["plain", "anchor+kl"])
def test_host_reads_do_not_grow_with_micro_batches(policy, anchor, kl):
    batch = _gsm8k_like_batch()  # 16 episodes
    counts = {}
    for size in (8, 2):
        upd = _update(copy.deepcopy(policy), micro_batch_size=size, max_tokens_per_mb=0, anchor=anchor, kl=kl)
        calls = _record_micro_batches(upd)
        upd(batch.clone(), step=1)  # warm-up: lazy initialisations read once
        calls.clear()
        with count_host_reads() as seen:
            upd(batch.clone(), step=2)
        assert len(calls) == 16 // size
        counts[size] = seen
    two, eight = sum(counts[8].values()), sum(counts[2].values())
    assert two == eight, f"2 micro-batches: {dict(counts[8])}\n8 micro-batches: {dict(counts[2])}"
    assert two <= MAX_READS, dict(counts[8])


def _left_padded(batch: TensorDict) -> TensorDict:
    """The same episodes with their real tokens at the end of each row (left padding, as quick_guard and callers of
    the update API outside the collector may lay them out)."""
    out = batch.clone()
    n = batch["attention_mask"].sum(-1)
    T = batch["tokens"].shape[-1]
    for i in range(batch.shape[0]):
        for k in ("tokens", "attention_mask", "response_mask", "sample_log_probs"):
            out[k][i] = torch.roll(batch[k][i], T - int(n[i]))
    return out


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("anchor,kl", [("behaviour", False), ("recompute", True)], ids=["plain", "anchor+kl"])
def test_any_micro_batch_plan_gives_the_same_update(policy, anchor, kl, padding):
    """Left padding: a micro-batch is cut to its longest episode only when its rows are right-padded (the cut keeps
    the first columns); before that rule a left-padded batch lost its real tokens and crashed (quick_guard, 0b16442)."""
    batch = _gsm8k_like_batch(seed=1)
    if padding == "left":
        batch = _left_padded(batch)
    lengths = batch["attention_mask"].sum(-1)
    plans = {"one pass (auto)": (0, "auto"), "one episode each": (1, 0), "3 episodes": (3, 0),
             "token budget": (0, 2 * int(lengths.max())), "budget + count": (5, 3 * int(lengths.max()))}
    results = {}
    for name, (size, budget) in plans.items():
        torch.manual_seed(0)
        model = copy.deepcopy(policy)
        upd = _update(model, micro_batch_size=size, max_tokens_per_mb=budget, anchor=anchor, kl=kl, lr=0.1)
        calls = _record_micro_batches(upd)
        grads = {}
        step = upd.optimizer.step

        def record(*a, _m=model, grads=grads, step=step, **k):
            grads.update({n: p.grad.clone() for n, p in _m.named_parameters() if p.grad is not None})
            return step(*a, **k)

        upd.optimizer.step = record
        td = batch.clone()
        metrics = upd(td, step=1)
        results[name] = (metrics, grads, {k: td[k] for k in ("ref_log_probs", "old_log_probs") if k in td.keys()},
                         calls)
    ref_metrics, ref_grads, ref_lp, ref_calls = results["one pass (auto)"]
    assert len(ref_calls) == 1 and len(results["one episode each"][3]) == 16
    assert results["token budget"][3] != []
    if padding == "right":
        assert all(rows * T <= 2 * int(lengths.max()) for rows, T in results["token budget"][3])
    for name, (metrics, grads, lps, _calls) in results.items():
        for k in ("loss/total", "ess", "clip_fraction", "ratio_mean", "ratio_max", "num_tokens", "kl_ref",
                  "grad_norm", "kl_behaviour"):
            if k in ref_metrics:
                assert metrics[k] == pytest.approx(ref_metrics[k], rel=1e-4, abs=1e-6, nan_ok=True), (name, k)
        assert grads.keys() == ref_grads.keys()
        for n, g in grads.items():
            torch.testing.assert_close(g, ref_grads[n], rtol=1e-4, atol=1e-6 * float(ref_grads[n].abs().max()) + 1e-9,
                                       msg=f"{name}: {n}")
        for k, v in lps.items():
            torch.testing.assert_close(v, ref_lp[k], rtol=1e-5, atol=1e-5, msg=f"{name}: {k}")


def test_a_token_budget_sorts_episodes_by_length_so_less_padding_runs(policy):
    """Two long and two short episodes alternating, two per micro-batch: in batch order every micro-batch is padded
    to a long one; sorted, the short ones run at their own length."""
    batch = _gsm8k_like_batch(groups=4, samples=1, seed=3)
    lengths = batch["attention_mask"].sum(-1).tolist()
    order = sorted(range(4), key=lambda i: -lengths[i])
    perm = torch.tensor([order[0], order[3], order[1], order[2]])  # long, short, long, short
    batch = batch[perm]
    lengths = [lengths[i] for i in perm.tolist()]
    upd = _update(copy.deepcopy(policy), micro_batch_size=2, max_tokens_per_mb=0)
    calls = _record_micro_batches(upd)
    upd(batch, step=1)
    consecutive = 2 * max(lengths[:2]) + 2 * max(lengths[2:])
    assert sum(rows * T for rows, T in calls) == 2 * max(lengths) + 2 * sorted(lengths)[1] < consecutive
