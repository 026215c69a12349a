r"""GRPO loss: clipped surrogate over response tokens, optional k3 KL to a reference, entropy bonus.

Sources and equations (token ``t`` of episode ``i``; ``A_i`` the group-relative advantage,
see :mod:`torchrl_grpo.objectives.advantage`):

* Ratio: :math:`\rho_{i,t} = \exp(\log\pi_\theta(o_{i,t}|\cdot) - \log\pi_{old}(o_{i,t}|\cdot))`, where every
  :math:`\pi` is the distribution the behaviour policy samples from: the softmax of the *processed* logits —
  divided by the temperature, then top-k- and nucleus (top-p)-truncated and renormalised
  (:func:`torchrl_grpo.objectives.sampling.processed_logits`; ``temperature``/``top_k``/``top_p`` below must be the sampling
  settings). The rollout backends report their behaviour log-probs under that same distribution, so on-policy
  :math:`\rho = 1`; scoring the raw softmax instead would put every ratio at the kept mass (~``top_p``). Greedy
  rollouts (temperature 0) report the raw softmax: pass ``temperature=1, top_p=1, top_k=0`` for them. A token
  outside the current policy's kept set scores :data:`torchrl_grpo.objectives.log_probs.MASKED_LOG_PROB` (ratio ~0, no
  gradient) instead of ``-inf``. The entropy is that of the same :math:`\pi`.
* Clipped surrogate — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Eq. (3), with the
  asymmetric "clip-higher" bounds of DAPO (Yu et al., 2025, arXiv:2503.14476), Eq. (10):
  :math:`L^{clip}_{i,t} = \min(\rho_{i,t} A_i,\ \mathrm{clip}(\rho_{i,t}, 1-\epsilon_{low}, 1+\epsilon_{high}) A_i)`.
* KL to a frozen reference — DeepSeekMath Eq. (4), the unbiased "k3" estimator (Schulman, 2020):
  :math:`D_{i,t} = \frac{\pi_{ref}}{\pi_\theta} - \log\frac{\pi_{ref}}{\pi_\theta} - 1`.
* Objective: :math:`\mathcal{L} = -\mathrm{agg}(L^{clip}) + \beta\,\mathrm{agg}(D) - c_H\,\mathrm{agg}(H)`.
* Aggregation ``agg`` over the response-token mask ``m``:

  - ``"token_mean"`` — DAPO Eq. (8), token-level mean over the whole batch:
    :math:`\sum_{i,t} m_{i,t} x_{i,t} / \sum_{i,t} m_{i,t}`.
  - ``"seq_mean_token_mean"`` — DeepSeekMath Eq. (3): mean over each sequence's tokens, then over sequences.
  - ``"seq_mean_token_sum_norm"`` — Dr. GRPO (Liu et al., 2025, arXiv:2503.20783), Eq. (3): per-sequence token
    sum divided by a constant ``max_tokens`` (not the sequence length), then mean over sequences. The constant is
    required (the trainer passes the episode's token budget, ``gconfig.max_new_tokens x econfig.max_turns``): a
    default of "this call's padded width" made the gradient depend on how a batch is cut into micro-batches.

* Decoupled (off-policy) correction — AReaL (Fu et al., 2025, arXiv:2505.24298), Eq. (5): whenever the batch
  carries proximal ``old_log_probs`` (recomputed by the trainer: the PPO anchor) beside the behaviour log-probs
  (from the rollout engine), each token's surrogate is multiplied by the behaviour importance weight
  :math:`w_{i,t} = \pi_{prox}/\pi_{behav}` — whatever the epoch/minibatch settings, so a stale or numerically
  different sampler is always corrected. With a cap ``c`` (``behaviour_weight_cap``) the weight is either
  truncated, :math:`\min(w, c)` (``behaviour_weight_mode="truncate"``; truncated importance sampling, Ionides 2008,
  as in IMPALA's V-trace, Espeholt et al., 2018, arXiv:1802.01561, Eq. 1), or the token is masked out when
  :math:`w > c` (``"mask"``: AReaL's ``behav_imp_weight_cap``, which drops those tokens' surrogate but keeps them
  in the token count). Without ``old_log_probs`` the anchor is the behaviour policy itself and no weight applies,
  unless the call passes ``anchor="current"`` (one optimizer step per batch): then π_prox is the current
  policy, i.e. this forward's own detached log-probs (the value a no-grad recompute gives, without that pass).
* Sequence-level importance ratio (``importance_level="sequence"``) — GSPO, Group Sequence Policy Optimization
  (Zheng et al., 2025, arXiv:2507.18071), Eq. (7):
  :math:`s_i(\theta) = (\pi_\theta(y_i|x)/\pi_{old}(y_i|x))^{1/|y_i|}
  = \exp(\frac{1}{|y_i|}\sum_t \log\frac{\pi_\theta(y_{i,t}|\cdot)}{\pi_{old}(y_{i,t}|\cdot)})`, the mean over
  episode ``i``'s response tokens (the mask ``m``; prompt, tool/user turns and padding excluded), clipped at the
  sequence level, Eq. (5): :math:`L^{clip}_i = \min(s_i A_i,\ \mathrm{clip}(s_i, 1-\epsilon_{low},
  1+\epsilon_{high}) A_i)`. Every token of episode ``i`` carries :math:`L^{clip}_i`, so
  ``aggregation="seq_mean_token_mean"`` gives Eq. (5)'s mean over the group's sequences exactly (``token_mean``
  weights each sequence by its length). The gradient is that of Eq. (5) (:math:`\nabla s_i = s_i \cdot` the mean
  of the tokens' :math:`\nabla\log\pi_\theta`); the paper's GSPO-token variant (per-token advantages) is not
  implemented. The paper clips far tighter than GRPO: ``clip_eps_low=3e-4``, ``clip_eps_high=4e-4`` (its experiments),
  not 0.2 / 0.28, and :class:`GRPOLoss` takes those (and ``seq_mean_token_mean``) when the caller sets none
  (:data:`LEVEL_DEFAULTS`). The decoupled behaviour weight is then taken at the sequence level too:
  :math:`w_i = \exp(\mathrm{mean}_t(\log\pi_{prox} - \log\pi_{behav}))`, truncated or masked per episode.
  ``"token"`` (default) is the per-token ratio above (GRPO / DAPO).

Metrics (all over response tokens only, never over prompt or padding):

* ``ess``: normalised effective sample size of the importance weights
  :math:`w_{i,t}=\pi_\theta/\pi_{behav}` — Kong (1992); Owen, *Monte Carlo theory* Eq. (9.13):
  :math:`\mathrm{ESS} = (\sum w)^2 / (N \sum w^2)` in (0, 1]; 1 when the policy equals the behaviour policy.
* ``clip_fraction``: fraction of tokens whose ratio lies outside ``[1-eps_low, 1+eps_high]``
  (``clip_fraction_low`` / ``clip_fraction_high`` split it), the quantity TorchRL's ``GRPOLoss`` reports.
  With ``importance_level="sequence"`` the ratio of every token is its episode's :math:`s_i`: the clip fraction is
  the share of response tokens in episodes whose :math:`s_i` is clipped, and ``ratio_mean`` / ``ratio_max`` and
  the ESS weights (:math:`\exp(\mathrm{mean}_t(\log\pi_\theta - \log\pi_{behav}))`) are per episode, each
  episode counted once per response token (so micro-batches combine as token means do).
* ``kl_ref`` (k3 to the reference) and ``entropy``: nats per response token, the token mean over the call's response
  tokens whatever the aggregation (the loss terms ``loss_kl`` = β agg(D) and ``loss_entropy`` = -c_H agg(H) use the
  aggregation; under ``token_mean`` the two coincide). ``kl_behaviour`` (k1 estimate
  :math:`\log\pi_{behav}-\log\pi_\theta`), ``ratio_mean``, ``ratio_max``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives.common import LossModule

from torchrl_grpo.config.choices import (  # config loss.*: defined once there
    AGGREGATIONS, BEHAVIOUR_WEIGHT_MODES, IMPORTANCE_LEVELS,
)
from torchrl_grpo.objectives.log_probs import Window, token_log_probs
from torchrl_grpo.objectives.loss_interface import PolicyLossModule, resolve_anchor
from torchrl_grpo.objectives.shared_prefix import SharedPrefix

__all__ = ["GRPOLoss", "total_loss", "combine_ess", "BEHAVIOUR_WEIGHT_MODES", "token_log_probs", "masked_aggregate",
           "AGGREGATIONS", "IMPORTANCE_LEVELS", "REDUCTIONS", "reduction_of", "LossMetrics", "sequence_mean",
           "LEVEL_DEFAULTS"]

log = logging.getLogger(__name__)

#: What :class:`GRPOLoss` takes for ``clip_eps_low`` / ``clip_eps_high`` / ``aggregation`` when the caller leaves them
#: None (config ``loss.*: null``, the default), by ``importance_level``: ``"token"`` — GRPO with DAPO's clip-higher
#: (Yu et al., 2025, arXiv:2503.14476, Eq. 10: 0.2 / 0.28) and DAPO's token-level mean (Eq. 8); ``"sequence"`` —
#: GSPO (Zheng et al., 2025, arXiv:2507.18071): the clip range of its experiments, 3e-4 / 4e-4 (Sec. 5.1; a sequence
#: ratio, the geometric mean of the token ratios, stays far closer to 1 than a token's: 0.2 would almost never clip),
#: and Eq. (5)'s mean over the group's sequences (``seq_mean_token_mean``). A value the caller sets is kept.
LEVEL_DEFAULTS: dict[str, dict] = {
    "token": {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "aggregation": "token_mean"},
    "sequence": {"clip_eps_low": 3e-4, "clip_eps_high": 4e-4, "aggregation": "seq_mean_token_mean"},
}

#: A sequence-level clip range wider than this is GRPO-sized, not GSPO-sized: :class:`GRPOLoss` warns (as TRL's docs
#: advise 3e-4 / 4e-4 for GSPO) but keeps it.
_GSPO_WIDE_CLIP = 0.01


def masked_aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str, max_tokens: int | None = None) -> torch.Tensor:
    """Reduce a per-token quantity [B, T] over masked tokens to a scalar (see module docstring).

    Raises:
        ValueError: unknown ``mode``; ``seq_mean_token_sum_norm`` without a ``max_tokens`` >= 1.
    """
    m = mask.to(x.dtype)
    if mode == "token_mean":
        return (x * m).sum() / m.sum().clamp_min(1.0)
    per_seq_count = m.sum(-1)
    has_tokens = per_seq_count > 0
    n_seq = has_tokens.sum().clamp_min(1)
    if mode == "seq_mean_token_mean":
        per_seq = (x * m).sum(-1) / per_seq_count.clamp_min(1.0)
        return (per_seq * has_tokens).sum() / n_seq
    if mode == "seq_mean_token_sum_norm":
        per_seq = (x * m).sum(-1) / float(_sum_norm_constant(max_tokens))
        return (per_seq * has_tokens).sum() / n_seq
    raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")


def _sum_norm_constant(max_tokens: int | None) -> int:
    """``max_tokens``, the Dr. GRPO constant of ``seq_mean_token_sum_norm``, checked.

    Raises:
        ValueError: None or < 1.
    """
    if max_tokens is None or isinstance(max_tokens, bool) or int(max_tokens) < 1:
        raise ValueError("aggregation='seq_mean_token_sum_norm' needs max_tokens >= 1 (Dr. GRPO's constant: the most "
                         f"response tokens an episode may have), got {max_tokens!r}")
    return int(max_tokens)


def _level_settings(level: str, clip_eps_low: float | None, clip_eps_high: float | None,
                    aggregation: str | None) -> tuple[float, float, str]:
    """``(clip_eps_low, clip_eps_high, aggregation)`` of a :class:`GRPOLoss` at importance level ``level``: the
    caller's values, each None replaced by :data:`LEVEL_DEFAULTS`; logs which defaults a sequence level took, and warns
    when a sequence level keeps a GRPO-sized clip range."""
    d = LEVEL_DEFAULTS[level]
    unset = [k for k, v in (("clip_eps_low", clip_eps_low), ("clip_eps_high", clip_eps_high),
                            ("aggregation", aggregation)) if v is None]
    low = d["clip_eps_low"] if clip_eps_low is None else float(clip_eps_low)
    high = d["clip_eps_high"] if clip_eps_high is None else float(clip_eps_high)
    agg = d["aggregation"] if aggregation is None else aggregation
    if level == "sequence":
        if unset:
            log.info("importance_level=sequence (GSPO): %s from the paper (arXiv:2507.18071)",
                     ", ".join(f"{k}={d[k]}" for k in unset))
        if max(low, high) > _GSPO_WIDE_CLIP:
            log.warning("importance_level=sequence with clip_eps_low=%g, clip_eps_high=%g: GSPO's sequence ratios "
                        "(geometric means of token ratios) stay much closer to 1 than token ratios, so this range "
                        "rarely clips; the paper uses 3e-4 / 4e-4 (unset loss.clip_eps_low / clip_eps_high to take "
                        "them)", low, high)
    return low, high, agg


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``x`` [B, T] over the ``mask`` tokens (values off the mask never read: a NaN there stays out)."""
    m = mask.to(x.dtype)
    return torch.where(mask, x, torch.zeros_like(x)).sum() / m.sum().clamp_min(1.0)


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's mean of ``x`` [B, T] over its ``mask`` [B, T] tokens, on every column of the row ([B, T]; 0 for a
    row without a masked token). Values off the mask are ignored (never multiplied: an inf there stays out). With
    ``x = log pi_theta - log pi_old`` it is GSPO's log s_i (module docstring)."""
    m = mask.to(x.dtype)
    per_row = torch.where(mask, x, torch.zeros_like(x)).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1.0)
    return per_row.expand_as(x)


class _Inputs(NamedTuple):
    """The input columns of one :class:`GRPOLoss` call, checked (:meth:`GRPOLoss._inputs`)."""

    tokens: torch.Tensor  # long [B, T]
    attn: torch.Tensor  # bool [B, T]
    mask: torch.Tensor  # bool [B, T]: scored tokens (response & real)
    behav: torch.Tensor  # float [B, T]: behaviour log-probs
    adv: torch.Tensor  # float [B]
    old: torch.Tensor  # float [B, T]: π_prox's log-probs (behav unless anchor is "recomputed"; unused for "current")
    anchor: str  # one of loss_interface.ANCHOR_SOURCES
    window: Window | None


class GRPOLoss(PolicyLossModule):
    """GRPO / DAPO / Dr. GRPO policy loss as a TorchRL ``LossModule`` (formulas in the module docstring), a
    :class:`~torchrl_grpo.objectives.loss_interface.PolicyLossModule` (``normaliser``: ``"token"`` for
    ``token_mean``, ``"episode"`` for the seq-mean aggregations).

    Input TensorDict, batch size [B] (one row per episode; T = padded sequence length):

    * ``tokens`` long [B, T] — prompt + response (+ env/tool/user tokens in multi-turn episodes).
    * ``attention_mask`` bool [B, T] — real (non-padding) tokens.
    * ``response_mask`` bool [B, T] — tokens the policy generated (assistant tokens); the loss and every metric
      are computed over these only.
    * ``sample_log_probs`` float [B, T] — behaviour log-probs of generated tokens (0 elsewhere).
    * ``advantage`` float [B] — group-relative advantage (see :func:`torchrl_grpo.objectives.advantage.group_advantages`).
    * optional ``old_log_probs`` float [B, T] — proximal policy log-probs recomputed by the trainer (PPO anchor
      for several updates per batch, and the decoupled correction); defaults to ``sample_log_probs``.
    * optional ``ref_log_probs`` float [B, T] — frozen reference log-probs (needed when ``kl_coef > 0``).
    * optional ``window`` (non-tensor) :class:`~torchrl_grpo.objectives.log_probs.Window` of the rows (first scored
      column, scored tokens, right-padded), when the caller knows them on the host (:func:`~torchrl_grpo.objectives.log_probs.token_log_probs`'s ``window``): the forward then
      reads nothing back from the device. Set by :class:`~torchrl_grpo.training.update.GRPOUpdate`.

    Output TensorDict (scalars): ``loss_objective``, ``loss_kl``, ``loss_entropy`` (sum them to get the loss to
    backpropagate; :func:`total_loss` does it), and metrics ``ess``, ``clip_fraction``, ``clip_fraction_low``,
    ``clip_fraction_high``, ``kl_ref``, ``kl_behaviour``, ``entropy``, ``ratio_mean``, ``ratio_max``,
    ``behaviour_weight_mean``, ``behaviour_weight_masked`` (fraction of tokens masked in ``"mask"`` mode),
    ``logp_diff_mean`` / ``logp_diff_max`` (|behaviour - the trainer's log-prob| over response tokens, nats:
    :meth:`_behaviour_gap`), ``num_tokens``, and the batch accumulators ``ess_log_sum_w`` = log Σw,
    ``ess_log_sum_w2`` = log Σw² (over this call's response tokens) so that a trainer can combine micro-batches into one batch-level ESS
    (:func:`combine_ess`) instead of averaging per-micro-batch ESS values.

    Args:
        actor: HF causal LM (a ``torch.nn.Module`` returning ``.logits``), possibly wrapped by peft.
        clip_eps_low / clip_eps_high: ε_low / ε_high; None (default): :data:`LEVEL_DEFAULTS` of the
            ``importance_level`` (token: DAPO's 0.2 / 0.28; sequence: GSPO's 3e-4 / 4e-4). Symmetric GRPO: 0.2 / 0.2.
        kl_coef: β of the k3 KL penalty to the reference (0 disables it; then ``ref_log_probs`` is not needed).
        entropy_coef: c_H of the entropy bonus (0 disables the term, entropy is still logged when cheap).
        aggregation: one of :data:`AGGREGATIONS`; None (default): :data:`LEVEL_DEFAULTS` of the ``importance_level``
            (token: ``token_mean``; sequence: ``seq_mean_token_mean``, GSPO's Eq. 5).
        max_tokens: the Dr. GRPO constant for ``seq_mean_token_sum_norm`` (required there: the most response
            tokens an episode may have; the trainer passes ``gconfig.max_new_tokens x econfig.max_turns``), unused
            by the other aggregations.
        temperature: the sampling temperature; logits are divided by it before the log-softmax so the ratio
            compares the same distributions the behaviour policy sampled from.
        top_p: the sampling nucleus mass in (0, 1] (1: none); applied after temperature and top-k, as when sampling.
        top_k: the sampling top-k (0: none).
        behaviour_weight_cap: cap ``c`` of the decoupled behaviour importance weight (AReaL Eq. 5), used when the
            input has ``old_log_probs``; ``None``: no cap (plain importance weight).
        behaviour_weight_mode: ``"truncate"`` (min(w, c)) or ``"mask"`` (tokens with w > c get weight 0).
            ``None`` disables the correction.
        importance_level: ``"token"`` (GRPO's per-token ratio) or ``"sequence"`` (GSPO's length-normalised
            sequence ratio, clipped per episode; module docstring). One of :data:`IMPORTANCE_LEVELS`. It picks the
            defaults of the clip range and the aggregation (:data:`LEVEL_DEFAULTS`: the paper's setting for
            ``"sequence"``); a sequence level with a clip range above 0.01 set by the caller is kept, with a warning.

    Raises:
        ValueError: on bad hyper-parameters, missing keys, or shape mismatches.
    """

    @dataclass
    class _AcceptedKeys(LossModule._AcceptedKeys):
        tokens: str = "tokens"
        attention_mask: str = "attention_mask"
        response_mask: str = "response_mask"
        sample_log_probs: str = "sample_log_probs"
        old_log_probs: str = "old_log_probs"
        ref_log_probs: str = "ref_log_probs"
        advantage: str = "advantage"
        window: str = "window"

    default_keys = _AcceptedKeys

    def __init__(
        self,
        actor: torch.nn.Module,
        *,
        clip_eps_low: float | None = None,
        clip_eps_high: float | None = None,
        kl_coef: float = 0.0,
        entropy_coef: float = 0.0,
        aggregation: str | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        behaviour_weight_cap: float | None = None,
        behaviour_weight_mode: str = "truncate",
        logits_chunk: int = 0,
        importance_level: str = "token",
    ) -> None:
        if importance_level not in IMPORTANCE_LEVELS:
            raise ValueError(f"importance_level must be one of {IMPORTANCE_LEVELS}, got {importance_level!r}")
        clip_eps_low, clip_eps_high, aggregation = _level_settings(importance_level, clip_eps_low, clip_eps_high,
                                                                   aggregation)
        if not 0 <= clip_eps_low < 1:
            raise ValueError(f"clip_eps_low must be in [0, 1), got {clip_eps_low}")
        if clip_eps_high < 0:
            raise ValueError(f"clip_eps_high must be >= 0, got {clip_eps_high}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")
        if kl_coef < 0 or entropy_coef < 0:
            raise ValueError("kl_coef and entropy_coef must be >= 0")
        if behaviour_weight_cap is not None and behaviour_weight_cap <= 0:
            raise ValueError("behaviour_weight_cap must be > 0 or None")
        if behaviour_weight_mode not in BEHAVIOUR_WEIGHT_MODES:
            raise ValueError(f"behaviour_weight_mode must be one of {BEHAVIOUR_WEIGHT_MODES}, got {behaviour_weight_mode!r}")
        if aggregation == "seq_mean_token_sum_norm":
            _sum_norm_constant(max_tokens)
        super().__init__(actor, temperature=temperature, top_p=top_p, top_k=top_k)
        self.clip_eps_low = float(clip_eps_low)
        self.clip_eps_high = float(clip_eps_high)
        self.kl_coef = float(kl_coef)
        self.entropy_coef = float(entropy_coef)
        self.aggregation = aggregation
        self.max_tokens = max_tokens
        self.behaviour_weight_cap = behaviour_weight_cap
        self.behaviour_weight_mode = behaviour_weight_mode
        self.logits_chunk = int(logits_chunk)
        self.importance_level = importance_level

    @property
    def normaliser(self) -> str:
        """``"token"`` for ``token_mean``, else ``"episode"`` (the seq-mean aggregations divide by sequences)."""
        return "token" if self.aggregation == "token_mean" else "episode"

    @property
    def in_keys(self):
        k = self.tensor_keys
        return [k.tokens, k.attention_mask, k.response_mask, k.sample_log_probs, k.advantage]

    @property
    def out_keys(self):
        return ["loss_objective", "loss_kl", "loss_entropy", "ess", "clip_fraction"]

    def _get(self, td: TensorDictBase, key: str, required: bool = True):
        if key in td.keys():
            return td.get(key)
        if required:
            raise ValueError(f"GRPOLoss: input TensorDict lacks key {key!r}; present: {sorted(map(str, td.keys()))}")
        return None

    def _inputs(self, td: TensorDictBase, anchor: str | None) -> _Inputs:
        """The input columns as the forward uses them, checked (shapes, keys, ``anchor``)."""
        k = self.tensor_keys
        anchor = resolve_anchor(td, anchor, k.old_log_probs)
        tokens = self._get(td, k.tokens)
        attn = self._get(td, k.attention_mask).bool()
        mask = self._get(td, k.response_mask).bool() & attn
        behav = self._get(td, k.sample_log_probs).float()
        adv = self._get(td, k.advantage).float().reshape(-1)
        old = self._get(td, k.old_log_probs).float() if anchor == "recomputed" else behav
        if tokens.shape != attn.shape or behav.shape != tokens.shape or old.shape != tokens.shape:
            raise ValueError("tokens, attention_mask, response_mask and log-probs must all be [B, T]")
        if adv.shape[0] != tokens.shape[0]:
            raise ValueError(f"advantage has {adv.shape[0]} rows, tokens {tokens.shape[0]}")
        window = td.get_non_tensor(k.window, None) if k.window in td.keys() else None
        return _Inputs(tokens, attn, mask, behav, adv, old, anchor, window)

    def forward(self, tensordict: TensorDictBase, *, prefix: SharedPrefix | None = None,
                anchor: str | None = None) -> TensorDict:
        """Losses and metrics of ``tensordict`` (keys: :attr:`in_keys`).

        Args:
            prefix: a :class:`~torchrl_grpo.objectives.shared_prefix.SharedPrefix` every row starts with (see
                :func:`~torchrl_grpo.objectives.log_probs.token_log_probs`); its ``backward()`` is the caller's, after
                the last backward pass that reads it.
            anchor: π_prox of this call (:data:`~torchrl_grpo.objectives.loss_interface.ANCHOR_SOURCES`): ``"behaviour"``
                (``sample_log_probs``; no behaviour weight), ``"recomputed"`` (``old_log_probs``), ``"current"`` (this
                forward's own detached log-probs: the value a no-grad recompute gives, without that pass), or None:
                ``"recomputed"`` when the input has ``old_log_probs``, else ``"behaviour"``. The behaviour weight
                (module docstring) applies to every anchor but ``"behaviour"``.

        Raises:
            ValueError: missing keys, shapes that differ, a bad ``anchor`` or ``"recomputed"`` without
                ``old_log_probs``.
        """
        x = self._inputs(tensordict, anchor)
        logp, ent = token_log_probs(
            self.actor, x.tokens, x.attn, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            with_entropy=self.entropy_coef > 0, logits_chunk=self.logits_chunk, response_mask=x.mask, prefix=prefix,
            window=x.window,
        )
        old = logp.detach() if x.anchor == "current" else x.old
        zeros = torch.zeros_like(logp)
        log_ratio = torch.where(x.mask, logp - old, zeros)
        if self.importance_level == "sequence":  # GSPO Eq. (7): log s_i on every token of episode i
            log_ratio = sequence_mean(log_ratio, x.mask)
        ratio = log_ratio.exp()
        A = x.adv[:, None].expand_as(ratio)
        clipped = ratio.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high)
        surrogate = torch.minimum(ratio * A, clipped * A)
        behaviour_weight, weight_masked = None, None
        if x.anchor != "behaviour":  # decoupled: π_prox is not the behaviour policy
            behaviour_weight, weight_masked = self._behaviour_weight(old, x.behav, x.mask)
            surrogate = surrogate * behaviour_weight
        agg = lambda v: masked_aggregate(v, x.mask, self.aggregation, self.max_tokens)  # noqa: E731
        loss_objective = -agg(surrogate)
        k3 = self._k3(tensordict, logp, x.mask) if self.kl_coef > 0 else None
        ent = ent if self.entropy_coef > 0 else None
        out = self._metrics(x, logp, ratio, behaviour_weight, weight_masked, k3, ent)
        out.update(self._behaviour_gap(x, logp))
        out["loss_objective"] = loss_objective
        out["loss_kl"] = self.kl_coef * agg(k3) if k3 is not None else loss_objective.new_zeros(())
        out["loss_entropy"] = -self.entropy_coef * agg(ent) if ent is not None else loss_objective.new_zeros(())
        return TensorDict(out, batch_size=[])

    def _behaviour_weight(self, old: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor):
        """The decoupled weight π_prox/π_behav per token (1 off the mask), capped as ``behaviour_weight_mode`` says,
        and the tokens the ``"mask"`` mode zeroed (None otherwise). ``importance_level="sequence"``: per episode,
        exp of the mean log weight over its tokens, on each of them (so an episode is truncated or masked whole)."""
        log_w = old - behav if self.importance_level == "token" else sequence_mean(old - behav, mask)
        weight = torch.where(mask, log_w.exp(), torch.ones_like(old))
        c, masked = self.behaviour_weight_cap, None
        if c is not None and self.behaviour_weight_mode == "truncate":
            weight = weight.clamp(max=c)
        elif c is not None:  # "mask"
            masked = (weight > c) & mask
            weight = torch.where(masked, torch.zeros_like(weight), weight)
        return weight, masked

    def _k3(self, td: TensorDictBase, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The k3 KL estimate to the reference per token [B, T] (0 off the mask)."""
        ref = self._get(td, self.tensor_keys.ref_log_probs).float()
        d = torch.where(mask, ref - logp, torch.zeros_like(logp))
        return d.exp() - d - 1.0

    @torch.no_grad()
    def _behaviour_gap(self, x: _Inputs, logp: torch.Tensor) -> dict:
        """``logp_diff_mean`` / ``logp_diff_max``: mean and max over the response tokens of |behaviour log-prob -
        the trainer's log-prob of the same token| (nats), the trainer's being the recomputed anchor
        (``old_log_probs``) when the call has one, else this forward's own (the policy before this call's optimizer
        step, when it is the batch's first: :class:`~torchrl_grpo.training.update.GRPOUpdate` logs them as
        ``rollout/logp_diff_*`` then). 0 for a sampler with the trainer's own numerics; NaN without a response token."""
        mask = x.mask
        mine = x.old if x.anchor == "recomputed" else logp.detach()
        gap = torch.where(mask, (x.behav - mine).abs(), torch.zeros_like(mine))
        nan = gap.new_full((), float("nan"))
        if not gap.numel():
            return {"logp_diff_mean": nan, "logp_diff_max": nan}
        some = mask.any()  # no host read
        return {"logp_diff_mean": torch.where(some, _masked_mean(gap, mask), nan),
                "logp_diff_max": torch.where(some, gap.max(), nan)}

    @torch.no_grad()
    def _metrics(self, x: _Inputs, logp, ratio, behaviour_weight, weight_masked, k3, ent) -> dict:
        """The detached metrics of one call (class docstring), over the response tokens ``x.mask``; no host read.
        ``k3`` / ``ent``: the per-token KL estimate and entropy [B, T] (None: that term is off), logged as token
        means (nats per response token, whatever the aggregation)."""
        mask = x.mask
        r = ratio.detach()
        below = (r < 1.0 - self.clip_eps_low) & mask
        above = (r > 1.0 + self.clip_eps_high) & mask
        n_tok = mask.sum()
        # log importance weights vs the behaviour policy, -inf off the mask (a zero weight): no boolean indexing,
        # no host read (a device sync each); no token gives log Σw = -inf and ESS = NaN
        lw = logp.detach() - x.behav
        if self.importance_level == "sequence":  # the episode's weight (module docstring), on each of its tokens
            lw = sequence_mean(lw, mask)
        lw = torch.where(mask, lw, torch.full_like(logp, float("-inf"))).flatten()
        log_sw, log_sw2 = torch.logsumexp(lw, 0), torch.logsumexp(2 * lw, 0)
        ess = (2 * log_sw - log_sw2).exp() / n_tok
        nan = torch.full_like(ess, float("nan"))
        ess = torch.where(n_tok > 0, ess, nan)
        ratio_max = torch.where(n_tok > 0, torch.where(mask, r, torch.zeros_like(r) - 1).max(), nan)
        return {
            "ess": ess,
            "clip_fraction": _masked_mean((below | above).float(), mask),
            "clip_fraction_low": _masked_mean(below.float(), mask),
            "clip_fraction_high": _masked_mean(above.float(), mask),
            "kl_behaviour": _masked_mean(x.behav - logp.detach(), mask),
            "ratio_mean": _masked_mean(r, mask),
            "ratio_max": ratio_max,
            "num_tokens": n_tok.float(),
            "kl_ref": _masked_mean(k3.detach(), mask) if k3 is not None else nan,
            "entropy": _masked_mean(ent.detach(), mask) if ent is not None else nan,
            "behaviour_weight_mean": (_masked_mean(behaviour_weight, mask) if behaviour_weight is not None
                                      else torch.ones_like(ess)),
            "behaviour_weight_masked": (_masked_mean(weight_masked.float(), mask) if weight_masked is not None
                                        else torch.zeros_like(ess)),
            "ess_log_sum_w": log_sw,
            "ess_log_sum_w2": log_sw2,
        }


def combine_ess(log_sum_w: list[float], log_sum_w2: list[float], n_tokens: float) -> float:
    r"""Batch-level normalised ESS from per-micro-batch accumulators (the ``ess_log_sum_w`` / ``ess_log_sum_w2``
    outputs of :class:`GRPOLoss`): :math:`(\sum w)^2 / (N \sum w^2)` over all N response tokens of the batch —
    Kong (1992); Owen, *Monte Carlo theory* Eq. (9.13). Averaging per-micro-batch ESS values instead is a different
    (larger) number: with one episode per micro-batch it becomes a per-episode ESS.

    Args:
        log_sum_w / log_sum_w2: log Σw and log Σw² of each micro-batch (``-inf`` for one with no tokens).
        n_tokens: N, the total number of response tokens.

    Returns:
        ESS in (0, 1]; NaN when there are no tokens.
    """
    if n_tokens <= 0 or not log_sum_w:
        return float("nan")

    def lse(xs: list[float]) -> float:  # log Σ exp(x) on the host (the inputs are host floats already)
        m = max(xs)
        return m if math.isinf(m) else m + math.log(sum(math.exp(x - m) for x in xs))

    a, b = lse([float(x) for x in log_sum_w]), lse([float(x) for x in log_sum_w2])
    if math.isinf(a) and math.isinf(b):
        return float("nan")
    return math.exp(2 * a - b) / n_tokens


#: How each :class:`GRPOLoss` output combines over the micro-batches of one step into a batch-level number
#: (:class:`LossMetrics`; :func:`reduction_of` reads it): ``"token_mean"`` weights each micro-batch's value by its
#: response tokens (the default for any key not listed and not a loss term; non-finite values, e.g. ``kl_ref`` without
#: a KL term, are left out), ``"max"`` keeps the largest, ``"sum"`` adds them, ``"ess"`` marks the accumulators of the
#: batch-level ESS (:func:`combine_ess`), and ``"share"`` — every ``loss_*`` term (the loss's own and the update's
#: ``loss_penalty_*``) — weights each micro-batch's value by its share of its minibatch's normaliser (the weight its
#: loss is backpropagated with: response tokens for ``token_mean``, episodes for the seq-mean aggregations), summed
#: and divided by the minibatches, as ``loss/total`` is. So a term is its minibatches' own (the same for every
#: micro-batch plan) and the terms add up to ``loss/total``; token weights gave other numbers under the seq-mean
#: aggregations (issue 43: ``loss_kl`` 0.1155 in one pass, 0.1083 with one episode per pass).
REDUCTIONS: dict[str, str] = {
    "ratio_max": "max",
    "num_tokens": "sum",
    "ess": "ess",
    "ess_log_sum_w": "ess",
    "ess_log_sum_w2": "ess",
    "logp_diff_max": "max",
}


def reduction_of(key: str) -> str:
    """How the loss output ``key`` combines over micro-batches: :data:`REDUCTIONS`' entry, else ``"share"`` for a
    ``loss_*`` term, else ``"token_mean"``."""
    return REDUCTIONS.get(key, "share" if key.startswith("loss_") else "token_mean")


class LossMetrics:
    """Batch-level metrics of one training step from the :class:`GRPOLoss` outputs of its micro-batches, each
    reduced as :data:`REDUCTIONS` declares, plus ``loss/total``: the mean over minibatches of the backpropagated
    loss (micro-batch losses weighted by their share of the minibatch, summed).

    Usage: :meth:`add` once per micro-batch that was backpropagated, :meth:`finish` at the end of the step. The
    accumulators stay tensors on the loss's device (a micro-batch reads nothing back: no device sync in the
    micro-batch loop); :meth:`finish` reads them all in one transfer.
    """

    def __init__(self) -> None:
        self._vec: dict[tuple[str, ...], list[torch.Tensor]] = {}  # token-mean keys -> [Σ value x tokens, Σ tokens]
        self._shared: dict[tuple[str, ...], torch.Tensor] = {}  # loss terms -> Σ value x share
        self._max: dict[str, torch.Tensor] = {}
        self._added: dict[str, torch.Tensor] = {}
        self._log_sw: list[torch.Tensor] = []
        self._log_sw2: list[torch.Tensor] = []
        self._total: torch.Tensor | None = None
        self._tokens: torch.Tensor | float = 0.0
        self._host: dict | None = None  # the accumulators read back (:meth:`_read`), plain floats

    def add(self, losses: TensorDictBase, tokens: float, scaled_loss: torch.Tensor | float,
            finite: torch.Tensor | None = None, *, share: float) -> None:
        """Record one micro-batch.

        Args:
            losses: its :class:`GRPOLoss` output.
            tokens: its number of response tokens (the weight of its token means; N of the batch ESS), a host number.
            scaled_loss: the loss backpropagated for it (total loss times its share of the minibatch), detached.
            share: its share of its minibatch's loss normaliser (the factor ``scaled_loss`` carries; the
                micro-batches of a minibatch add up to 1), the weight of its ``loss_*`` terms (:data:`REDUCTIONS`).
            finite: optional bool 0-d tensor: where False (a non-finite loss) the micro-batch adds nothing, decided on
                the device. Token-mean metrics that are themselves non-finite (``kl_ref`` without a KL term) are left
                out either way.
        """
        named = [k for k in losses.keys() if isinstance(k, str)]
        keys = tuple(k for k in named if reduction_of(k) == "token_mean")
        ok_mb = finite
        terms = tuple(k for k in named if reduction_of(k) == "share")
        if terms:  # Σ value x share, 0 where the micro-batch is not finite (as its loss/total part)
            vals = torch.stack([losses[k].detach().double().reshape(()) for k in terms]) * float(share)
            if ok_mb is not None:
                vals = torch.where(ok_mb, vals, torch.zeros_like(vals))
            self._shared[terms] = self._shared[terms] + vals if terms in self._shared else vals
        if keys:
            vals = torch.stack([losses[k].detach().double().reshape(()) for k in keys])
            ok = torch.isfinite(vals) if ok_mb is None else torch.isfinite(vals) & ok_mb
            zero = torch.zeros_like(vals)
            acc = self._vec.setdefault(keys, [zero, zero])
            acc[0] = acc[0] + torch.where(ok, vals * tokens, zero)
            acc[1] = acc[1] + torch.where(ok, zero + tokens, zero)
        gate = (lambda v, off: v) if ok_mb is None else (lambda v, off: torch.where(ok_mb, v, torch.full_like(v, off)))
        if tokens > 0:  # a micro-batch without response tokens has no importance weights
            for k, how in REDUCTIONS.items():
                if how == "max" and k in losses.keys():
                    v = gate(losses[k].detach().float(), float("-inf"))
                    self._max[k] = v if k not in self._max else torch.maximum(self._max[k], v)
                elif how == "sum" and k in losses.keys():
                    v = gate(losses[k].detach().float(), 0.0)
                    self._added[k] = v if k not in self._added else self._added[k] + v
            if "ess_log_sum_w" in losses.keys():  # a loss without importance weights (SFT) has no ESS
                self._log_sw.append(gate(losses["ess_log_sum_w"].detach().double(), float("-inf")))
                self._log_sw2.append(gate(losses["ess_log_sum_w2"].detach().double(), float("-inf")))
            self._tokens = self._tokens + (float(tokens) if ok_mb is None else ok_mb.double() * float(tokens))
        t = torch.as_tensor(scaled_loss, dtype=torch.float64,
                            device=ok_mb.device if ok_mb is not None else None).detach()
        if ok_mb is not None:
            t = torch.where(ok_mb, t, torch.zeros_like(t))
        self._total = t if self._total is None else self._total + t
        self._host = None

    def _read(self) -> dict:
        """Every accumulator as plain floats, read back from the device in one transfer (cached until :meth:`add`)."""
        if self._host is not None:
            return self._host
        pieces: list[torch.Tensor] = []
        for s_, w_ in self._vec.values():
            pieces += [s_, w_]
        pieces += list(self._shared.values())
        scalars = [*self._max.values(), *self._added.values(), *self._log_sw, *self._log_sw2]
        if self._total is not None:
            scalars.append(self._total)
        if isinstance(self._tokens, torch.Tensor):
            scalars.append(self._tokens)
        dev = pieces[0].device if pieces else (scalars[0].device if scalars else torch.device("cpu"))
        flat = (torch.cat([p.reshape(-1).to(dev, torch.float64) for p in pieces + scalars]).tolist()
                if pieces or scalars else [])
        it = iter(flat)
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        for keys in self._vec:
            vs = [next(it) for _ in keys]
            ws = [next(it) for _ in keys]
            for k, v, w in zip(keys, vs, ws):
                sums[k] = sums.get(k, 0.0) + v
                weights[k] = weights.get(k, 0.0) + w
        shared: dict[str, float] = {}
        for keys in self._shared:
            for k in keys:
                shared[k] = shared.get(k, 0.0) + next(it)
        mx = {k: next(it) for k in self._max}
        added = {k: next(it) for k in self._added}
        log_sw = [next(it) for _ in self._log_sw]
        log_sw2 = [next(it) for _ in self._log_sw2]
        total = next(it) if self._total is not None else None
        tokens = next(it) if isinstance(self._tokens, torch.Tensor) else float(self._tokens)
        self._host = {"sum": sums, "weight": weights, "shared": shared, "log_sw": log_sw, "log_sw2": log_sw2,
                      "max": mx, "added": added, "total": total, "tokens": tokens}
        return self._host

    def _state(self) -> dict:
        return dict(self._read())

    @staticmethod
    def _merged(states: list[dict]) -> dict:
        """The union of ``states`` (one per rank, in rank order): sums and token weights added, maxima maxed, ESS
        accumulators concatenated (so ``log Σw`` is over every rank's tokens)."""
        out = {"sum": {}, "weight": {}, "shared": {}, "log_sw": [], "log_sw2": [], "max": {}, "added": {},
               "total": None, "tokens": 0.0}
        for st in states:
            for key in ("sum", "weight", "shared", "added"):
                for k, v in st[key].items():
                    out[key][k] = out[key].get(k, 0.0) + v
            for k, v in st["max"].items():
                out["max"][k] = max(out["max"].get(k, float("-inf")), v)
            out["log_sw"] += st["log_sw"]
            out["log_sw2"] += st["log_sw2"]
            if st["total"] is not None:
                out["total"] = (out["total"] or 0.0) + st["total"]
            out["tokens"] += st["tokens"]
        return out

    def finish(self, n_minibatches: int, dp=None) -> dict[str, float]:
        """The step's metrics; ``n_minibatches``: minibatches attempted (stepped or skipped), the ``loss/total``
        denominator. ``ess`` and ``ratio_max`` are NaN when no micro-batch had response tokens. Reads the
        accumulators back once (the step's one device sync for its metrics).

        ``dp``: the data-parallel group (:class:`torchrl_grpo.distributed.data_parallel.DataParallel`; None or one process: this
        process's micro-batches). Under data parallelism every rank's accumulators are gathered first (a
        collective: every rank calls it) and each metric reduced over all ranks' micro-batches as
        :data:`REDUCTIONS` declares, so every rank returns the single-process metrics of the union of the shards:
        token means weighted by each micro-batch's response tokens (sum over ranks and micro-batches of value x
        tokens / sum of tokens; not the plain mean of per-rank means), ``num_tokens`` and ``loss/total`` summed
        (each rank's micro-batch losses are already scaled by the all-ranks normaliser,
        :class:`torchrl_grpo.training.update.GRPOUpdate`), the ``loss_*`` terms likewise (each micro-batch's value
        times its share, summed, over ``n_minibatches``: they add up to ``loss/total``), ``ratio_max`` maxed, ``ess``
        over every rank's tokens (:func:`combine_ess`)."""
        st = self._read()
        if dp is not None and dp.enabled:
            st = self._merged(dp.all_gather_object(self._state()))
        out = {k: st["sum"][k] / w for k, w in st["weight"].items() if w > 0}
        out.update({k: v / max(1, n_minibatches) for k, v in st["shared"].items()})  # as loss/total
        if st["total"] is not None:
            out["loss/total"] = st["total"] / max(1, n_minibatches)
        out["ess"] = combine_ess(st["log_sw"], st["log_sw2"], st["tokens"])
        for k, how in REDUCTIONS.items():
            if how == "max" and (k in st["max"] or k == "ratio_max"):  # ratio_max: NaN without tokens; others if seen
                v = st["max"].get(k, float("nan")) if st["log_sw"] else float("nan")
                out[k] = v if v != float("-inf") else float("nan")
            elif how == "sum":
                out[k] = st["added"].get(k, 0.0)
        return out


def total_loss(losses: TensorDictBase) -> torch.Tensor:
    """Sum of the ``loss_*`` entries of a loss output (:class:`GRPOLoss`: objective, KL, entropy;
    :class:`torchrl_grpo.objectives.sft_loss.SFTLoss`: the NLL; penalties the update adds, ``loss_penalty_*``): the scalar to backpropagate (TorchRL's convention).

    Raises:
        KeyError: no ``loss_*`` entry.
    """
    keys = [k for k in losses.keys() if isinstance(k, str) and k.startswith("loss_")]  # in output order
    if not keys:
        raise KeyError("a loss output needs at least one 'loss_*' entry")
    return sum((losses[k] for k in keys[1:]), losses[keys[0]])
