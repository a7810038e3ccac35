"""The instrument core, inside each rank: clocks (host, CUDA events), the Recorder and its
steps, resolving marks to spans off the training thread, layer marks on a sample of steps, the
emitter that sends frames, the collective tap, and PyTorch's Flight Recorder read. Imports
the protocol (`ranks.spec`, `wire`, `frames`, `clock`, `seams`) only."""
