#!/usr/bin/env python
"""Time and peak memory of one GRPO forward+backward over a telecom-length episode (tau2 telecom small, solo).

    python benchmarks/update_cost_probe.py bfloat16 gc 1 300     # dtype, gc|nogc, episodes, response tokens

Qwen2.5-Coder-0.5B-Instruct with LoRA r=16 on all linear layers; the prompt is the real telecom solo prompt of task 0
(9,904 tokens), followed by random response tokens. Prints seconds and peak RSS (a baseline-free probe: it sizes
what one update costs on this machine, used in benchmarks/results/tau2_telecom_run.md).
"""
from __future__ import annotations

import resource
import sys
import time

import gymnasium as gym
import torch
from peft import LoraConfig, get_peft_model
from tensordict import TensorDict

import envs
from torchrl_grpo.chat_tokens import ChatRenderer
from torchrl_grpo.loss import GRPOLoss, total_loss
from torchrl_grpo.models import load_model_and_tokenizer


def main(dtype: str = "bfloat16", gc: str = "gc", n: str = "1", rlen: str = "300") -> None:
    nresp, rlen_i = int(n), int(rlen)
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


if __name__ == "__main__":
    main(*sys.argv[1:])
