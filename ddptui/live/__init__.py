"""A live run: the torchrun launcher, the LiveRun session (collector, recorder, samplers), NVML/CPU samplers, the headless run, and multi-node (node 0's listener, its options)."""
