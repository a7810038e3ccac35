"""Recordings read back: Reader/load, a directory of per-rank files, torch.profiler traces (kineto), ReplaySource, FollowSource, deterministic synthetic runs and simulated ones (`ddptui demo`)."""
from .reader import Reader

__all__ = ["Reader"]
