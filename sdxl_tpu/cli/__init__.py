"""The command line's options: one table for the app, `serve`, `generate`, `bench` and `make-tiny`, and
docs/options.md written from it; `generate`'s X/Y/Z plot (xyz.py)."""
