"""Frames in: the Unix-socket Collector and the Feed, the one door from frames to a Store."""
