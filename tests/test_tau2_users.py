"""Customers: tau2's LLM user simulator against a fake OpenAI-compatible server on loopback,
the callable user (user_fn), and failure handling."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

import envs
from envs.tau2.users import ScriptedUser, first_person

gym.register_envs(envs)


class FakeOpenAI:
    """A tiny OpenAI-compatible chat-completions server (stdlib) with a scripted policy.

    ``policy(request_json) -> message dict`` decides each reply; requests are recorded.
    ``status`` != 200 makes every request fail.
    """

    def __init__(self, policy, status: int = 200):
        self.policy, self.status, self.requests = policy, status, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body})
                if outer.status != 200:
                    payload = json.dumps({"error": {"message": "boom", "type": "server_error"}}).encode()
                    self.send_response(outer.status)
                else:
                    message = outer.policy(body)
                    payload = json.dumps(
                        {
                            "id": f"chatcmpl-{len(outer.requests)}",
                            "object": "chat.completion",
                            "created": 0,
                            "model": body.get("model", "fake"),
                            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                        }
                    ).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _last_text(body):
    return body["messages"][-1].get("content") or ""


def customer_policy(body):
    """Opens with a request, stops when the agent asks if there is anything else."""
    if "anything else" in _last_text(body).lower():
        return {"content": "No thanks. ###STOP###"}
    if len(body["messages"]) <= 2:
        return {"content": "Hi, I want to cancel reservation EHGLP3."}
    return {"content": "My user id is emma_kim_9957."}


def test_llm_user_against_fake_openai_server():
    with FakeOpenAI(customer_policy) as srv:
        env = gym.make(
            "tau2/airline-v0",
            user="llm",
            user_llm="fake-customer",
            user_llm_base_url=srv.url,
            user_llm_args={"temperature": 0.0, "num_retries": 0},
        )
        obs, info = env.reset(options={"task_id": "0"})
        assert obs[-1] == {"role": "user", "content": "Hi, I want to cancel reservation EHGLP3."}
        first = srv.requests[0]
        assert first["path"].endswith("/chat/completions") and first["body"]["model"] == "fake-customer"
        system = first["body"]["messages"][0]
        assert system["role"] == "system" and "<scenario>" in system["content"]
        # the agent's greeting reaches the simulator as a "user" turn (tau2 flips roles)
        assert first["body"]["messages"][1] == {"role": "user", "content": "Hi! How can I help you today?"}
        obs, r, term, trunc, info = env.step("Could you give me your user id?")
        assert obs[0]["content"] == "My user id is emma_kim_9957." and not term
        obs, r, term, trunc, info = env.step("Is there anything else I can help you with?")
        assert term and info["termination_reason"] == "user_stop"
        assert "reward_info" in info
        assert len(srv.requests) == 3


def test_llm_user_with_user_tools_in_telecom():
    """The simulated customer operates its phone (a telecom user tool) before answering."""
    calls = []

    def policy(body):
        last = body["messages"][-1]
        if last["role"] == "tool":
            calls.append(last)
            return {"content": "I turned airplane mode on. Anything else?"}
        if len(body["messages"]) <= 2:
            assert any(t["function"]["name"] == "toggle_airplane_mode" for t in body.get("tools", []))
            return {
                "content": None,
                "tool_calls": [{"id": "u1", "type": "function", "function": {"name": "toggle_airplane_mode", "arguments": "{}"}}],
            }
        return {"content": "###STOP###"}

    with FakeOpenAI(policy) as srv:
        env = gym.make("tau2/telecom-v0", user="llm", user_llm="fake", user_llm_base_url=srv.url, user_llm_args={"num_retries": 0})
        u = env.unwrapped
        obs, info = env.reset(options={"index": 0})
        assert obs[-1]["content"] == "I turned airplane mode on. Anything else?"
        assert calls and "airplane" in calls[0]["content"].lower()
        # the customer's tool call is in tau2's trajectory, not in the agent's view
        user_calls = [m for m in u.trajectory if m.role == "user" and m.tool_calls]
        assert user_calls and user_calls[0].tool_calls[0].requestor == "user"
        assert all(m.get("role") != "tool" for m in info["messages"])
        obs, r, term, trunc, info = env.step("ok")
        assert term and info["termination_reason"] == "user_stop"


def test_failing_llm_user_ends_the_episode_with_user_error():
    with FakeOpenAI(customer_policy, status=500) as srv:
        env = gym.make(
            "tau2/retail-v0", user="llm", user_llm="fake", user_llm_base_url=srv.url, user_llm_args={"num_retries": 0}
        )
        with pytest.warns(RuntimeWarning, match="customer failed"):
            obs, info = env.reset(options={"index": 0})
        obs, r, term, trunc, info = env.step("hello")
        assert term and r == 0.0
        assert info["termination_reason"] == "user_error" and info["user_error"]


def test_callable_user_sees_tau2_user_prompt_and_can_stop():
    seen = []

    def user_fn(messages, tools):
        seen.append((messages, tools))
        if len(seen) == 1:
            return "I need to return something."
        return {"role": "assistant", "content": "bye ###STOP###"}

    env = gym.make("tau2/retail-v0", user_fn=user_fn)
    assert env.unwrapped.user_kind == "callable"
    obs, info = env.reset(options={"index": 0})
    assert obs[-1]["content"] == "I need to return something."
    messages, tools = seen[0]
    assert messages[0]["role"] == "system" and "<scenario>" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": "Hi! How can I help you today?"}
    assert tools is None  # retail customers have no tools
    obs, r, term, trunc, info = env.step("Sure, which order?")
    assert term and info["termination_reason"] == "user_stop"
    # the customer's own earlier turn comes back as "assistant"
    assert seen[1][0][2] == {"role": "assistant", "content": "I need to return something."}


def test_callable_user_exception_is_a_user_error():
    def user_fn(messages, tools):
        if len(messages) > 2:
            raise ConnectionError("model server down")
        return "hello"

    env = gym.make("tau2/airline-v0", user=user_fn)
    env.reset(options={"index": 0})
    obs, r, term, trunc, info = env.step("How can I help?")
    assert term and info["termination_reason"] == "user_error" and "model server down" in info["user_error"]


def test_scripted_user_rules():
    class Instr:
        reason_for_call = "You want to cancel your flight."
        known_info = "You are Raj. Your user id is raj_1."

    u = ScriptedUser(Instr(), max_turns=4)
    assert u.reply("Hi!", 0) == "Hi! I want to cancel my flight.\nI am Raj. My user id is raj_1."
    assert u.reply("Shall I proceed with the cancellation?", 1) == "Yes, please go ahead."
    assert u.reply("What is your user id?", 2) == "I am Raj. My user id is raj_1."
    assert "###STOP###" in u.reply("Anything else I can do?", 2)
    assert "###STOP###" in u.reply("Let me check.", 4)
    u.transferred = True
    assert u.reply("You are being transferred.", 2) == "###TRANSFER###"
    assert first_person("You're here; your bag is yours.") == "I'm here; my bag is mine."
