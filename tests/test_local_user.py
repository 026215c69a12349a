"""LocalUser: customer replies of concurrently stepped envs are generated in one batched backend call."""
from __future__ import annotations

import threading


from torchrl_grpo.backends.base import Generation, RolloutBackend
from torchrl_grpo.rollout.local_user import LocalUser


class EchoBackend(RolloutBackend):
    """Replies "n<prompt length>" (so each caller can check it got its own reply); records batch sizes."""

    def __init__(self, tok, empty_for_len=None):
        self.tok, self.batches, self.policy_version = tok, [], 0
        self.empty_for_len = empty_for_len

    def generate(self, prompts, sampling):
        self.batches.append(len(prompts))
        out = []
        for p in prompts:
            text = "" if len(p) == self.empty_for_len else f"n{len(p)}"
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out

    def load_weights(self, weights=None):
        self.policy_version += 1


def _msgs(k):
    return [{"role": "system", "content": "you are a customer"}, {"role": "user", "content": "word " * k}]


def _run_steps(user, steps):
    """Run each step function in a thread inside user.batched, like the collector does."""
    results = [None] * len(steps)

    def run(i):
        try:
            user.step_begin(i)
            results[i] = steps[i]()
        except Exception as exc:
            results[i] = exc
        finally:
            user.step_done()

    with user.batched(len(steps)):
        ts = [threading.Thread(target=run, args=(i,)) for i in range(len(steps))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in ts), "deadlock"
    return results


def test_requests_of_one_turn_go_out_as_one_batch_and_replies_reach_their_callers(tok):
    be = EchoBackend(tok)
    user = LocalUser(be, tok)
    lens = {k: len(user._prompt(_msgs(k), None)) for k in (1, 2, 3, 5)}

    def others_asked():  # a slow env step, made slow by an ordering (not a sleep: issue 25, C7): it goes on only
        with user._cv:  # once the three other requests wait (or went out: a premature flush shows in be.batches)
            assert user._cv.wait_for(lambda: len(user._pending) + user.stats["calls"] >= 3, timeout=30)

    def asks(k, slow=False):
        def f():
            if slow:
                others_asked()  # a slow env step must still be waited for
            return user(_msgs(k))
        return f

    def no_user_call():
        others_asked()
        return "tool-only step"

    res = _run_steps(user, [asks(1), asks(2, slow=True), no_user_call, asks(3), asks(5)])
    assert res == [f"n{lens[1]}", f"n{lens[2]}", "tool-only step", f"n{lens[3]}", f"n{lens[5]}"]
    assert be.batches == [4]
    assert user.stats == {"calls": 4, "batches": 1}


def test_steps_asking_twice_batch_their_second_requests_together(tok):
    be = EchoBackend(tok)
    user = LocalUser(be, tok)

    def twice(k):
        def f():
            a = user(_msgs(k))
            b = user(_msgs(k + 10))
            return a, b
        return f

    res = _run_steps(user, [twice(1), twice(2), twice(3)])
    assert all(isinstance(r, tuple) for r in res)
    assert be.batches == [3, 3]


def test_an_empty_reply_fails_only_its_own_caller(tok):
    user0 = LocalUser(EchoBackend(tok), tok)
    bad_len = len(user0._prompt(_msgs(2), None))
    be = EchoBackend(tok, empty_for_len=bad_len)
    user = LocalUser(be, tok)
    res = _run_steps(user, [lambda: user(_msgs(1)), lambda: user(_msgs(2)), lambda: user(_msgs(3))])
    assert isinstance(res[1], RuntimeError) and "empty reply" in str(res[1])
    assert isinstance(res[0], str) and isinstance(res[2], str)
    assert be.batches == [3]


def test_outside_a_batched_scope_calls_are_immediate(tok):
    be = EchoBackend(tok)
    user = LocalUser(be, tok)
    assert user(_msgs(1)).startswith("n") and user(_msgs(2)).startswith("n")
    assert be.batches == [1, 1]
