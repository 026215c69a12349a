"""The experiment drivers and their shared :mod:`harness` / :mod:`stats`.

A package so that the instruments one folder up import the harness without editing ``sys.path``:
``python benchmarks/<instrument>.py`` has ``benchmarks/`` first on ``sys.path``, so ``from experiments.harness import
...`` finds this folder (a regular package: it wins over any namespace package of that name). The drivers here run as
``python benchmarks/experiments/<driver>.py`` (this folder first on ``sys.path``) and import their siblings as
``from harness import ...``; tests load them that way too (tests/bench_experiments.py).
"""
