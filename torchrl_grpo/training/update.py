"""One GRPO update on a collected batch: reference and anchor log-probs, then ``ppo_epochs`` passes of minibatch
optimizer steps with gradient accumulation over token-budgeted micro-batches.

Input: the collector's batch TensorDict [B] (see :mod:`torchrl_grpo.rollout.collector`) with an ``advantage`` column [B]
(:mod:`torchrl_grpo.objectives.advantage`), after the trainer's group filters. Output: the step's batch-level metrics, each
reduced over micro-batches (and, data-parallel, over every rank's micro-batches: the same values on every rank) as
:data:`torchrl_grpo.objectives.loss.REDUCTIONS` declares (:class:`~torchrl_grpo.objectives.loss.LossMetrics`), plus ``train/*`` counters,
``grad_norm`` and ``rollout/logp_diff_mean`` / ``rollout/logp_diff_max`` (the gap between the sampler's behaviour
log-probs and the trainer's recompute: :meth:`GRPOUpdate._behaviour_gap`).

No host-device synchronisation inside the micro-batch loop: what the plan needs of a minibatch (each row's length,
first scored column, scored tokens, normaliser count, prompt identity, the common prefix) is read back in one
transfer (:meth:`GRPOUpdate.row_facts`); micro-batches carry their ``window`` (first scored column, scored tokens) so
the log-prob pass reads nothing back (:func:`~torchrl_grpo.objectives.log_probs.token_log_probs`); losses are
backpropagated without a finiteness read, and metrics are accumulated as tensors
(:class:`~torchrl_grpo.objectives.loss.LossMetrics`) read once per step. Per minibatch the update reads the finite
flag and the gradient norm (two reads), whatever the number of micro-batches (tests/test_update_syncs.py).
"""
from __future__ import annotations

import logging
import math
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch
from tensordict import TensorDict

from torchrl_grpo.objectives.log_probs import Window, _decoder_and_head, _uses_grad_checkpointing, token_log_probs
from torchrl_grpo.objectives.loss import LossMetrics, total_loss
from torchrl_grpo.objectives.loss_interface import Penalty, PolicyLoss, check_policy_loss
from torchrl_grpo.distributed.data_parallel import SINGLE, is_fsdp
from torchrl_grpo.reporting.flops import FlopCounter
from torchrl_grpo.training.micro_batch import auto_token_budget, plan_micro_batches
from torchrl_grpo.objectives.shared_prefix import SharedPrefix, build_shared_prefix, sharing_pays

__all__ = ["GRPOUpdate", "ANCHORS", "SHARED_PREFIX_MODES"]


def _has_dropout(model: torch.nn.Module) -> bool:
    """Whether a forward in train mode differs from one in eval mode by dropout (a module with p > 0, or an HF
    config dropout rate read at call time): then the loss forward is not the π_prox a no-grad eval pass gives."""
    from torchrl_grpo.training.dropout import _CONFIG_KEYS

    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        cfg = getattr(m, "config", None)
        if cfg is not None and any(isinstance(v, (int, float)) and v > 0
                                   for v in (getattr(cfg, key, None) for key in _CONFIG_KEYS)):
            return True
    return False


@contextmanager
def sparse_tied_embedding_grads(model: torch.nn.Module):
    """While open, a trainable input embedding that shares its weight with the LM head (tied, as in SmolLM2-135M;
    Qwen2.5-Coder-0.5B's is untied) returns a sparse gradient (``nn.Embedding.sparse``: one row per looked-up token)
    that autograd adds in place into the weight's dense gradient, which the LM head's backward has already created in
    the same pass. The dense default allocates and zero-fills a [V, H] buffer per backward pass and adds it whole
    (SmolLM2: 113 MB per pass). Same sums up to float addition order. A no-op for untied, frozen (LoRA) or
    FSDP-sharded embeddings. Yields a callable that makes the gradient dense again if it ever ended up sparse (call
    it before clipping: clipping and AdamW need dense gradients)."""
    from torchrl_grpo.distributed.data_parallel import is_fsdp

    try:
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):  # not an HF model, or one without embeddings
        emb = head = None
    w = getattr(emb, "weight", None)
    if (not isinstance(emb, torch.nn.Embedding) or w is None or w is not getattr(head, "weight", None)
            or not w.requires_grad or emb.sparse or is_fsdp(model)):
        yield lambda: None
        return

    def densify() -> None:
        if w.grad is not None and w.grad.is_sparse:
            w.grad = w.grad.to_dense()

    emb.sparse = True
    try:
        yield densify
    finally:
        emb.sparse = False
        densify()


#: Accepted ``shared_prefix=`` values (config ``train.shared_prefix``; :meth:`GRPOUpdate.shared_prefix_for`) and
#: ``anchor=`` values (config ``loss.anchor``; :meth:`GRPOUpdate.needs_anchor_recompute`) of :class:`GRPOUpdate`:
#: defined once in :mod:`torchrl_grpo.config.choices`.
from torchrl_grpo.config.choices import ANCHORS, SHARED_PREFIX_MODES  # noqa: E402

log = logging.getLogger(__name__)


class RowFacts(NamedTuple):
    """What the micro-batch plan needs of a minibatch's rows, on the host (:meth:`GRPOUpdate.row_facts`)."""

    length: list[int]  # real tokens of each row
    first: list[int]  # each row's first scored column (response & real token); T when it has none
    scored: list[int]  # scored tokens of each row
    norm: list[int]  # each row's share of the loss normaliser (response tokens, or 1 per episode with one)
    prompt: list[int]  # rows with equal keys hold the same tokens before the output predicting their first scored one
    common: int  # columns of real tokens common to every row (the minibatch prefix bound; 0 for fewer than 2 rows)
    right_padded: list[bool]  # each row's real tokens come first (the collector's layout)


class _Plan(NamedTuple):
    """How one update cuts the batch into minibatches (:meth:`GRPOUpdate._plan`)."""

    n_mb: int  # minibatches per epoch, the same on every rank
    mb_size: int  # this rank's rows per minibatch (the last may be short, a rank's may be empty)
    multi_update: bool  # more than one optimizer step on this batch (epochs or minibatches)


@dataclass
class _Tally:
    """What one update's minibatches add up, for its metrics (:meth:`GRPOUpdate._metrics`)."""

    acc: LossMetrics = field(default_factory=LossMetrics)
    steps: int = 0  # optimizer steps taken
    skipped: int = 0  # minibatches skipped (non-finite loss or gradient norm)
    grad_norms: list[float] = field(default_factory=list)
    prefix_tokens: list[int] = field(default_factory=list)  # each minibatch's shared prefix length (0: none)
    tokens: int = 0  # real tokens of the loss micro-batches (attention mask), summed over minibatches and epochs
    tokens_padded: int = 0  # rows x width of the loss micro-batches, the same sums


class GRPOUpdate:
    """The optimizer side of a GRPO step.

    Args:
        model: the policy being trained (HF causal LM or peft model).
        loss_fn: the loss on ``model``, a :class:`~torchrl_grpo.objectives.loss_interface.PolicyLoss`
            (:class:`~torchrl_grpo.objectives.loss.GRPOLoss`, :class:`~torchrl_grpo.objectives.sft_loss.SFTLoss`):
            the update reads its scoring settings and ``normaliser`` and passes each call its ``prefix`` and
            ``anchor``; None: planning and scoring helpers only (:meth:`row_facts`, :meth:`micro_batches`).
        optimizer: over ``model``'s trainable parameters.
        reference: ``None`` (no KL term), or a callable returning a context manager that yields the frozen reference
            module to score with (a copy of the initial policy, or the LoRA model with its adapter switched off). Its
            inputs go to the device of its first parameter (the plan's ref device, :mod:`torchrl_grpo.distributed.placement`, for
            a placed copy; the train device for LoRA's), and ``ref_log_probs`` come back on the batch's device (CPU).
        device: where the forward passes run.
        autocast: returns the autocast context of the forward passes (bf16 on CUDA, a null context on CPU).
        ppo_epochs / minibatch_size: passes over the batch and episodes per optimizer step (0: the whole batch).
        micro_batch_size: at most this many episodes per forward/backward (0: no count limit).
        max_tokens_per_mb: padded-token budget per forward/backward (rows x longest row, after a shared prefix): an
            int >= 0 (0: no budget) or ``"auto"`` (:func:`~torchrl_grpo.training.micro_batch.auto_token_budget`: the
            device's activation allowance over the model's bytes per token; on CUDA every episode of a step in one
            pass when that fits). Within both, episodes may be sorted by length so that less padding is computed
            (:func:`~torchrl_grpo.training.micro_batch.plan_micro_batches`); the gradient is the same.
        max_grad_norm: gradient-norm clip per optimizer step.
        anchor: ``loss.anchor``: ``auto`` | ``recompute`` | ``behaviour`` (see :meth:`needs_anchor_recompute`).
        exact_log_probs: the rollout backend's behaviour log-probs are the trainer's own numerics
            (:attr:`~torchrl_grpo.backends.base.RolloutBackend.exact_log_probs`).
        seed: with the step number, seeds the minibatch permutation.
        dp: the data-parallel group (:mod:`torchrl_grpo.distributed.data_parallel`; None: one process). ``batch`` is then this
            rank's shard: the minibatch normaliser is summed over ranks and the gradients all-reduced before each
            optimizer step, so the step equals the single-process step on the union of the shards
            (``minibatch_size`` is global; a rank may hold an empty minibatch). With an FSDP-sharded ``model``
            every rank runs the same number of forward/backward passes (:meth:`idle_pass` pads them; see
            :mod:`torchrl_grpo.distributed.data_parallel`).
        shared_prefix: ``train.shared_prefix``: ``auto`` runs the longest token prefix common to all episodes of a
            minibatch (or of a no-grad recompute) once and every micro-batch's remainders against its keys/values
            (:mod:`torchrl_grpo.objectives.shared_prefix`; exact), when there is one and the model supports it; ``off``: every
            micro-batch runs whole episodes.

    Attributes:
        optimizer_steps: optimizer steps taken so far (restored on resume).
        penalties: the :class:`~torchrl_grpo.objectives.loss_interface.Penalty` list every micro-batch's loss pays
            (:meth:`add_loss_penalty`), each its own ``loss_penalty_<name>`` entry and metric.
        flops: the :class:`~torchrl_grpo.reporting.flops.FlopCounter` of the last update (reset by each call): the
            model FLOPs of its passes (reference and anchor recomputes, loss forwards and backwards, shared prefixes),
            logged as ``perf/update_flops``.

    Raises:
        ValueError: a setting out of its choices or range. TypeError: ``loss_fn`` does not declare the
        :class:`~torchrl_grpo.objectives.loss_interface.PolicyLoss` interface.
    """

    def __init__(self, model: torch.nn.Module, loss_fn: PolicyLoss | None, optimizer: torch.optim.Optimizer, *,
                 reference: Callable[[], AbstractContextManager] | None, device: torch.device,
                 autocast: Callable[[], AbstractContextManager], ppo_epochs: int, minibatch_size: int,
                 micro_batch_size: int, max_tokens_per_mb: int | str, max_grad_norm: float, anchor: str,
                 exact_log_probs: bool, seed: int, optimizer_steps: int = 0, dp=None, shared_prefix: str = "auto"
                 ) -> None:
        if anchor not in ANCHORS:
            raise ValueError(f"anchor must be one of {ANCHORS}, got {anchor!r}")
        if shared_prefix not in SHARED_PREFIX_MODES:
            raise ValueError(f"shared_prefix must be one of {SHARED_PREFIX_MODES}, got {shared_prefix!r}")
        if micro_batch_size < 0:
            raise ValueError(f"micro_batch_size must be >= 0 (0: no count limit), got {micro_batch_size}")
        if max_tokens_per_mb != "auto" and (isinstance(max_tokens_per_mb, bool) or not isinstance(max_tokens_per_mb, int)
                                            or max_tokens_per_mb < 0):
            raise ValueError(f"max_tokens_per_mb must be an int >= 0 or 'auto', got {max_tokens_per_mb!r}")
        if loss_fn is not None:
            check_policy_loss(loss_fn)
        self.shared_prefix = shared_prefix
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.reference, self.device, self.autocast = reference, device, autocast
        self.ppo_epochs, self.minibatch_size = ppo_epochs, minibatch_size
        self.micro_batch_size, self.max_tokens_per_mb = micro_batch_size, max_tokens_per_mb
        self.max_grad_norm, self.anchor, self.exact_log_probs, self.seed = max_grad_norm, anchor, exact_log_probs, seed
        self.optimizer_steps = optimizer_steps
        self.dp = dp or SINGLE
        self.penalties: list[Penalty] = []
        self.flops = FlopCounter()

    @torch.no_grad()
    def row_facts(self, td: TensorDict) -> RowFacts:
        """:class:`RowFacts` of ``td``'s rows, computed where ``td`` lives and read back in one transfer (on a CPU
        batch, the collector's, no device sync at all). The prompt key compares each row's tokens (and mask) before
        ``first - 1``, the columns the per-micro-batch prompt sharing of
        :mod:`torchrl_grpo.objectives.log_probs` may run once."""
        tokens, am = td["tokens"], td["attention_mask"].bool()
        sc = td["response_mask"].bool() & am
        n, T = tokens.shape
        cols = torch.arange(T, device=tokens.device)
        has = sc.any(-1)
        first = torch.where(has, sc.long().argmax(-1), torch.full_like(has, T, dtype=torch.long))
        if self.loss_fn is None or self.loss_fn.normaliser == "token":  # (no loss: planning only)
            norm = td["response_mask"].sum(-1)
        else:
            norm = (td["response_tokens"] > 0).long()
        before = cols[None, :] < (first[:, None] - 1)
        key = torch.cat([torch.where(before, tokens, -1), torch.where(before, am.long(), -1)], 1)
        prompt = (torch.unique(key, dim=0, return_inverse=True)[1] if n > 1 else torch.zeros(n, dtype=torch.long,
                                                                                             device=tokens.device))
        same = (tokens == tokens[:1]).all(0) & am.all(0) if n > 1 else torch.zeros(T, dtype=torch.bool,
                                                                                    device=tokens.device)
        common = same.long().cumprod(0).sum().expand(n)
        length = am.sum(-1)
        right = (am == (cols[None, :] < length[:, None])).all(-1)
        stats = (torch.stack([length, first, sc.sum(-1), norm.long(), prompt, common, right.long()]).tolist() if n
                 else [[]] * 7)
        length_l, first_l, scored, norm_l, prompt_l, common_l, right_l = stats
        return RowFacts(length_l, first_l, scored, norm_l, prompt_l, int(common_l[0]) if n > 1 else 0,
                        [bool(r) for r in right_l])

    def token_budget(self, facts: RowFacts, prefix_len: int = 0, model=None, device: torch.device | None = None) -> int:
        """The padded-token budget per micro-batch (0: none): ``max_tokens_per_mb``, or with ``"auto"``
        :func:`~torchrl_grpo.training.micro_batch.auto_token_budget` of ``model`` (None: the policy) on ``device``
        (None: the training device) for the minibatch's longest row after the prefix."""
        if self.max_tokens_per_mb != "auto":
            return int(self.max_tokens_per_mb)
        longest = max((n - prefix_len for n in facts.length), default=1)
        return auto_token_budget(model if model is not None else self.model, device or self.device, longest)

    def micro_batches(self, td: TensorDict, prefix_len: int = 0, *, facts: RowFacts | None = None, model=None,
                      device: torch.device | None = None):
        """Micro-batches of ``td`` by ``micro_batch_size`` and the token budget (:meth:`token_budget`), planned by
        :func:`~torchrl_grpo.training.micro_batch.plan_micro_batches` (consecutive rows, or sorted by length when that
        computes fewer positions), each cut to its own longest episode when its rows are right-padded, and carrying its ``window`` (first scored
        column, scored tokens: a non-tensor entry the loss passes to
        :func:`~torchrl_grpo.objectives.log_probs.token_log_probs`). Yields ``(rows, micro_batch)``; ``rows``: the
        indices into ``td``. With a shared prefix of ``prefix_len`` tokens (run once, outside the micro-batches) the
        budget counts remainder tokens only, ``rows x longest remainder``: what a micro-batch's forward stores (each
        remainder also reads the prefix's keys/values, [layers x 2 x kv_heads x P x head_dim] held once for all
        micro-batches); the per-micro-batch prompt sharing then does not apply either. ``facts``: :meth:`row_facts`
        of ``td`` when the caller has them; ``model`` / ``device``: whose budget (default: the policy's)."""
        f = facts if facts is not None else self.row_facts(td)
        full_T = td["tokens"].shape[-1]
        remainder = [max(1, n - prefix_len) for n in f.length]
        if not all(f.right_padded):  # left padding is not cut away: every row costs the full width, so sorting by
            remainder = [max(1, full_T - prefix_len)] * len(remainder)  # length saves nothing; groups stay together
        shareable = [max(0, c - 1) for c in f.first]
        plan = plan_micro_batches(remainder, self.micro_batch_size, self.token_budget(f, prefix_len, model, device),
                                  None if prefix_len else f.prompt, None if prefix_len else shareable)
        for rows in plan:
            mb = td[torch.tensor(rows)] if rows != list(range(td.shape[0])) else td
            right = all(f.right_padded[r] for r in rows)
            if right:  # real tokens first: the columns after the longest episode are padding only (left: kept whole)
                T = max(f.length[r] for r in rows)
                mb = mb.apply(lambda x, T=T: x[:, :T] if x.ndim == 2 and x.shape[-1] == full_T else x,
                              batch_size=mb.batch_size)
            mb.set_non_tensor("window", Window(max(1, min(f.first[r] for r in rows)), sum(f.scored[r] for r in rows),
                                               right))
            yield rows, mb

    @torch.no_grad()
    def fill_log_probs(self, td: TensorDict, key: str, model, device: torch.device | None = None) -> None:
        """``td[key]`` = no-grad log-probs of the sampled tokens under ``model``, in eval mode (dropout off, the
        same network the sampler ran), with the loss's processed distribution (temperature, top-k, top-p).
        ``device``: where ``model`` lives (None: the training device); the result is on ``td``'s device (CPU),
        gathered on ``device`` and copied back once.

        A micro-batch without a scored token (e.g. an episode whose prompt reached ``rollout.max_context_tokens``
        and was collected with 0 response tokens) is not run: its log-probs are 0 by definition, and the minibatch's
        shared prefix does not apply to it (it must end before the first scored column, and there is none). As in
        :meth:`__call__`, which trains only micro-batches with response tokens."""
        dev = device or self.device
        ref = td["sample_log_probs"]
        out = torch.zeros(ref.shape, dtype=torch.float32, device=dev)
        facts = self.row_facts(td)
        was_training = model.training
        model.eval()
        try:
            with self.autocast():
                prefix = self.shared_prefix_for(td, model, dev, facts=facts)
            micros = [(rows, mb) for rows, mb in self.micro_batches(td, prefix.length if prefix is not None else 0,
                                                                    facts=facts, model=model, device=dev)
                      if sum(facts.scored[r] for r in rows) > 0]
            for rows, mb in self._lockstep(micros, model, backward=False, device=dev):
                self.flops.head(model, sum(facts.scored[r] for r in rows), backward=False)
                with self.autocast():
                    lp, _ = token_log_probs(model, mb["tokens"].to(dev), mb["attention_mask"].to(dev),
                                            temperature=self.loss_fn.temperature,
                                            top_p=self.loss_fn.top_p, top_k=self.loss_fn.top_k,
                                            response_mask=mb["response_mask"].to(dev), prefix=prefix,
                                            window=mb.get_non_tensor("window"))
                out[torch.tensor(rows, device=dev), : lp.shape[-1]] = lp.float()
        finally:
            model.train(was_training)
        td[key] = out.to(ref.device)

    def idle_pass(self, model, *, backward: bool, device: torch.device | None = None) -> None:
        """One forward (and with ``backward``, one backward) of ``model`` on a one-token input, its output times 0:
        it changes no gradient. What a rank with fewer micro-batches runs, under FSDP, so that the collectives of
        every rank's passes line up (:meth:`~torchrl_grpo.distributed.data_parallel.DataParallel.lockstep`)."""
        tok = torch.zeros(1, 1, dtype=torch.long, device=device or self.device)
        with self.autocast():
            logits = model(input_ids=tok, use_cache=False).logits
        if backward:
            (logits.float().sum() * 0.0).backward()

    def _lockstep(self, passes: list, model, *, backward: bool, device: torch.device | None = None,
                  stop: Callable[[], bool] = lambda: False) -> Iterator:
        """The items of ``passes`` to run, in order. Under FSDP every rank runs the same number of passes
        (:meth:`~torchrl_grpo.distributed.data_parallel.DataParallel.lockstep` pads ``passes`` with ``None`` to the
        most any rank has): a padding entry, or every entry once ``stop()`` (a non-finite loss ended the minibatch),
        runs an :meth:`idle_pass` instead. Without FSDP nothing is padded and ``stop()`` ends the iteration."""
        sharded = is_fsdp(model)
        for item in self.dp.lockstep(passes, model):  # a collective under FSDP
            if item is not None and not stop():
                yield item
            elif sharded:  # the rank with the most passes is still running them
                self.idle_pass(model, backward=backward, device=device)
            else:
                return

    def shared_prefix_for(self, td: TensorDict, model, device: torch.device | None = None, *,
                          facts: RowFacts | None = None) -> SharedPrefix | None:
        """The :class:`~torchrl_grpo.objectives.shared_prefix.SharedPrefix` of ``td``'s episodes under ``model`` (with a graph
        when gradients are on), or None for the plain path: ``shared_prefix="off"``, fewer than 2 episodes, no common
        real-token prefix before the first response column, a model without the decoder/LM-head split or KV cache
        support, or no saving (:meth:`prefix_tokens_saved`). Call under the forward passes' autocast. ``device``:
        where ``model`` lives (None: the training device); ``facts``: :meth:`row_facts` of ``td`` if known."""
        if self.shared_prefix == "off" or td.shape[0] < 2:
            return None
        f = facts if facts is not None else self.row_facts(td)
        P = max(0, min(f.common, min(f.first) - 1))  # = shared_prefix_length(tokens, attention, scored tokens)
        dec_head = _decoder_and_head(model)
        if P < 1 or dec_head is None:
            return None
        if not sharing_pays(self.prefix_tokens_saved(td, P, model, facts=f, device=device), model,
                            device or self.device):  # on CUDA: only savings worth one more launch-bound pass
            return None
        return build_shared_prefix(model, dec_head[0], td["tokens"][0, :P].to(device or self.device))

    def prefix_tokens_saved(self, td: TensorDict, P: int, model, *, facts: RowFacts | None = None,
                            device: torch.device | None = None) -> int:
        """Decoder tokens the minibatch prefix of ``P`` tokens saves over today's path, which (without gradient
        checkpointing) still shares each micro-batch's distinct prompts (:mod:`torchrl_grpo.objectives.log_probs`): a batch of
        several groups with a short common prefix (GSM8K: the system prompt) and micro-batches holding whole groups
        runs fewer tokens that way. Token counts, not FLOPs (attention over the prefix is the same either way).
        Computed from :meth:`row_facts` (``facts``, if known) on the host: no device read."""
        f = facts if facts is not None else self.row_facts(td)
        shared = P + sum(n - P for n in f.length)
        if _uses_grad_checkpointing(model):
            return sum(f.length) - shared
        plain = 0
        for rows in plan_micro_batches(f.length, self.micro_batch_size, self.token_budget(f, 0, model, device),
                                       f.prompt, [max(0, c - 1) for c in f.first]):
            s = max(0, min(f.first[r] for r in rows) - 1)  # columns the per-micro-batch sharing may dedupe
            s = min(s, min(f.length[r] for r in rows))
            n_distinct = len({f.prompt[r] for r in rows}) if len(rows) > 1 and s > 0 else len(rows)
            plain += n_distinct * s + sum(f.length[r] - s for r in rows)
        return plain - shared

    def needs_anchor_recompute(self, multi_update: bool, stale: bool) -> bool:
        """Whether the PPO anchor π_old must be the trainer's own no-grad recompute rather than the sampler's
        behaviour log-probs (``loss.anchor``; see :mod:`torchrl_grpo.objectives.loss`). ``auto`` recomputes when the anchor
        would otherwise differ from the first update's π_θ: several updates per batch, a stale batch (async), a
        sampler with other numerics (vLLM bf16, a weight copy), or bf16 autocast in the trainer."""
        if self.anchor == "recompute" or multi_update or stale:
            return True
        if self.anchor == "behaviour":
            return False
        return not self.exact_log_probs or self.device.type == "cuda"

    def __call__(self, batch: TensorDict, *, step: int, stale: bool = False) -> dict[str, float]:
        """Update the model on ``batch`` (tensor columns only, at least one response token).

        ``step`` seeds the minibatch order and labels warnings; ``stale``: the batch was generated by an older
        policy than the one being trained (async). A minibatch whose loss or gradient norm is not finite is skipped
        (``train/skipped_minibatches``) without touching the weights.
        """
        plan = self._plan(batch.shape[0])
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.flops.reset()
        with self.flops.watching(self.model):  # shapes of every pass, no device read (perf/update_flops)
            return self._update(batch, plan, params, step, stale)

    def _update(self, batch: TensorDict, plan: _Plan, params: list[torch.nn.Parameter], step: int,
                stale: bool) -> dict[str, float]:
        """:meth:`__call__`'s body: the reference and anchor passes, then the minibatch optimizer steps."""
        self._fill_reference(batch)
        current = self._set_anchor(batch, plan.multi_update, stale)
        anchor = "recomputed" if "old_log_probs" in batch.keys() else "current" if current else "behaviour"
        self.model.train()
        tally = _Tally()
        with sparse_tied_embedding_grads(self.model) as densify:  # exact; no [V, H] zero-fill per pass
            for _epoch, mini in self._minibatches(batch, plan, step):
                self.optimizer.zero_grad(set_to_none=True)
                finite = self._accumulate_gradients(mini, tally, anchor)  # loss over micro-batches, backward of each
                if not self.dp.all(finite is None or bool(finite)):  # every rank skips, or none (one read)
                    self._skip(tally, step, "non-finite loss")
                    continue
                densify()  # a no-op unless a tied embedding's gradient ended up sparse
                self.dp.all_reduce_grads(params)  # summed over ranks; a no-op on one process
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))  # one read
                if not math.isfinite(grad_norm):
                    self._skip(tally, step, "non-finite gradient norm")
                    continue
                tally.grad_norms.append(grad_norm)
                self.optimizer.step()
                tally.steps += 1
        self.optimizer_steps += tally.steps
        self.model.eval()
        return self._metrics(batch, tally, current)

    # ------------------------------------------------------------------ what a caller may change between updates
    def add_loss_penalty(self, penalty: Callable[[], torch.Tensor], name: str) -> None:
        """From the next update on, every micro-batch's loss also pays ``penalty()``: a scalar tensor with gradient
        on the training device, added to the loss output as its own entry ``loss_penalty_<name>``
        (:class:`~torchrl_grpo.objectives.loss_interface.Penalty`; :func:`~torchrl_grpo.objectives.loss.total_loss`
        backpropagates it with the loss's own terms) and reported as the metric of that name. The loss module is
        not touched. Micro-batch losses are weighted by their share of the minibatch, so each optimizer step pays it
        once. Penalties stack, in the order added. Used by continual EWC (:class:`torchrl_grpo.continual.algorithms.EWC`).

        Raises:
            ValueError: a bad ``name`` or one already added. TypeError: ``penalty`` is not callable.
        """
        p = Penalty(name, penalty)
        if any(q.name == name for q in self.penalties):
            raise ValueError(f"a penalty named {name!r} is already added")
        self.penalties.append(p)

    def set_reference(self, reference: Callable[[], AbstractContextManager] | None) -> None:
        """From the next update on, the KL term (``ref_log_probs``) is scored against ``reference``: a callable
        returning a context manager that yields the frozen module (the constructor's ``reference`` contract), or
        None for no reference. Used by the continual KL anchor (:class:`torchrl_grpo.continual.algorithms.KLAnchor`).

        Raises:
            TypeError: ``reference`` is neither callable nor None.
        """
        if reference is not None and not callable(reference):
            raise TypeError(f"reference must be a callable returning a context manager, got {type(reference).__name__}")
        self.reference = reference

    def set_trainable(self, params: list[torch.nn.Parameter]) -> None:
        """The optimizer's parameter group becomes ``params`` (the optimizer must have one group, as
        :func:`torchrl_grpo.training.optimizer.make_optimizer` builds it); the state (Adam moments) of parameters it
        drops is dropped too (``optimizer.state_dict()`` fails on state without a group). Learning rate, schedule and
        hyperparameters are kept; a parameter new to the optimizer starts with fresh moments. Used by continual
        LoRA-per-domain (:class:`torchrl_grpo.continual.algorithms.LoRAPerDomain`) when it switches adapters.

        Raises:
            ValueError: the optimizer has more than one parameter group.
        """
        groups = self.optimizer.param_groups
        if len(groups) != 1:
            raise ValueError(f"set_trainable needs an optimizer with one parameter group, this one has {len(groups)}")
        keep = set(map(id, params))
        for p in groups[0]["params"]:
            if id(p) not in keep:
                self.optimizer.state.pop(p, None)
        groups[0]["params"] = list(params)

    # ------------------------------------------------------------------ the update's bookkeeping
    def _plan(self, n: int) -> _Plan:
        """Minibatches of an update on this rank's ``n`` episodes. ``minibatch_size`` is global (0: the whole batch):
        data-parallel, the episode count is summed over ranks (a collective), every rank runs the same number of
        minibatches and takes ``ceil(n / n_mb)`` of its own rows into each."""
        n_all = int(self.dp.sum(n))  # episodes over all ranks (n on one process)
        mb_all = max(1, min(self.minibatch_size or n_all, n_all))
        n_mb = -(-n_all // mb_all)  # minibatches per epoch, the same on every rank
        mb_size = mb_all if not self.dp.enabled else max(1, -(-n // n_mb))  # this rank's rows per minibatch
        return _Plan(n_mb, mb_size, multi_update=self.ppo_epochs > 1 or n_mb > 1)

    def _minibatches(self, batch: TensorDict, plan: _Plan, step: int) -> Iterator[tuple[int, TensorDict]]:
        """``(epoch, minibatch)`` over ``ppo_epochs`` passes of ``batch``, each pass ``plan.n_mb`` minibatches of
        ``plan.mb_size`` rows, in a fresh order (seeded by ``seed`` and ``step``) when the batch gets several
        optimizer steps. A minibatch may be empty on a rank (data parallel)."""
        n = batch.shape[0]
        gen = torch.Generator().manual_seed(self.seed * 31 + step)
        for epoch in range(self.ppo_epochs):
            perm = torch.randperm(n, generator=gen) if plan.multi_update else torch.arange(n)
            for start in range(0, plan.n_mb * plan.mb_size, plan.mb_size):
                yield epoch, batch[perm[start : start + plan.mb_size]]

    def _fill_reference(self, batch: TensorDict) -> None:
        """``batch["ref_log_probs"]`` under the frozen reference (the KL term's), when there is one."""
        if self.reference is not None:
            with self.reference() as ref, self.flops.watching(ref):  # where it lives (a placed copy, LoRA's policy,
                self.fill_log_probs(batch, "ref_log_probs", ref, next(ref.parameters()).device)  # a CL anchor)

    def _set_anchor(self, batch: TensorDict, multi_update: bool, stale: bool) -> bool:
        """Choose the PPO anchor π_old of this update (:meth:`needs_anchor_recompute`): the sampler's behaviour
        log-probs, a no-grad recompute into ``batch["old_log_probs"]``, or (returned True; the loss calls then get
        ``anchor="current"``) the loss forward's own detached log-probs."""
        recompute = self.needs_anchor_recompute(multi_update, stale)
        # one optimizer step on this batch (and no dropout): π_prox is the model as it is now, which the loss's own
        # forward computes; its detached log-probs anchor the ratio instead of a separate no-grad pass (exact up to
        # float rounding; measured: the pass was 9.9 of 47 s of an async update, benchmarks/results/async_placement.md)
        current = recompute and not multi_update and self.anchor != "recompute" and not _has_dropout(self.model)
        if recompute and not current:
            self.fill_log_probs(batch, "old_log_probs", self.model)
        return current

    def _accumulate_gradients(self, mini: TensorDict, tally: _Tally, anchor: str) -> torch.Tensor | None:
        """Backward of the loss of each micro-batch of ``mini`` that has a scored token (gradient accumulation),
        each loss call anchored at ``anchor`` (:data:`~torchrl_grpo.objectives.loss_interface.ANCHOR_SOURCES`),
        against one shared-prefix forward when there is one (:meth:`shared_prefix_for`) and that prefix's backward
        after them. Returns whether every loss was finite, as a bool 0-d tensor not yet read (None: no micro-batch
        ran). Nothing is read back in the loop: every micro-batch runs and is backpropagated, a non-finite one adds
        no metrics (decided on the device), and the caller skips the whole minibatch's gradient after one read."""
        facts = self.row_facts(mini)  # the minibatch's one read
        denom = max(self.dp.sum(float(sum(facts.norm))), 1.0)  # the whole minibatch's normaliser, over all ranks
        with self.autocast():
            prefix = self.shared_prefix_for(mini, self.model, facts=facts)  # one prefix forward for all micro-batches
        tally.prefix_tokens.append(prefix.length if prefix is not None else 0)
        micros = [(rows, micro) for rows, micro in self.micro_batches(mini, tally.prefix_tokens[-1], facts=facts)
                  if sum(facts.scored[r] for r in rows) > 0]
        finite = None
        for rows, micro in self._lockstep(micros, self.model, backward=True):
            tally.tokens += sum(facts.length[r] for r in rows)
            tally.tokens_padded += micro["tokens"].numel()
            ok = self._micro_backward(micro, sum(facts.norm[r] for r in rows) / denom, prefix, tally.acc,
                                      tokens=float(sum(facts.scored[r] for r in rows)), anchor=anchor)
            finite = ok if finite is None else finite & ok
        if prefix is not None:
            prefix.backward()  # the remainders' summed gradient through the one prefix pass
        return finite

    def _micro_backward(self, micro: TensorDict, share: float, prefix: SharedPrefix | None, acc: LossMetrics, *,
                        tokens: float, anchor: str) -> torch.Tensor:
        """Backward of one micro-batch's loss (plus the :attr:`penalties`, each its own ``loss_penalty_*`` entry)
        weighted by its ``share`` of the minibatch's normaliser (the micro-batches' gradients then sum to the
        minibatch loss's), and its metrics (``tokens``: its scored tokens) into ``acc``. Returns whether the loss was
        finite, a bool 0-d tensor, unread: a non-finite loss is backpropagated too (the caller then discards the
        minibatch's gradient) and adds no metrics."""
        micro = micro.to(self.device)
        self.flops.head(self.model, int(tokens), backward=True)  # the LM head runs at the scored positions only
        with self.autocast():
            losses = self.loss_fn(micro, prefix=prefix, anchor=anchor)
            for p in self.penalties:
                losses[p.key] = p()
        loss = total_loss(losses)
        finite = torch.isfinite(loss.detach())
        (loss * share).backward()
        acc.add(losses, tokens=tokens, scaled_loss=loss.detach() * share, finite=finite, share=share)
        return finite

    def _behaviour_gap(self, out: dict[str, float], anchored: bool) -> dict[str, float]:
        """The loss's ``logp_diff_mean`` / ``logp_diff_max`` (popped from ``out``) as ``rollout/logp_diff_*``: mean and
        max over the step's response tokens of |behaviour log-prob - the trainer's recompute| (nats; TRL and verl log
        the same gap), the recompute being the PPO anchor: the no-grad pass (``old_log_probs``) or the loss forward's
        own log-probs (``anchored``: ``anchor="current"``). With the behaviour anchor (one on-policy step, an exact
        sampler) the loss forward is that recompute too, unless the model has dropout (train mode then differs from
        the sampler's eval mode): nothing is logged then. Async: the gap includes the batch's policy lag."""
        gap = {k: out.pop(k) for k in ("logp_diff_mean", "logp_diff_max") if k in out}
        if not gap or not (anchored or not _has_dropout(self.model)):
            return {}
        return {f"rollout/{k}": v for k, v in gap.items()}

    def _skip(self, tally: _Tally, step: int, why: str) -> None:
        """Drop this minibatch's gradient (no optimizer step) and count it as skipped."""
        self.optimizer.zero_grad(set_to_none=True)
        tally.skipped += 1
        log.warning("step %d: %s, minibatch skipped", step, why)

    def _metrics(self, batch: TensorDict, tally: _Tally, current: bool) -> dict[str, float]:
        """The update's metrics: the loss metrics reduced over micro-batches and ranks as
        :data:`~torchrl_grpo.objectives.loss.REDUCTIONS` declares (a collective), ``train/*`` counters and
        ``grad_norm``, ``rollout/logp_diff_mean`` / ``rollout/logp_diff_max`` (:meth:`_behaviour_gap`), and this rank's
        work: ``train/tokens`` / ``train/tokens_padded`` (real / rows x width tokens of the loss micro-batches),
        ``perf/update_flops`` and ``perf/update_decoder_tokens`` (:attr:`flops`)."""
        out = tally.acc.finish(tally.steps + tally.skipped, self.dp)
        out.update(self._behaviour_gap(out, "old_log_probs" in batch.keys() or current))
        out["train/anchor_recomputed"] = float("old_log_probs" in batch.keys() or current)
        out["train/anchor_current"] = float(current)
        out["train/optimizer_steps"] = float(tally.steps)
        out["train/skipped_minibatches"] = float(tally.skipped)
        out["train/shared_prefix_tokens"] = float(np.mean(tally.prefix_tokens)) if tally.prefix_tokens else 0.0
        out["train/tokens"] = float(tally.tokens)
        out["train/tokens_padded"] = float(tally.tokens_padded)
        out["perf/update_flops"] = self.flops.flops
        out["perf/update_decoder_tokens"] = float(self.flops.decoder_tokens)
        if tally.grad_norms:
            out["grad_norm"] = float(np.mean(tally.grad_norms))
        return out

