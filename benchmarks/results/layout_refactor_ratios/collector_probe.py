"""quick_guard part 3 alone, more repeats: GroupCollector with a zero-cost backend vs bare env reset/step.
Run with PYTHONPATH=<tree> from that tree. Prints bare_s / collector_s per repeat and the median."""
import statistics, sys, time
import gymnasium as gym
import envs  # noqa: F401 registers
from torchrl_grpo.backends.base import Generation, RolloutBackend, SamplingConfig
from torchrl_grpo.models import load_model_and_tokenizer
try:
    from torchrl_grpo.rollout.collector import GroupCollector
except ImportError:
    from torchrl_grpo.collector import GroupCollector

_, tok = load_model_and_tokenizer("smollm2-135m-instruct")
reply = tok.encode("The answer is #### 42", add_special_tokens=False) + [tok.eos_token_id]

class InstantBackend(RolloutBackend):
    policy_version = 0
    def generate(self, prompts, sampling):
        return [Generation(list(reply), [-0.1] * len(reply), "stop") for _ in prompts]
    def load_weights(self, weights=None):
        pass

n_tasks, n_samples = 16, 4
col = GroupCollector(lambda: gym.make("GSM8K-v0", split="test", disable_env_checker=True), InstantBackend(),
                     tok, SamplingConfig(max_new_tokens=16), max_turns=1, max_context_tokens=1 << 20)
tasks = [{"index": i} for i in range(n_tasks)]
col.collect(tasks, n_samples)
pool = col._envs(n_tasks * n_samples)
text = tok.decode(reply, skip_special_tokens=True)
def bare():
    for i, e in enumerate(pool):
        e.reset(seed=0, options=dict(tasks[i // n_samples]))
        e.step(text)
ratios, cs, bs = [], [], []
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
    t = time.perf_counter(); col.collect(tasks, n_samples); c = time.perf_counter() - t
    t = time.perf_counter(); bare(); b = time.perf_counter() - t
    ratios.append(b / c); cs.append(c); bs.append(b)
print(f"median ratio {statistics.median(ratios):.3f}  collector_s {statistics.median(cs)*1000:.1f} ms  bare_s {statistics.median(bs)*1000:.1f} ms  ratios {[round(x,3) for x in ratios]}")
