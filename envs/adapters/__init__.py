"""Our envs inside other libraries' loops, one module per library (each imports its library only when used):

- :mod:`envs.adapters.torchrl_env`: ``TextEnv``, a TorchRL ``EnvBase`` over any registered id (TensorDicts);
- :mod:`envs.adapters.torchrl_openenv`: the same TorchRL env over an ``envs.serve`` (OpenEnv) server;
- :mod:`envs.adapters.trl_env`: TRL ``GRPOTrainer`` glue (``environment_factory``, ``dataset``, ``reward_function``);
- :mod:`envs.adapters.verifiers_env`: verifiers / prime-rl environments (``load_environment``).

The module names do not shadow the packages they adapt (``torchrl``, ``trl``, ``verifiers``).
"""
