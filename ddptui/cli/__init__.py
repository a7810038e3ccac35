"""The command line: `main` (the parser and the live verb) and one module per verb (replay, export, summary, bench, whatif, run, verify, serve, join); `options` declares every numeric option once."""
