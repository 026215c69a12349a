"""Producing episodes: the group collector (TorchRL env side, chat tokens), evaluation, episode statistics, the
local user model, demonstrations for SFT, envs built from config, and Ray rollout workers."""
