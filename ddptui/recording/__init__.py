"""Recordings read back: Reader/load, a directory of per-rank files, torch.profiler traces (kineto), ReplaySource, FollowSource, and deterministic synthetic runs."""
