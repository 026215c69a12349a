r"""The GRPO update's model FLOPs, counted from the model's config and parameter shapes and the shapes each forward pass
actually ran, and this machine's matmul peak measured in the same process at the update's shapes: together the
update's achieved FLOP/s and its model-FLOPs utilisation (MFU, ``perf/update_mfu`` in ``metrics.jsonl``).

**What is counted: model FLOPs**, as PaLM's MFU counts them (Chowdhery et al. 2022, "PaLM", appendix B): the
arithmetic the model needs for the passes the update runs, not what the hardware executes. A recomputation
(gradient checkpointing's re-run layers, the LM-head chunks re-run in the backward pass of
:mod:`torchrl_grpo.objectives.log_probs`) is not counted; work the update skips on purpose is not counted either (a
shared prompt prefix runs once, prompt columns get no LM head). One multiply-add is 2 FLOPs.

Notation: ``N`` matmul parameters of the decoder (every 2-D weight outside an embedding table, LoRA adapters
included: the actual parameter shapes), ``N_w`` those of them that train (``requires_grad``: all of ``N`` in full
fine-tuning, the adapters' ``r (d_in + d_out)`` each under LoRA), ``L`` layers, ``d_attn`` = attention heads x
head dim (config), ``H x V`` the LM head's weight. One decoder pass of ``b`` rows runs ``S`` query tokens per row,
each attending to ``K`` keys (``K = S``, or ``S`` + the length of the KV cache it reads: a shared prefix):

- forward: :math:`F = 2 N b S + 4 L\, d_{attn}\, b S K`. The weight term is Kaplan et al. 2020 ("Scaling Laws for
  Neural Language Models", Table 1 and eq. 2.2: :math:`C_{forward} \approx 2N + 2 n_{layer} n_{ctx} d_{attn}` per
  token). The attention term counts both the scores :math:`QK^T` and their product with ``V``, ``2 S K d_attn`` each
  per layer (Hoffmann et al. 2022, "Chinchilla", appendix F: "attention logits 2 x seq x seq x (key_size x heads)"
  and "softmax @ query reduction", the same again; Kaplan's table lists the scores only); the full matrix, not halved
  for the causal mask, as PaLM and Chinchilla count it. Softmax, norms and activations are left out (Chinchilla's
  ``3 x heads x seq^2`` for the softmax: under 1% here).
- backward of a pass with gradients on: the activation gradients cost each weight's product once more,
  :math:`2 N b S`, and each attention product twice (the gradients of both its inputs), :math:`8 L\, d_{attn}\, b S K`;
  the weight gradients of the trainable weights add :math:`2 N_w b S`. Full fine-tuning (``N_w = N``): in all
  :math:`6 N b S + 12 L\, d_{attn}\, b S K`, PaLM's ``6N + 12 L H Q T`` per token (appendix B) and Chinchilla's
  "backward = 2 x forward". LoRA: the frozen weights still pass the activation gradient down to the adapters of the
  layers below, so :math:`4 N b S + 2 N_w b S + 12 L\, d_{attn}\, b S K` (~4N per token: ``N_w`` is tiny).
- LM head (the update runs it at scored positions only): :math:`2 H V` per position forward; with gradients
  :math:`2 H V` more for the hidden state's gradient and :math:`2 H V` for the weight's if it trains (a tied
  embedding in full fine-tuning).

A no-grad pass (the anchor or reference recompute, ``fill_log_probs``) costs its forward only. Two over-counts, each
under 1/L of its term, against ``torch.utils.flop_counter.FlopCounterMode``'s matmul count (tests/test_step_time_split.py,
where the rest matches it exactly): a shared prefix pass is backpropagated through its keys and values only, so its
last layer's query, output and MLP weights get no gradient; with a frozen embedding (LoRA) the first layer's q/k/v
projections need no input gradient. Dense models: an MoE decoder's expert weights all count (an upper bound). A
sliding attention window is not applied (K is the full key length).

**The peak** (:func:`matmul_peak_flops`): a few timed ``torch.matmul`` of ``[tokens x hidden] @ [hidden x
intermediate]`` and ``[tokens x intermediate] @ [intermediate x hidden]`` (the MLP's matmuls, the bulk of ``N``) in
the update's dtype and autocast, on its device and in its thread (so on its cores), the best of the repeats.

``benchmarks/step_time_split.py RUN_DIR`` summarises these metrics of a run (docs/metrics.md).
"""
from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

__all__ = ["ModelFlops", "FlopCounter", "matmul_peak_flops", "update_peak_flops", "model_dims"]

log = logging.getLogger(__name__)


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The model's decoder stack (``get_decoder()`` of an HF causal LM, peft-wrapped or not), else the model itself."""
    try:
        dec = model.get_decoder()
    except Exception:  # not an HF model, FSDP-wrapped, or without the accessor
        dec = None
    return dec if isinstance(dec, torch.nn.Module) else model


def _config_int(model_config, *names: str) -> int | None:
    for n in names:
        v = getattr(model_config, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def model_dims(model: torch.nn.Module) -> dict[str, int]:
    """``layers``, ``hidden``, ``attn_dim`` (heads x head dim) and ``intermediate`` from the model's HF config
    (Llama/Qwen/Mistral names, GPT-2's ``n_layer`` / ``n_embd`` / ``n_head`` / ``n_inner``; intermediate defaults
    to 4 x hidden, head dim to hidden / heads).

    Raises:
        ValueError: the config does not give the layer count, hidden size and attention heads.
    """
    cfg = getattr(model, "config", None)
    cfg = getattr(cfg, "text_config", None) or cfg  # a multimodal config holds the language model's
    layers = _config_int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _config_int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _config_int(cfg, "num_attention_heads", "n_head")
    if layers is None or hidden is None or heads is None:
        raise ValueError(f"cannot count FLOPs of {type(model).__name__}: its config gives no layer count / hidden size "
                         f"/ attention heads (num_hidden_layers, hidden_size, num_attention_heads)")
    head_dim = _config_int(cfg, "head_dim") or hidden // heads
    inter = _config_int(cfg, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden
    return {"layers": layers, "hidden": hidden, "attn_dim": heads * head_dim, "intermediate": inter}


@dataclass(frozen=True)
class ModelFlops:
    """What the count needs of one model (module docstring for the formulas).

    Attributes:
        matmul_params: ``N``, decoder matmul weights (2-D parameters outside embedding tables).
        trainable_matmul_params: ``N_w``, those with ``requires_grad``.
        layers / attn_dim: ``L`` and ``d_attn`` (config).
        head_params: ``H x V`` of the LM head (0 when the model has none).
        head_trains: the LM head's weight has ``requires_grad``.
        trains: some parameter of the model has ``requires_grad`` (else a pass never has a backward).
    """

    matmul_params: int
    trainable_matmul_params: int
    layers: int
    attn_dim: int
    head_params: int = 0
    head_trains: bool = False
    trains: bool = True

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelFlops:
        """Counted from ``model``'s config (:func:`model_dims`) and its parameters' shapes and ``requires_grad``.

        Raises:
            ValueError: as :func:`model_dims`.
        """
        dims = model_dims(model)
        dec = _decoder(model)
        n = n_w = 0
        for m in dec.modules():
            if isinstance(m, torch.nn.Embedding):
                continue
            for p in m.parameters(recurse=False):
                if p.ndim == 2:
                    n += p.numel()
                    n_w += p.numel() if p.requires_grad else 0
        head_params, head_trains = 0, False
        try:
            head = model.get_output_embeddings()
        except Exception:
            head = None
        w = getattr(getattr(head, "base_layer", head), "weight", None)
        if isinstance(w, torch.Tensor) and w.ndim == 2:
            head_params, head_trains = w.numel(), bool(w.requires_grad)
        trains = any(p.requires_grad for p in model.parameters())
        return cls(n, n_w, dims["layers"], dims["attn_dim"], head_params, head_trains, trains)

    def decoder_pass(self, rows: int, query: int, keys: int, *, backward: bool) -> float:
        """FLOPs of one decoder pass: ``rows`` x ``query`` tokens, each attending to ``keys`` keys; ``backward``: its
        backward pass too (ignored when nothing trains)."""
        tokens = rows * query
        attn = 4.0 * self.layers * self.attn_dim * rows * query * keys
        out = 2.0 * self.matmul_params * tokens + attn
        if backward and self.trains:
            out += 2.0 * self.matmul_params * tokens + 2.0 * attn + 2.0 * self.trainable_matmul_params * tokens
        return out

    def head_pass(self, positions: int, *, backward: bool) -> float:
        """FLOPs of the LM head at ``positions`` positions (and its backward with ``backward``)."""
        out = 2.0 * self.head_params * positions
        if backward and self.trains:
            out += 2.0 * self.head_params * positions * (2 if self.head_trains else 1)
        return out


def _cache_length(past) -> int:
    """Tokens already in a KV cache handed to a forward (0 for none; read from shapes, no device sync)."""
    if past is None:
        return 0
    try:
        return int(past.get_seq_length())
    except Exception:  # a legacy tuple cache or one without the accessor
        try:
            return int(past[0][0].shape[-2])
        except Exception:
            return 0


class FlopCounter:
    """Accumulates the model FLOPs of the passes it watches (module docstring).

    ``with counter.watching(model):`` counts every forward of ``model``'s decoder from the shapes it is called with
    (a forward pre-hook: input ids or embeddings [b, S], the KV cache's length; grad mode says whether a backward
    follows); :meth:`head` adds the LM head's positions, which the caller knows. Reading shapes needs no device
    sync. Watching the same decoder twice (a LoRA reference is the policy with its adapter off) counts it once.

    Attributes:
        flops: model FLOPs counted so far.
        decoder_tokens: query positions the decoder ran (rows x S summed over passes).
    """

    def __init__(self) -> None:
        self.flops = 0.0
        self.decoder_tokens = 0
        self._watched: dict[int, ModelFlops] = {}  # id(decoder) -> its counts, while watched

    def reset(self) -> None:
        self.flops, self.decoder_tokens = 0.0, 0

    @contextmanager
    def watching(self, model: torch.nn.Module) -> Iterator[None]:
        """Count the forwards of ``model``'s decoder while open (nothing is changed in the model). A model whose
        config gives no dimensions (:func:`model_dims`: a test double, an unknown architecture) cannot be counted:
        :attr:`flops` becomes NaN (logged as null), training goes on."""
        dec = _decoder(model)
        key = id(dec)
        if key in self._watched:
            yield
            return
        try:
            counts = self._watched[key] = ModelFlops.of(model)
        except ValueError as exc:
            log.debug("update FLOPs not counted: %s", exc)
            self.flops = math.nan
            yield
            return

        def pre_hook(_module, args, kwargs):
            x = kwargs.get("input_ids", args[0] if args else None)
            if x is None:
                x = kwargs.get("inputs_embeds")
            if not isinstance(x, torch.Tensor) or x.ndim < 2:
                return None
            rows, query = int(x.shape[0]), int(x.shape[1])
            keys = query + _cache_length(kwargs.get("past_key_values"))
            self.flops += counts.decoder_pass(rows, query, keys, backward=torch.is_grad_enabled())
            self.decoder_tokens += rows * query
            return None

        handle = dec.register_forward_pre_hook(pre_hook, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()
            del self._watched[key]

    def head(self, model: torch.nn.Module, positions: int, *, backward: bool | None = None) -> None:
        """Add the LM head of ``model`` at ``positions`` positions (``backward``: default ``torch.is_grad_enabled()``).
        Counted only while ``model`` is watched."""
        counts = self._watched.get(id(_decoder(model)))
        if counts is not None:
            self.flops += counts.head_pass(int(positions),
                                           backward=torch.is_grad_enabled() if backward is None else backward)


def matmul_peak_flops(shapes: list[tuple[int, int, int]], *, dtype: torch.dtype = torch.float32,
                      device: torch.device | str = "cpu", autocast: Callable[[], object] | None = None,
                      repeats: int = 5, budget_s: float = 1.2) -> float:
    """The best FLOP/s of ``torch.matmul`` ``[m x k] @ [k x n]`` over ``shapes`` (``(m, k, n)`` each; ``2 m k n``
    FLOPs a product), in ``dtype`` on ``device`` under ``autocast()`` (the update's: on CUDA it makes the product
    bf16), in the calling thread.

    Each shape gets an equal share of ``budget_s``: its products start at 16 rows and double while twice the rows
    fit twice in what is left of the share (the small ones warm the kernels up), up to ``m``; then up to ``repeats``
    products at that size while another fits. The best rate of all counts. A slow dtype (bf16 on a CPU without bf16
    units) or a loaded machine so stays near the budget, timing fewer rows instead of seconds-long products. On CUDA
    each product is timed with events (a synchronisation per product: this is a start-up probe, not a step).

    Returns:
        FLOP/s, > 0.

    Raises:
        ValueError: no shapes, a non-positive dimension, or ``repeats < 1``.
    """
    if not shapes or any(min(s) < 1 for s in shapes) or repeats < 1:
        raise ValueError(f"matmul_peak_flops needs (m, k, n) shapes of positive sizes and repeats >= 1, got "
                         f"{shapes!r}, repeats={repeats}")
    device = torch.device(device)
    cuda = device.type == "cuda"
    ctx = autocast or nullcontext
    t_start = time.perf_counter()

    def operand(rows: int, cols: int) -> torch.Tensor:  # a fill at memset speed (randn of 4096 x 1536 took 1 s under
        return torch.full((rows, cols), 1.0 / cols, dtype=dtype, device=device)  # load); no denormals, no overflow

    def timed(a: torch.Tensor, b: torch.Tensor) -> float:
        """FLOP/s of one product (0 when the clock saw no time)."""
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            stop.record()
            stop.synchronize()
            dt = start.elapsed_time(stop) / 1e3
        else:
            t0 = time.perf_counter()
            torch.matmul(a, b)
            dt = time.perf_counter() - t0
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / dt if dt > 0 else 0.0

    best = 0.0
    with torch.no_grad(), ctx():
        for i, (m, k, n) in enumerate(shapes):
            deadline = t_start + budget_s * (i + 1) / len(shapes)  # each shape its share of the budget
            a, b = operand(m, k), operand(k, n)
            rows, timed_at_size = min(m, 16), 0
            while timed_at_size < repeats:
                t = time.perf_counter()
                best = max(best, timed(a[:rows], b))
                dt, left = time.perf_counter() - t, deadline - time.perf_counter()
                if rows < m and 4 * dt < left:  # twice the rows fit, twice over: grow (the small ones warm up)
                    rows = min(m, 2 * rows)
                    continue
                timed_at_size += 1
                if dt > left:  # another product would end past the shape's share
                    break
    if best <= 0:  # a clock too coarse for the product (cannot happen with perf_counter on a real matmul)
        raise RuntimeError(f"matmul_peak_flops measured no positive time on {shapes!r}")
    return best


def update_peak_flops(model: torch.nn.Module, tokens: int, *, device: torch.device | str,
                      autocast: Callable[[], object] | None = None, budget_s: float = 1.2) -> float:
    """:func:`matmul_peak_flops` at the update's shapes: the MLP's ``[tokens x hidden] @ [hidden x intermediate]`` and
    ``[tokens x intermediate] @ [intermediate x hidden]`` of ``model``'s config (:func:`model_dims`), ``tokens``
    clipped to [64, 4096] (the larger products take longer to time than they add), in the dtype of ``model``'s first
    floating-point parameter under ``autocast``.

    Raises:
        ValueError: as :func:`model_dims`.
    """
    dims = model_dims(model)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    m = max(64, min(int(tokens), 4096))
    h, i = dims["hidden"], dims["intermediate"]
    return matmul_peak_flops([(m, h, i), (m, i, h)], dtype=dtype, device=device, autocast=autocast,
                             budget_s=budget_s)
