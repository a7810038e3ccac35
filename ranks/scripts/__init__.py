"""Users' own scripts: `ddptui.instrument` (`user`: RankSession, FileSink), which modules are
layers (`userlayers`), ddptui's DDP comm hook (`commhook`) and `ddptui run`'s bootstrap
(`userboot`). Imports the core and the protocol, and the built-in strategies' layer marks."""
