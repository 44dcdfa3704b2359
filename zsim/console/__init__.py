"""What every command-line front end shares (the `zsim` command and the runtime's `python -m zsim.runtime`):
the argument parser whose errors are two short lines, the grammar of the numbers people type, and
holding Ctrl-C while libraries import. It imports nothing of zsim but `errors` (docs/architecture.md)."""
