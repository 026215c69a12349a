"""What a new user trips on with the envs (issue 36): TorchRL's ``GymEnv`` on our ids, ``action_space.sample()``,
TorchRL's history-mode LLM wrapper on conversations of different lengths."""
from __future__ import annotations

import json
import warnings

import gymnasium as gym
import jsonschema
import numpy as np
import pytest
import torch

import envs
from envs.spaces import SAMPLE_MESSAGES, AssistantAction, sample_json
from tests.gsm8k_data import DATA_DIR, needs_data

gym.register_envs(envs)
MESSAGES = {m.format(n=n) for m in SAMPLE_MESSAGES for n in range(100)}


# ------------------------------------------------------------------------------ torchrl.envs.GymEnv
@needs_data
def test_torchrl_gym_env_builds_and_grades_gsm8k(monkeypatch):
    """``torchrl.envs.GymEnv("GSM8K-v1")`` raised KeyError: No conversion tool could be found with the gym space
    envs.spaces.ChatMessages."""
    from torchrl.envs import GymEnv

    monkeypatch.setenv("GSM8K_DATA_DIR", str(DATA_DIR))
    env = GymEnv("GSM8K-v1", split="test")
    td = env.reset()
    obs = td["observation"]
    assert [m["role"] for m in obs] == ["system", "user"] and obs[1]["content"]
    gsm = env._env.unwrapped
    answer = gsm._problems[gsm._index]["answer"]  # the problem reset drew (GymEnv hands out no info)
    td["action"] = f"The sum is {answer}.\n#### {answer}"
    out = env.step(td)["next"]
    assert bool(out["done"]) and out["reward"].item() == 1.0


# ------------------------------------------------------------------------------ action_space.sample()
def test_sample_without_tools_is_a_message_not_random_characters():
    space = AssistantAction(seed=0)
    samples = [space.sample() for _ in range(50)]
    assert all(s in MESSAGES for s in samples), samples[:5]
    assert all(space.contains(s) for s in samples)


def test_sample_json_is_valid_under_refs_anyof_enums_and_bounds():
    schema = {
        "$defs": {"Leg": {"type": "object", "properties": {"flight": {"type": "string"},
                                                           "cabin": {"enum": ["economy", "business"]}},
                          "required": ["flight", "cabin"]}},
        "type": "object",
        "properties": {"legs": {"type": "array", "items": {"$ref": "#/$defs/Leg"}, "minItems": 1},
                       "bags": {"type": "integer", "minimum": 0, "maximum": 3},
                       "price": {"type": "number", "minimum": 10},
                       "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                       "insured": {"type": "boolean"}},
        "required": ["legs", "bags", "insured"],
    }
    rng = np.random.default_rng(0)
    for _ in range(200):
        jsonschema.validate(sample_json(schema, rng), schema)
    with pytest.raises(ValueError, match="unresolved"):
        sample_json({"$ref": "#/$defs/Nope"}, rng)


@pytest.fixture(scope="module")
def mock_env():
    return gym.make("tau2/mock-v0", split="base", user="solo", disable_env_checker=True)


def test_tau2_action_space_samples_schema_valid_tool_calls_the_env_runs(mock_env):
    """tau2's action_space.sample() returned random characters; now a tool call with schema-valid arguments (or a
    message), which the env executes without an action error."""
    env = mock_env.unwrapped
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in env.tools}
    env.action_space.seed(0)
    samples = [env.action_space.sample() for _ in range(60)]
    calls = [s for s in samples if isinstance(s, dict)]
    assert all(isinstance(s, dict) or s in MESSAGES for s in samples)
    assert len({c["tool_calls"][0]["function"]["name"] for c in calls}) >= 3  # several tools drawn
    for c in calls:
        fn = c["tool_calls"][0]["function"]
        jsonschema.validate(json.loads(fn["arguments"]), schemas[fn["name"]])
    for action in calls[:5]:
        mock_env.reset(seed=0, options={"index": 0})
        _, _, _, _, info = mock_env.step(action)
        assert "action_error" not in info, (action, info.get("action_error"))


# ------------------------------------------------------------------------------ history-mode LLM wrapper
def test_history_mode_wrapper_on_ragged_conversations_gets_a_clear_error():
    """TorchRL's TransformersWrapper(input_mode="history") failed inside History.extend with 'zip() argument 2 is
    shorter than argument 1' on conversations of different lengths; TextEnv.rollout now says what and why."""
    from torchrl.modules.llm import TransformersWrapper
    from transformers import LlamaConfig, LlamaForCausalLM

    from envs.gsm8k.env import GSM8KEnv
    from envs.adapters.torchrl_env import TextEnv
    from tests.test_torchrl_env import TOY, make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    policy = TransformersWrapper(LlamaForCausalLM(config).eval(), tokenizer=tok, input_mode="history", generate=True,
                                 generate_kwargs={"max_new_tokens": 4, "do_sample": False})
    env = TextEnv([lambda: GSM8KEnv(data=TOY, system_prompt="Solve it."), lambda: GSM8KEnv(data=TOY, system_prompt=None)],
                  tokenizer=tok)
    env.set_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"different lengths \(\[2, 1\] messages\).*input_mode='text'"):
            env.rollout(2, policy, break_when_any_done=False)
