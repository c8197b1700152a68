"""docs/options.md's table of options, written from the one list of them (options.py):
`python -m sdxl_tpu.cli.options_table` prints it."""

from __future__ import annotations

from .options import OPTIONS


def markdown_table() -> str:
    """docs/options.md's table of options."""
    lines = ["| Option | Environment | Default | Commands | What it does |", "|---|---|---|---|---|"]
    for o in OPTIONS:
        choices = f" One of: {', '.join(o.choices)}." if o.choices else ""
        cell = lambda text: text.replace("|", "\\|")
        lines.append(f"| `{o.flag}` | {f'`{o.env}`' if o.env else ''} | {cell(o.default_text())} | "
                     f"{', '.join(o.commands)} | {cell(o.help)}.{cell(choices)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
