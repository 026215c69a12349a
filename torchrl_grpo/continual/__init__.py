"""Continual learning across domains: the continual trainer, the algorithms (replay, penalties), the domain
sequence, transfer metrics (backward/forward transfer, forgetting) with their plots, and the trajectory buffer."""
