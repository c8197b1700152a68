"""argparse parsers from the option table (options.py), and what a command line left out filled
in: from another source the command has, the environment, then the defaults."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any

from ..request.names import ARCHITECTURES
from .options import Option, options_for


def add_options(parser: argparse.ArgumentParser, command: str) -> None:
    """`command`'s options on `parser`. Each is None when not given (switches: their default), so
    that `fill_defaults` can tell what the command line said."""
    for o in options_for(command):
        kw: dict[str, Any] = {"help": help_text(o).replace("%", "%%")}
        if o.positional:
            parser.add_argument(o.flag, nargs="?" if o.default is not None else None, default=None, metavar=o.metavar,
                                **kw)
        elif o.switch:
            parser.add_argument(o.flag, action=o.action or "store", dest=o.name, **kw)
        else:
            parser.add_argument(o.flag, dest=o.name, default=None, type=o.type, choices=o.choices, metavar=o.metavar,
                                action=o.action or "store", **kw)


def help_text(o: Option) -> str:
    listed = f"; one of: {', '.join(o.choices)}" if o.choices and o.metavar else ""  # (else argparse lists them)
    return o.help + listed + (f" (env {o.env}; " if o.env else " (") + f"default {o.default_text()})"


def fill_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str,
                  env: Mapping[str, str] | None = None, given: Mapping[str, Any] | None = None) -> argparse.Namespace:
    """`args` with what the command line left out taken from `given` (another source the command
    has, e.g. generate's --parameters), the environment, then the defaults; a bad environment
    value ends the program through `parser.error`, naming the variable."""
    env = os.environ if env is None else env
    given = given or {}
    for o in options_for(command):
        if o.switch or getattr(args, o.name) is not None:
            continue
        if given.get(o.name) is not None:
            setattr(args, o.name, given[o.name])
        elif o.env and env.get(o.env, "").strip():
            setattr(args, o.name, from_environment(parser, o, env[o.env].strip()))
        else:
            setattr(args, o.name, list(o.default) if isinstance(o.default, list) else o.default)
    return args


def from_environment(parser: argparse.ArgumentParser, o: Option, text: str) -> Any:
    parts = [p.strip() for p in text.split(",") if p.strip()] if o.action == "append" else [text]
    values = []
    for part in parts:
        try:
            value = o.type(part)
        except argparse.ArgumentTypeError as e:
            parser.error(f"{o.env} (for {o.flag}) {e}")
        except ValueError:
            kind = {int: "a whole number", float: "a number"}.get(o.type, "valid")
            parser.error(f"{o.env} (for {o.flag}) must be {kind}, got {part!r}")
        if o.choices is not None and value not in o.choices:
            parser.error(f"{o.env} (for {o.flag}) must be one of {', '.join(o.choices)}, got {part!r}")
        values.append(value)
    return values if o.action == "append" else values[0]


def older_architecture(args: argparse.Namespace) -> str | None:
    """An architecture named by --preset, the older spelling of --architecture (bench, make-tiny)."""
    if args.preset in ARCHITECTURES:
        print(f"note: --preset {args.preset} names an architecture; it is spelled --architecture {args.preset} now",
              file=sys.stderr)
        return args.preset
    return None
