"""Figures out: text tables, JSON and CSV, the Chrome-trace export, the profiler cross-check."""
