"""TorchRL adapter (envs.adapters.torchrl_env.TextEnv) over GSM8K and a multi-turn chat env."""
from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
import torch
from tensordict import NonTensorStack, TensorDict
from torchrl.envs.utils import check_env_specs

from envs.gsm8k.env import GSM8KEnv
from envs.spaces import AssistantAction, ChatMessages
from envs.adapters.torchrl_env import TextEnv, make_torchrl_env

from tests.gsm8k_data import DATA_DIR, needs_data  # noqa: E402

TOY = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "Tom has 7 apples and eats 10. How many are left?", "answer": "-3"},
    {"question": "What is 1,000 times 3?", "answer": "3000"},
]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


class MultiTurnChatEnv(gym.Env):
    """Minimal multi-turn env of the same contract as tau2's: ``turns`` assistant turns, each
    answered by a tool message; reward 1 at the end if the assistant ever said "done"."""

    def __init__(self, turns: int = 2):
        self.turns = turns
        self.observation_space, self.action_space = ChatMessages(), AssistantAction()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task = (options or {}).get("index", int(self.np_random.integers(1000)))
        self.t, self.said_done = 0, False
        self.messages = [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": f"Task {self.task}"},
        ]
        return list(self.messages), self._info()

    def _info(self):
        return {"messages": [dict(m) for m in self.messages], "tools": TOOLS,
                "task_id": str(self.task)}

    def step(self, action):
        self.t += 1
        msg = {"role": "assistant", **action} if isinstance(action, dict) else {
            "role": "assistant", "content": str(action)}
        self.said_done |= "done" in (msg.get("content") or "")
        new = [{"role": "tool", "tool_call_id": f"call{self.t}", "content": f"result {self.t}"}]
        self.messages += [msg] + new
        terminated = self.t >= self.turns
        reward = float(self.said_done) if terminated else 0.0
        return new, reward, terminated, False, self._info()


CHATML = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t['function']['name'] }}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_tokenizer():
    """A 400-token byte-level BPE trained here (no hub download) with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [p["question"] for p in TOY] + ["system user assistant tool result Task #### 5"]
    tok.train_from_iterator(corpus * 10, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<unk>"
    )
    hf.chat_template = CHATML
    return hf


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def _toy_env(n: int = 3, system_prompt: str | None = "Solve it.", **kwargs) -> TextEnv:
    return TextEnv(
        [lambda: GSM8KEnv(data=TOY, system_prompt=system_prompt) for _ in range(n)], **kwargs
    )


def _multi_env(turns=(1, 2, 3), **kwargs) -> TextEnv:
    return TextEnv([lambda k=k: MultiTurnChatEnv(k) for k in turns], **kwargs)


def _actions(*items) -> NonTensorStack:
    return NonTensorStack(*items)


@pytest.fixture(autouse=True)
def _quiet_torchrl_spec_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Prompt history should have one more")
        yield


# ------------------------------------------------------------------------------ specs
@needs_data
def test_check_env_specs_gsm8k(monkeypatch):
    monkeypatch.setenv("GSM8K_DATA_DIR", str(DATA_DIR))
    env = make_torchrl_env("GSM8K-v1", batch_size=4, split="test")
    assert env.batch_size == torch.Size([4])
    check_env_specs(env, seed=0)


@pytest.mark.parametrize("make", [_toy_env, _multi_env])
def test_check_env_specs_with_tokenizer(make, tokenizer):
    check_env_specs(make(tokenizer=tokenizer), seed=0)
    check_env_specs(make(), seed=0)


# ------------------------------------------------------------------------------ GSM8K
@needs_data
def test_rollout_fixed_text_policy(monkeypatch):
    monkeypatch.setenv("GSM8K_DATA_DIR", str(DATA_DIR))
    # format credit 0.1 set explicitly (the default became 0.0, correctness only: issue 14)
    env = make_torchrl_env("GSM8K-v1", batch_size=4, split="test", format_reward=0.1)
    env.set_seed(0)

    def policy(td):  # right answer on even envs, a well-formed wrong one on odd envs
        answers = [info["answer"] for info in td["info"]]
        td["action"] = _actions(
            *[f"Let me think.\n#### {a}" if b % 2 == 0 else "#### 0.5" for b, a in enumerate(answers)]
        )
        return td

    data = env.rollout(3, policy, break_when_any_done=False)
    assert data.batch_size == torch.Size([4, 3])
    torch.testing.assert_close(
        data["next", "reward"].squeeze(-1), torch.tensor([[1.0] * 3, [0.1] * 3] * 2)
    )
    assert data["next", "done"].all() and data["next", "terminated"].all()
    assert not data["next", "truncated"].any()
    # every step auto-resets: a new problem each time
    indices = [[info["index"] for info in data[b]["info"]] for b in range(4)]
    assert all(len(set(row)) > 1 for row in indices)
    last = data[1, 2]["next", "messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant"]
    assert last[-1]["content"] == "#### 0.5"
    assert data[0, 0]["next", "info"]["correct"] is True


def test_step_rewards_and_info():
    env = _toy_env()
    td = env.reset(TensorDict(task_index=torch.tensor([0, 1, 2]), batch_size=[3]))
    assert [i["index"] for i in td["info"]] == [0, 1, 2]
    assert [m[-1]["content"] for m in td["messages"]] == [p["question"] for p in TOY]
    assert td["history", "prompt"][1].role == ["system", "user"]
    td["action"] = _actions(
        "#### 5", {"role": "assistant", "content": "The answer is -3."}, "3 thousand"
    )
    out = env.step(td)["next"]
    torch.testing.assert_close(out["reward"], torch.tensor([[1.0], [1.0], [0.0]]))
    assert out["done"].all()
    assert [i["extracted"] for i in out["info"]] == ["5", "-3", "3"]
    assert out["observation"][0] == []


def test_reset_options_and_seed():
    env = _toy_env()
    opts = _actions({"index": 2}, None, {"index": 0})
    td = env.reset(TensorDict(options=opts, batch_size=[3]))
    assert [i["index"] for i in td["info"]][0::2] == [2, 0]
    env.set_seed(7)
    first = [i["index"] for i in env.reset()["info"]]
    env.set_seed(7)
    assert [i["index"] for i in env.reset()["info"]] == first
    with pytest.raises(ValueError, match="task_index"):
        env.reset(TensorDict(task_index=torch.tensor([0.0, 1.0, 2.0]), batch_size=[3]))
    with pytest.raises(ValueError):
        env.reset(TensorDict(task_index=torch.tensor([7, 0, 0]), batch_size=[3]))  # no problem 7


def test_bad_actions():
    env = _toy_env(2)
    td = env.reset()
    with pytest.raises(KeyError, match="action"):
        env.step(td.clone())
    td["action"] = _actions(123, "#### 5")  # not text: a caller's bug (env contract)
    with pytest.raises(TypeError, match="action"):
        env.step(td)


def test_step_before_reset_and_constructor_errors(tokenizer):
    env = _toy_env(2)
    with pytest.raises(RuntimeError, match="before reset"):
        env._step(TensorDict(action=_actions("a", "b"), batch_size=[2]))
    with pytest.raises(ValueError):
        TextEnv([])
    no_template = _copy_without_template(tokenizer)
    with pytest.raises(ValueError, match="chat_template"):
        TextEnv([GSM8KEnv(data=TOY)], tokenizer=no_template)
    with pytest.raises(ValueError):
        make_torchrl_env("GSM8K-v1", batch_size=0, data=TOY)


def _copy_without_template(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    return tok


# ------------------------------------------------------------------------------ multi-turn
def test_multiturn_partial_resets():
    env = _multi_env((1, 2, 3))
    env.set_seed(0)

    def policy(td):
        td["action"] = _actions("working", "done", {"content": "done", "tool_calls": []})
        return td

    data = env.rollout(6, policy, break_when_any_done=False)
    torch.testing.assert_close(
        data["next", "reward"].squeeze(-1),
        torch.tensor([[0.0] * 6, [0, 1, 0, 1, 0, 1], [0, 0, 1, 0, 0, 1.0]]),
    )
    done = data["next", "done"].squeeze(-1)
    assert done[0].all() and done[1].tolist() == [False, True] * 3
    # conversation length at the start of each step: env b restarts every turns_b steps
    lengths = [[len(m) for m in data[b]["messages"]] for b in range(3)]
    assert lengths == [[2] * 6, [2, 4] * 3, [2, 4, 6] * 2]
    # the history view matches the messages
    hist = data[2, 2]["history", "prompt"]
    assert hist.role == [m["role"] for m in data[2, 2]["messages"]]
    assert data[2, 2]["tools"] == TOOLS
    # new task ids after each partial reset of env 1, unchanged for env 2 inside an episode
    ids = [i["task_id"] for i in data[2]["info"]]
    assert ids[0] == ids[1] == ids[2]


def test_partial_reset_keeps_other_envs():
    env = _multi_env((1, 3))
    td = env.reset(TensorDict(task_index=torch.tensor([10, 20]), batch_size=[2]))
    td["action"] = _actions("a", "b")
    td = env.step_mdp(env.step(td))
    before = td["messages"][1]
    td["_reset"] = torch.tensor([[True], [False]])
    td = env.reset(td)
    assert td["messages"][0] == [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": td["messages"][0][1]["content"]},
    ]
    assert td["messages"][1] == before and len(before) == 4
    assert td["info"][1]["task_id"] == "20"
    assert td["history", "prompt"][1].content[-1] == "result 1"
    assert not td["done"].any()


def test_finished_env_is_not_stepped_again():
    env = _multi_env((1, 2))
    td = env.reset()
    for _ in range(2):
        td["action"] = _actions("done", "done")
        out = env.step(td)
        td = env.step_mdp(out)
    assert out["next", "done"].squeeze(-1).tolist() == [True, True]
    assert out["next", "reward"].squeeze(-1).tolist() == [0.0, 1.0]  # env 0 ended at step 1
    assert len(out["next", "messages"][0]) == 4  # not stepped a second time


# ------------------------------------------------------------------------------ tokens
def test_tokens_with_tokenizer(tokenizer):
    env = _multi_env((2, 2, 2), tokenizer=tokenizer)
    td = env.reset(TensorDict(task_index=torch.tensor([1, 22, 333]), batch_size=[3]))
    ids, mask = td["tokens", "prompt"], td["attention_mask"]
    assert ids.dtype == torch.int64 and ids.shape == mask.shape and ids.shape[0] == 3
    assert td["tokens"].padded is True
    texts = list(td["text", "prompt"])
    for b in range(3):
        assert tokenizer.decode(ids[b][mask[b]]) == texts[b]
        assert (ids[b][~mask[b]] == tokenizer.pad_token_id).all()  # left padding
        assert mask[b].long().diff().ge(0).all()
    assert texts[0].startswith("<|im_start|>system\nTOOLS: lookup")  # tools reach the template
    assert texts[0].endswith("<|im_start|>assistant\n")
    assert mask.sum(-1).tolist() == [len(tokenizer(t)["input_ids"]) for t in texts]
    td["action"] = _actions("x", "y", "z")
    nxt = env.step(td)["next"]
    assert nxt["tokens", "prompt"].shape[1] > ids.shape[1]
    assert "result 1" in nxt["text", "prompt"][0]


@pytest.mark.parametrize("mode", ["text", "history"])
def test_torchrl_llm_wrapper_drives_env(tokenizer, mode):
    """TorchRL's own TransformersWrapper (tiny random Llama) runs rollouts on the adapter."""
    from torchrl.modules.llm import TransformersWrapper
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    policy = TransformersWrapper(
        LlamaForCausalLM(config).eval(), tokenizer=tokenizer, input_mode=mode, generate=True,
        generate_kwargs={"max_new_tokens": 4, "do_sample": False},
    )
    envs_ = [_toy_env(2, tokenizer=tokenizer)]
    if mode == "text":  # history mode needs equal-length conversations (torchrl 0.14)
        envs_.append(_multi_env((1, 2), tokenizer=tokenizer))
    for env in envs_:
        env.set_seed(0)
        data = env.rollout(2, policy, break_when_any_done=False)
        assert data.batch_size[1] == 2
        msgs = data[-1, -1]["next", "messages"]
        assert any(m["role"] == "assistant" for m in msgs)


@needs_data
def test_make_torchrl_env_with_tokenizer(monkeypatch, tokenizer):
    monkeypatch.setenv("GSM8K_DATA_DIR", str(DATA_DIR))
    env = make_torchrl_env("GSM8K-v1", batch_size=2, split="train", tokenizer=tokenizer)
    td = env.reset(TensorDict(task_index=torch.tensor([0, 1]), batch_size=[2]))
    assert "Natalia" in td["text", "prompt"][0]
    assert td["attention_mask"].any(-1).all()


@needs_data
def test_partial_step_steps_only_the_marked_envs():
    """TorchRL's "_step" entry: only marked envs step; the others repeat their last output with reward 0."""
    env = make_torchrl_env("GSM8K-v1", batch_size=2, split="test")
    td = env.reset()
    answer = td["info"][0]["answer"]
    td["action"] = NonTensorStack(f"#### {answer}", f"#### {answer}")
    td["_step"] = torch.tensor([True, False])
    nxt = env.step(td)["next"]
    assert nxt["done"].reshape(-1).tolist() == [True, False]
    assert nxt["reward"].reshape(-1).tolist()[1] == 0.0


@needs_data
def test_catch_env_errors_ends_that_episode_and_runner_is_used():
    from envs.adapters.torchrl_env import TextEnv

    calls = []

    def runner(fns):
        calls.append(len(fns))
        out = []
        for fn in fns:
            try:
                out.append(fn())
            except Exception as e:  # noqa: BLE001
                out.append(e)
        return out

    envs_ = [gym.make("GSM8K-v1", split="test", disable_env_checker=True) for _ in range(2)]

    def boom(action):
        raise RuntimeError("boom")

    envs_[0].unwrapped.step = boom
    strict = TextEnv(envs_, runner=runner)
    strict.reset()
    with pytest.raises(RuntimeError, match="boom"):
        strict.step(TensorDict({"action": NonTensorStack("a", "b")}, batch_size=[2]))
    env = TextEnv(envs_, runner=runner, catch_env_errors=True)
    env.reset()
    nxt = env.step(TensorDict({"action": NonTensorStack("a", "b")}, batch_size=[2]))["next"]
    assert nxt["truncated"].reshape(-1).tolist() == [True, False] and nxt["done"].all()
    info = nxt["info"].tolist() if hasattr(nxt["info"], "tolist") else list(nxt["info"])
    assert info[0]["termination_reason"] == "env_error" and "boom" in info[0]["error"]
    assert calls == [2, 2, 2, 2]
    with pytest.raises(TypeError):
        env.reset()
        env.step(TensorDict({"action": NonTensorStack(12345, "b")}, batch_size=[2]))
