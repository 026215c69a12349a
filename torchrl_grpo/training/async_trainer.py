r"""Asynchronous GRPO: rollouts for the next steps are collected in a background thread while the trainer updates.

Pipeline (one process; torch releases the GIL inside its kernels, so generation and the update overlap on
separate cores / devices)::

    rollout thread:  collect batch s with the newest weights it has  ──► queue ──► trainer: update on batch s
                     (applies weights the trainer published, only between batches)   publish weights v = s+1

Staleness bound — AReaL (Fu et al., 2025, arXiv:2505.24298), Sec. 5.1: a batch generated with policy version
``v`` may be trained at version ``w`` only if ``w - v <= η`` (``train.max_staleness``). The rollout thread starts
batch ``s`` only when the trainer has finished at least ``s - η`` updates, and it always generates with the newest
published weights, so every trained batch satisfies the bound (logged as ``async/staleness``). ``η = 0`` gives
back the sync schedule; ``η = 1`` is the classic one-step-off-policy pipeline.

Off-policy correction: every batch here is trained against the trainer's own no-grad recompute as the PPO anchor
(π_prox; the rollout backend is a separate copy), and each token's surrogate carries the behaviour weight
π_prox/π_behav — AReaL's decoupled objective (Eq. 5, see :mod:`torchrl_grpo.objectives.loss`), capped by
``loss.behaviour_weight_cap`` (default 2.0; ``loss.behaviour_weight_mode`` truncate or mask) — whatever
``train.ppo_epochs`` and ``train.minibatch_size`` are.

Partial rollouts — AReaL Sec. 5.1 (interruptible rollout workers), APRIL (2025) — with ``train.partial_rollout_chunk``
``= N > 0``: the rollout thread does not wait for the end of a batch to take published weights; the backend checks
for them every N generated tokens (:attr:`~torchrl_grpo.backends.base.RolloutBackend.weight_update_hook`) and
continues the unfinished generations under them. Each token records the version that sampled it (the batch's
``token_policy_version``), its behaviour log-prob is that version's, and the decoupled objective's weight
π_prox/π_behav is per token, so a mixed-version episode is corrected token by token. The staleness bound is on the
*oldest* token (the version the batch started with, checked as above): ``async/staleness`` = step minus the oldest
response-token version; ``async/token_lag_mean`` and ``async/token_lag_frac/<k>`` (fraction of response tokens
``k`` versions behind) describe the mix. Which tokens land before or after an update depends on thread timing, so
with partial rollouts (as with any ``max_staleness > 0``) a run is not bitwise reproducible; a resumed run starts
with no generation in flight, at the checkpoint's version.

Idle time: ``async/wait_s`` is the trainer waiting for a batch, ``async/generator_wait_s`` the rollout thread
waiting for the staleness bound before the batch (both seconds).

The rollout backend never shares the training module: the transformers backend gets its own copy (LoRA merged),
vLLM its own engine; weights are handed over as a snapshot (``export_hf_weights``, cloned) and loaded by the rollout
thread between batches, so the trainer never waits for generation to finish a batch.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import torch

from torchrl_grpo.training import interrupt as interrupt
from torchrl_grpo.training.grpo_trainer import GRPOTrainer
from torchrl_grpo.backends.weight_sync import export_hf_weights

__all__ = ["AsyncGRPOTrainer", "token_lag_metrics"]

log = logging.getLogger(__name__)


def token_lag_metrics(batch, step: int, version: int, max_staleness: int) -> dict[str, float]:
    """Staleness of a batch trained at trainer version ``step``, from its per-token versions.

    Args:
        batch: collected TensorDict with ``response_mask`` [N, T] and (when the collector recorded it)
            ``token_policy_version`` [N, T] long.
        step: the trainer version the batch is trained at.
        version: the version the batch's generation started with (used when no token versions are present).
        max_staleness: η; the histogram has one bin per lag 0..η (a larger lag is a broken bound: it lands in no bin).

    Returns:
        ``async/staleness`` (step minus the oldest response-token version), ``async/token_lag_mean`` (mean over
        response tokens of step minus the token's version) and ``async/token_lag_frac/<k>`` (fraction of response
        tokens exactly ``k`` versions behind), all floats.
    """
    mask = batch["response_mask"]
    if "token_policy_version" in batch.keys() and mask.any():
        lag = (step - batch["token_policy_version"][mask]).float()
    else:
        lag = torch.full((max(int(mask.sum()), 1),), float(step - version))
    out = {"async/staleness": float(lag.max()), "async/token_lag_mean": float(lag.mean())}
    for k in range(max_staleness + 1):
        out[f"async/token_lag_frac/{k}"] = float((lag == k).float().mean())
    return out


class AsyncGRPOTrainer(GRPOTrainer):
    """GRPO with rollouts overlapped with updates (``mode=async``; entry point ``grpo-async.py``).

    Same arguments and outputs as :class:`~torchrl_grpo.training.grpo_trainer.GRPOTrainer`; adds the metrics
    ``async/staleness`` (trainer version minus the batch's oldest response-token version, in optimizer steps),
    ``async/token_lag_mean`` / ``async/token_lag_frac/<k>`` (:func:`token_lag_metrics`), ``async/wait_s`` (seconds
    the trainer waited for a batch), ``async/generator_wait_s`` (seconds the rollout thread waited for the staleness
    bound before it), ``async/partial_interrupts`` (weight updates taken mid-generation) and ``async/queued``
    (ready batches left).

    Raises:
        ValueError: ``train.max_staleness < 0``.
        RuntimeError: from :meth:`train_step` when the rollout thread failed (the original exception is chained).
        TrainingInterrupted: from :meth:`train_step` while it waits for a batch, on a stop request
            (:mod:`torchrl_grpo.training.interrupt`); the model is still that of the last completed step.
    """

    own_backend_copy = True  # build(own_backend_copy=True): a merged transformers copy, or vLLM's own engine

    def __init__(self, components) -> None:
        super().__init__(components)
        self._cond = threading.Condition()
        self._gen_lock = threading.Lock()  # one user of the backend at a time: rollout thread or evaluation
        self._ready: deque = deque()
        self._pending: tuple[int, list] | None = None  # (version, weights) published by the trainer
        self._backend_version = self.step  # trainer version of the weights the backend holds
        self._next_collect = self.step
        self._trained = self.step
        self._error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        # the backend's policy_version counts trainer versions here (tokens record it: token_policy_version)
        self.backend.policy_version = self._backend_version
        if self.settings.partial_rollout_chunk > 0:
            self.backend.partial_rollout_chunk = self.settings.partial_rollout_chunk
            self.backend.weight_update_hook = self._apply_pending
        #: optional callable run first thing in the rollout thread (e.g. pin it to a core: benchmarks/async_bench.py)
        self.on_rollout_thread_start = None

    # ------------------------------------------------------------------ weight hand-over
    def _publish_weights(self) -> None:
        """Count the finished update and hand its weights to the rollout thread, atomically.

        The rollout thread may start batch ``s`` once ``s - _trained <= η`` and then generates with the newest
        published weights; the bound holds only if those weights are of version ``_trained`` at the time of its check,
        so ``_trained`` and ``_pending`` change together under the lock (raising the counter before publishing let a
        batch through with the previous weights: staleness η + 1, issue 8). The snapshot is cloned before the lock.
        """
        snapshot = [(n, t.detach().clone()) for n, t in export_hf_weights(self.model)]
        with self._cond:
            self._trained += 1
            self._pending = (self._trained, snapshot)
            self._cond.notify_all()

    def _apply_pending(self) -> None:
        """Load published weights into the backend (caller holds ``_gen_lock``)."""
        with self._cond:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.backend.load_weights(pending[1])
            self._backend_version = self.backend.policy_version = pending[0]

    # ------------------------------------------------------------------ rollout thread
    def _rollout_loop(self) -> None:
        steps, eta, n = self.settings.steps, self.settings.max_staleness, self.settings.n_samples
        try:
            self.placement.pin_thread("inference")  # a disjoint CPU plan: this thread on the inference cores
            if self.on_rollout_thread_start is not None:
                self.on_rollout_thread_start()
            while True:
                t_wait = time.perf_counter()
                with self._cond:
                    while not self._stop and self._next_collect < steps and self._next_collect - self._trained > eta:
                        self._cond.wait()
                    if self._stop or self._next_collect >= steps:
                        return
                    s = self._next_collect
                    self._next_collect += 1
                with self._gen_lock:
                    self._apply_pending()
                    version = self._backend_version
                    if s - version > eta:  # cannot happen: _publish_weights counts and publishes atomically
                        raise RuntimeError(f"async staleness bound broken: batch {s} would be generated with policy "
                                           f"version {version} (train.max_staleness={eta})")
                    t0 = time.perf_counter()
                    interrupts = self.backend.stats.get("partial_interrupts", 0) if hasattr(self.backend, "stats") else 0
                    batch = self.collector.collect(self.tasks_for_step(s), n, step=s)
                    stats = dict(self.collector.last_stats)
                    stats["time/rollout_wall_s"] = time.perf_counter() - t0
                    stats["async/generator_wait_s"] = t0 - t_wait
                    if hasattr(self.backend, "stats"):
                        stats["async/partial_interrupts"] = float(self.backend.stats.get("partial_interrupts", 0)
                                                                  - interrupts)
                with self._cond:
                    self._ready.append((s, version, batch, stats))
                    self._cond.notify_all()
        except BaseException as e:  # surfaced in the trainer thread by train_step
            log.exception("rollout thread failed")
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._rollout_loop, name="grpo-rollout", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ trainer side
    def _next_batch(self) -> tuple[Any, dict[str, Any], bool]:
        """The next ready batch (waiting for it if needed): (batch, its rollout stats with the staleness metrics,
        ``async/wait_s`` and ``async/queued``, whether it is stale). Train steps run :meth:`GRPOTrainer.train_step`
        with this batch source and :meth:`_sync_policy` publishing the weights."""
        self._start()
        t0 = time.perf_counter()
        with self._cond:
            while not self._ready and self._error is None:
                if not self._thread.is_alive():
                    raise RuntimeError("rollout thread stopped without producing the next batch")
                interrupt.check()  # a stop request ends the wait: the model is still that of the last step
                self._cond.wait(timeout=1.0)
            if self._error is not None:
                raise RuntimeError(f"rollout thread failed: {self._error!r}") from self._error
            s, version, batch, stats = self._ready.popleft()
            queued = len(self._ready)
        wait_s = time.perf_counter() - t0
        if s != self.step:  # cannot happen: batches are produced and consumed in step order
            raise RuntimeError(f"async pipeline out of order: batch for step {s} at trainer step {self.step}")
        lag = token_lag_metrics(batch, s, version, self.settings.max_staleness)
        metrics: dict[str, Any] = {**stats, **lag, "async/wait_s": wait_s, "async/queued": float(queued)}
        return batch, metrics, lag["async/staleness"] > 0

    def _sync_policy(self, batch) -> dict[str, Any]:
        """Publish the new weights to the rollout thread (:meth:`_publish_weights`); ``policy_version`` is the
        trainer's version."""
        self._publish_weights()
        return {"policy_version": self._trained}

    def evaluate(self) -> dict[str, float]:
        """As the sync trainer, with the newest weights, while the rollout thread is held between batches."""
        with self._gen_lock:
            self._apply_pending()
            return super().evaluate()

    #: seconds :meth:`close` waits for the rollout thread to finish the batch in flight (a batch is seconds to
    #: minutes; a hung env or user simulator never ends one)
    close_timeout_s: float = 600.0

    def close(self) -> None:
        """Stop the rollout thread (it finishes the batch it is collecting) and join it for at most
        :attr:`close_timeout_s` seconds, then close as the sync trainer (the backend last). A thread still running
        then is logged as an error and left behind (a daemon: it ends with the process; whatever it still does with
        the closed backend fails inside it and is logged)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            if self._thread.is_alive():
                log.info("waiting for the rollout thread to finish its batch (at most %g s)", self.close_timeout_s)
            self._thread.join(timeout=self.close_timeout_s)
            if self._thread.is_alive():
                log.error("the rollout thread did not finish its batch within %g s (close_timeout_s): closing "
                          "without it (a hung env, user simulator or engine?)", self.close_timeout_s)
        super().close()
