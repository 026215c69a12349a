#!/usr/bin/env python
"""Time and peak memory of one GRPO forward+backward over a telecom-length episode (tau2 telecom small, solo).

    python benchmarks/update_cost_probe.py bfloat16 gc 1 300     # dtype, gc|nogc, episodes, response tokens

Qwen2.5-Coder-0.5B-Instruct with LoRA r=16 on all linear layers; the prompt is the real telecom solo prompt of task 0
(9,904 tokens), followed by random response tokens. Prints seconds and peak RSS (a baseline-free probe: it sizes
what one update costs on this machine, used in benchmarks/results/tau2_telecom_run.md).

Shared-prefix mode (benchmarks/results/update_cost_shared_prefix.md):

    python benchmarks/update_cost_probe.py shared bfloat16 gc 8 300   # dtype, gc|nogc, group size, remainder tokens

times, each in its own process (so each peak RSS is its own), (i) the plain path for 1 episode and (ii) the GRPO
update (:class:`torchrl_grpo.training.update.GRPOUpdate`, ``train.shared_prefix=auto``, the tau2 config's
``micro_batch_size 8`` / ``max_tokens_per_mb 12288``) of a group of 8 telecom episodes: the real prompt, then 8
different random multi-turn remainders of ~300 tokens (response, tool output, response; the tool tokens unscored),
and prints ``8 x plain_per_episode / shared_group``.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import gymnasium as gym
import torch
from peft import LoraConfig, get_peft_model
from tensordict import TensorDict

import envs
from torchrl_grpo.rollout.chat_tokens import ChatRenderer
from torchrl_grpo.objectives.loss import GRPOLoss, total_loss
from torchrl_grpo.models import load_model_and_tokenizer


def _lora_model_and_telecom_prompt(dtype: str, gc: str):
    """Qwen2.5-Coder-0.5B with LoRA r=16 on all linear layers (gradient checkpointing when ``gc == "gc"``) and the
    token ids of the real telecom solo prompt of task 0."""
    gym.register_envs(envs)
    model, tok = load_model_and_tokenizer("qwen2.5-coder-0.5b-instruct", dtype=dtype)
    if gc == "gc":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    env = gym.make("tau2/telecom-v0", split="small", user="solo")
    obs, info = env.reset(options={"index": 0})
    prompt = ChatRenderer(tok, info["tools"]).prompt_ids(obs)
    return model, prompt


def main(dtype: str = "bfloat16", gc: str = "gc", n: str = "1", rlen: str = "300") -> None:
    nresp, rlen_i = int(n), int(rlen)
    model, prompt = _lora_model_and_telecom_prompt(dtype, gc)
    P, T = len(prompt), len(prompt) + rlen_i
    g = torch.Generator().manual_seed(0)
    tokens = torch.cat([torch.tensor(prompt).repeat(nresp, 1), torch.randint(100, 20000, (nresp, rlen_i), generator=g)], 1)
    am = torch.ones_like(tokens, dtype=torch.bool)
    rm = am.clone()
    rm[:, :P] = False
    td = TensorDict(tokens=tokens, attention_mask=am, response_mask=rm, sample_log_probs=-torch.rand(nresp, T),
                    advantage=torch.randn(nresp), batch_size=[nresp])
    model.train()
    t0 = time.perf_counter()
    total_loss(GRPOLoss(model)(td)).backward()
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"dtype={dtype} gc={gc == 'gc'} n={nresp} P={P} rlen={rlen_i} fwd+bwd {dt:.1f}s maxrss {rss:.1f} GB")


def _multi_turn_batch(prompt: list[int], n: int, rlen: int, seed: int = 0, vocab: int = 20000) -> TensorDict:
    """``n`` rows: ``prompt`` then a random response / tool output / response remainder of ``rlen`` +- 10% tokens
    (thirds; tool tokens unscored), right-padded."""
    g = torch.Generator().manual_seed(seed)
    P = len(prompt)
    lens = [int(rlen * (0.9 + 0.2 * torch.rand((), generator=g))) for _ in range(n)]
    T = P + max(lens)
    tokens = torch.zeros(n, T, dtype=torch.long)
    am = torch.zeros(n, T, dtype=torch.bool)
    rm = torch.zeros(n, T, dtype=torch.bool)
    for i, r in enumerate(lens):
        tokens[i, :P] = torch.tensor(prompt)
        tokens[i, P : P + r] = torch.randint(100, vocab, (r,), generator=g)
        am[i, : P + r] = True
        a, b = P + r // 3, P + 2 * r // 3
        rm[i, P:a] = True  # response 1
        rm[i, b : P + r] = True  # response 2 (the middle third is the tool output)
    return TensorDict(tokens=tokens, attention_mask=am, response_mask=rm,
                      sample_log_probs=torch.where(rm, -torch.rand(n, T, generator=g), torch.zeros(n, T)),
                      advantage=torch.randn(n, generator=g), response_tokens=rm.sum(-1), batch_size=[n])


def _one_shared(dtype: str, gc: str, n: int, rlen: int, which: str) -> dict:
    """One measurement in this process: ``which`` = ``plain`` (row 0 alone, the plain loss forward+backward) or
    ``shared`` (the n-row GRPO update with the shared prefix)."""
    from torchrl_grpo.training.update import GRPOUpdate

    model, prompt = _lora_model_and_telecom_prompt(dtype, gc)
    td = _multi_turn_batch(prompt, n, rlen, vocab=min(20000, model.config.vocab_size))
    model.train()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    t0 = time.perf_counter()
    if which == "plain":
        one = td[:1]
        T = int(one["attention_mask"].sum())
        one = one.apply(lambda x: x[:, :T] if x.ndim == 2 else x, batch_size=[1])
        total_loss(GRPOLoss(model)(one)).backward()
        extra = {}
    else:
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        upd = GRPOUpdate(model, GRPOLoss(model), opt, reference=None, device=torch.device("cpu"),
                         autocast=lambda: torch.autocast("cpu", enabled=False), ppo_epochs=1, minibatch_size=0,
                         micro_batch_size=8, max_tokens_per_mb=12288, max_grad_norm=1.0, anchor="behaviour",
                         exact_log_probs=True, seed=0, shared_prefix="auto")
        m = upd(td, step=1)
        extra = {"shared_prefix_tokens": m["train/shared_prefix_tokens"], "grad_norm": m.get("grad_norm")}
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return {"which": which, "seconds": dt, "maxrss_gb": rss, "maxrss_after_load_gb": rss0, "P": len(prompt),
            "episode_tokens": td["attention_mask"].sum(-1).tolist() if which == "shared" else
            [int(td[0]["attention_mask"].sum())], **extra}


def shared(dtype: str = "bfloat16", gc: str = "gc", n: str = "8", rlen: str = "300") -> None:
    res = {}
    for which in ("plain", "shared"):
        out = subprocess.run([sys.executable, __file__, "_one", dtype, gc, n, rlen, which], check=True,
                             capture_output=True, text=True, env=os.environ)
        res[which] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(res[which]), flush=True)
    ratio = int(n) * res["plain"]["seconds"] / res["shared"]["seconds"]
    print(f"dtype={dtype} gc={gc == 'gc'} P={res['plain']['P']} rlen~{rlen}: plain 1 episode "
          f"{res['plain']['seconds']:.1f}s (maxrss {res['plain']['maxrss_gb']:.1f} GB); shared group of {n} "
          f"{res['shared']['seconds']:.1f}s (maxrss {res['shared']['maxrss_gb']:.1f} GB); "
          f"{n} x plain / shared = {ratio:.2f}x")


if __name__ == "__main__":
    if sys.argv[1:2] == ["shared"]:
        shared(*sys.argv[2:])
    elif sys.argv[1:2] == ["_one"]:
        d, gc_, n_, r_, w = sys.argv[2:7]
        print(json.dumps(_one_shared(d, gc_, int(n_), int(r_), w)))
    else:
        main(*sys.argv[1:])
