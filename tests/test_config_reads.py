"""Only config/, assembly/ and cli.py read the run config (issue 27): every other module of torchrl_grpo takes plain
values and objects.

An AST check over each module's source (function-level imports included). A module outside those reads the config
if it:

1. imports ``omegaconf`` or ``hydra``;
2. imports from ``torchrl_grpo.config`` anything but constants (UPPER_CASE: the choice sets) and the helpers that
   take plain values (:data:`PLAIN_HELPERS`) -- ``validate_config``, ``train_strategy``, ``tau2_user``,
   ``domain_config`` ... take a config node;
3. has a parameter named ``cfg`` / ``dcfg`` / ``*_cfg`` that its function reads (any load of the name: attribute
   access, passing it on, storing it) -- a ``cfg=None`` kept only for callers' sake and never read passes;
4. reads an attribute that only a run config has: a section name of :class:`torchrl_grpo.config.GRPOConfig` that no
   other object of ours carries (:data:`CONFIG_ONLY_ATTRS`), or ``.cfg`` (a config kept on an object and read later).

One test per subpackage, so a failure names whose folder still reads the config.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "torchrl_grpo"
#: where the config may be read
ALLOWED = ("config", "assembly", "cli.py")
#: helpers of torchrl_grpo.config that take plain values (a string, a strategy name), not a config node
PLAIN_HELPERS = {"AllocationError", "parse_allocation_mode", "is_data_parallel", "is_tau2"}
#: attributes only a run config has (GRPOConfig sections with names no other object of ours uses), and a kept config
CONFIG_ONLY_ATTRS = {"gconfig", "econfig", "train_dataset", "valid_dataset", "stats_logger", "cfg"}
CONFIG_PARAMS = ("cfg", "dcfg")


def _is_config_param(name: str) -> bool:
    return name in CONFIG_PARAMS or name.endswith("_cfg")


def module_violations(source: str, where: str = "<module>") -> list[str]:
    """The config reads of one module's source (rules 1-4 of the module docstring), as ``where:line: what``."""
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in ("omegaconf", "hydra"):
                    out.append(f"{line}: imports {a.name}")
                if a.name == "torchrl_grpo.config" or a.name.startswith("torchrl_grpo.config."):
                    out.append(f"{line}: imports the module {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top in ("omegaconf", "hydra"):
                out.append(f"{line}: imports from {node.module}")
            elif node.module == "torchrl_grpo.config" or node.module.startswith("torchrl_grpo.config."):
                for a in node.names:
                    if not (a.name.isupper() or a.name in PLAIN_HELPERS):
                        out.append(f"{line}: imports {a.name} (reads a config) from {node.module}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
                      if _is_config_param(a.arg)}
            if params:
                body = node.body if isinstance(node.body, list) else [node.body]
                read = {n.id for b in body for n in ast.walk(b)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in params}
                for p in sorted(read):
                    name = getattr(node, "name", "<lambda>")
                    out.append(f"{line}: {name}() reads its parameter {p!r}")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in CONFIG_ONLY_ATTRS:
            out.append(f"{line}: reads .{node.attr}")
    return out


def _package_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else "(top level)"


def violations(root: Path = PKG) -> dict[str, list[str]]:
    """``{subpackage: [violation, ...]}`` over every module of ``root`` outside :data:`ALLOWED`."""
    root = Path(root)
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ALLOWED:
            continue
        found = module_violations(path.read_text(), str(rel))
        out.setdefault(_package_of(path, root), []).extend(found)
    return out


PACKAGES = sorted({_package_of(p, PKG) for p in PKG.rglob("*.py") if p.relative_to(PKG).parts[0] not in ALLOWED})


@pytest.mark.parametrize("package", PACKAGES)
def test_no_config_reads_outside_config_build_cli(package):
    found = violations()[package]
    assert found == [], "\n".join(found)


def test_the_check_sees_each_kind_of_config_read():
    bad = '''
import omegaconf
from hydra import compose
from torchrl_grpo.config import validate_config, BACKENDS, is_tau2
import torchrl_grpo.config.schema

def f(cfg):
    return cfg.train.steps

def g(x, *, domain_cfg):
    return h(domain_cfg)

def kept(self, cfg=None):
    self.cfg = cfg

def unused(components, *, cfg=None):
    return components

def sections(c):
    return c.gconfig.max_new_tokens, c.econfig.env_id, self.cfg.seed
'''
    found = module_violations(bad, "m.py")
    text = "\n".join(found)
    assert "m.py:2: imports omegaconf" in text and "m.py:3: imports from hydra" in text
    assert "imports validate_config (reads a config)" in text
    assert "BACKENDS" not in text and "is_tau2" not in text  # constants and plain-value helpers are fine
    assert "imports the module torchrl_grpo.config.schema" in text
    assert "f() reads its parameter 'cfg'" in text and "g() reads its parameter 'domain_cfg'" in text
    assert "kept() reads its parameter 'cfg'" in text  # storing it is passing it on
    assert "unused()" not in text  # accepted for callers' sake, never read
    assert "reads .gconfig" in text and "reads .econfig" in text and "reads .cfg" in text
    assert len(found) == 10, text
