"""ddptui: see data-parallel training in the terminal.

`ddptui.instrument(ddp_model, ...)` times your own DDP model (ranks.scripts.user): it imports torch
and never the UI; nothing else is imported by `import ddptui`."""
__version__ = "0.1.0"


def __getattr__(name):  # ddptui.instrument / ddptui.Handle without importing torch up front
    if name in ("instrument", "Handle"):
        from ranks.scripts import user
        return getattr(user, name)
    raise AttributeError(f"module 'ddptui' has no attribute {name!r}")
