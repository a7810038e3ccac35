"""The built-in workers of `ddptui --gpus N`: the entry point (`worker`), the models, the
strategies (naive, interleaved, ddp, single, fsdp), `ddptui verify`'s profiler window
(`profwin`) and P1's benchmark (`bench_overhead`). Imports the core and the protocol."""
