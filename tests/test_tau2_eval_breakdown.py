"""benchmarks/tau2_eval_breakdown.py: per-intent pass^1 of generated mock evaluations, counted from the rows."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from envs.tau2.generated_tasks import generate_split

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "tau2_eval_breakdown.py"
# the script imports ``experiments.stats`` (benchmarks/experiments/, found beside it when run): that package first
_EXP = _PATH.parent / "experiments"
if "experiments" not in sys.modules:
    _pkg = importlib.util.spec_from_file_location("experiments", _EXP / "__init__.py",
                                                  submodule_search_locations=[str(_EXP)])
    sys.modules["experiments"] = importlib.util.module_from_spec(_pkg)
    _pkg.loader.exec_module(sys.modules["experiments"])
_spec = importlib.util.spec_from_file_location("tau2_eval_breakdown", _PATH)
bd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bd)


def test_counts_each_task_under_every_intent_it_has_and_its_intent_count():
    tasks = {t["id"]: t for t in generate_split("generated_test")}
    two = next(t for t in tasks.values() if len(bd.intents(t)) == 2 and len(set(bd.intents(t))) == 2)
    one = next(t for t in tasks.values() if bd.intents(t) == ["set_status"])
    rows = [{"step": 0, "mode": "greedy", "task_id": two["id"], "reward": 1.0, "tool_calls": [{}, {}],
             "termination_reason": "agent_stop"},
            {"step": 0, "mode": "greedy", "task_id": one["id"], "reward": 0.5, "tool_calls": [],
             "termination_reason": "max_steps"},
            {"step": 8, "mode": "greedy", "task_id": one["id"], "reward": 1.0, "tool_calls": [{}],
             "termination_reason": "agent_stop"}]
    out = bd.breakdown(rows, tasks)
    first = out[(0, "greedy")]
    assert first["n"] == 2 and first["pass^1"] == 0.5 and first["calls_per_episode"] == 1.0  # 0.5 is not solved
    assert first["terminations"] == {"agent_stop": 1, "max_steps": 1}
    a, b = bd.intents(two)
    assert first["by"][a] == first["by"][b] == [1, 1] and first["by"]["2 intents"] == [1, 1]
    assert first["by"]["set_status"][1] == 1 + ("set_status" in (a, b)) and first["by"]["1 intents"] == [0, 1]
    assert out[(8, "greedy")]["by"] == {"set_status": [1, 1], "1 intents": [1, 1]}
    assert bd.intents(None) == ["?"]


def test_mcnemar_counts_discordant_tasks_and_gives_the_exact_binomial_p():
    first = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0, "e": 0.5, "x": 1.0}
    last = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0, "e": 1.0, "y": 0.0}
    m = bd.mcnemar(first, last)
    assert (m["n"], m["both"], m["neither"], m["only_first"], m["only_last"]) == (5, 1, 0, 1, 3)
    assert abs(m["p"] - 2 * (1 + 4) / 16) < 1e-12  # d=4, k=1: 2 * (C(4,0) + C(4,1)) / 2^4 = 0.625
    assert bd.mcnemar({"a": 1.0}, {"a": 1.0})["p"] == 1.0  # no discordant pair
    assert bd.mcnemar({str(i): 0.0 for i in range(10)}, {str(i): 1.0 for i in range(10)})["p"] == 2 / 2 ** 10


def test_write_counts_tally_write_calls_against_the_gold_by_name():
    """Episodes with more / fewer write calls than their gold, the calls past it, the gold writes short of it,
    update_task_status calls and transfers; WRITE_TOOLS is the mock domain's own WRITE set."""
    from envs.tau2.domain import get_domain

    assert bd.WRITE_TOOLS == get_domain("mock").write_tool_names
    tasks = {t["id"]: t for t in generate_split("generated_test")}
    four = next(t for t in tasks.values() if sum(a["name"] in bd.WRITE_TOOLS
                                                 for a in t["evaluation_criteria"]["actions"]) == 4)

    def row(*names):
        return {"step": 0, "mode": "greedy", "task_id": four["id"], "reward": 0.0, "termination_reason": "agent_stop",
                "tool_calls": [{"name": n, "arguments": "{}"} for n in names]}

    w = ["create_task", "update_task_status"]
    rows = [row("get_users", *w, *w, "update_task_status", "done"),  # 5 writes: 1 beyond
            row("get_users", "create_task", "transfer_to_human_agents"),  # 1 write: 3 short, a transfer
            row(*w, *w),  # as many as the gold (arguments are not compared)
            {**row("update_task_status"), "task_id": "not_a_test_task"}]  # no gold: 1 beyond
    assert bd.write_counts(rows, tasks) == {"more": 2, "fewer": 1, "beyond": 2, "short": 3,
                                            "update_task_status": 6, "transfer": 1}
    assert bd.breakdown(rows, tasks)[(0, "greedy")]["writes"] == bd.write_counts(rows, tasks)
    assert bd.write_counts([], tasks) == dict.fromkeys(("more", "fewer", "beyond", "short", "update_task_status",
                                                         "transfer"), 0)


def test_help_and_a_missing_file_are_clear_exits_not_tracebacks(tmp_path):
    import pytest

    with pytest.raises(SystemExit) as e:
        bd.main(["--help"])
    assert "eval_episodes.jsonl" in str(e.value.code)  # the usage (module docstring), not a file named --help
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(SystemExit) as e:
        bd.main([str(missing)])
    assert str(missing) in str(e.value.code) and "no such file" in str(e.value.code)


def test_runs_from_its_own_command_line_in_another_directory(tmp_path):
    """``python benchmarks/tau2_eval_breakdown.py FILE`` from anywhere: it finds ``experiments.stats`` beside it (no
    path edit) and prints each evaluation and the paired comparison of the first and last."""
    import json
    import subprocess

    task = generate_split("generated_test")[0]["id"]
    rows = [{"step": s, "mode": "greedy", "task_id": task, "reward": r, "tool_calls": [],
             "termination_reason": "agent_stop"} for s, r in ((0, 0.0), (8, 1.0))]
    path = tmp_path / "eval_episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = subprocess.run([sys.executable, str(_PATH), str(path)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "step 0 greedy: n=1 pass^1=0.000" in p.stdout and "step 8 greedy: n=1 pass^1=1.000" in p.stdout
    assert "only the first 0, only the last 1; exact McNemar p=1" in p.stdout, p.stdout  # one discordant task
