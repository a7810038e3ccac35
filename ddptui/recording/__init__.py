"""Recordings read back: Reader/load, a directory of per-rank files, ReplaySource, FollowSource, and deterministic synthetic runs."""
