"""The package's shape, read from its source: the import graph (every import of one sdxl_tpu module
by another, inside functions and under `if TYPE_CHECKING:` included), its cycles, and the module
map that docs/layout.md holds (`python tests/layout.py` writes it; test_layout.py checks it is current).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sdxl_tpu"
MAP = ROOT / "docs" / "layout.md"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str, package: Path = PACKAGE) -> Path | None:
    base = package.parent.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports_of(path: Path, package: Path = PACKAGE) -> set[str]:
    """The sdxl_tpu modules `path` imports: at the top, inside functions and for type checking alike
    (a cycle of type-only imports is a cycle a reader must hold in their head all the same)."""
    name = module_name(path, package)
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == package.name}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != package.name:
                continue
            for alias in node.names:  # `from . import sampling` names a module
                candidate = f"{target}.{alias.name}"
                found.add(candidate if module_path(candidate, package) else target)
    return {m for m in found if module_path(m, package)} - {name}


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules it imports. (A package's __init__ imports nothing: sdxl_tpu's names load
    on first use, and the folders' hold docstrings only.)"""
    return {module_name(p, package): imports_of(p, package) for p in sorted(package.rglob("*.py"))}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each import cycle found by a depth-first walk, as the modules along it."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def part_of(module: str) -> str:
    """The folder a module belongs to ("request", "server", ...), or the module for top-level ones."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def parts_imported(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder -> the other folders its modules import."""
    out: dict[str, set[str]] = {}
    for module, targets in edges.items():
        out.setdefault(part_of(module), set()).update(part_of(t) for t in targets)
    return {part: targets - {part, "sdxl_tpu"} for part, targets in out.items()}


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    end = re.search(r"\. (?=[A-Z`(]|\w+\.py)", text)  # (a sentence's end, not an abbreviation's: "Hires. fix")
    return text if end is None else text[:end.start() + 1]


def module_map() -> str:
    """docs/layout.md: every folder and module with the first sentence of its docstring, and which
    folders each folder imports (read from the source, so it cannot drift)."""
    edges = graph()
    uses = parts_imported(edges)
    lines = ["# Layout", "",
             "Where each part of the code lives. Written by `python tests/layout.py` from the modules' own",
             "docstrings and imports; `tests/test_layout.py` fails when it is stale.", "",
             "| folder | imports | what it holds |", "|---|---|---|"]
    folders = sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    for folder in folders:
        used = ", ".join(sorted(uses.get(folder.name, ()) - {"version"})) or "nothing"
        lines.append(f"| `{folder.name}/` | {used} | {summary(folder / '__init__.py')} |")
    lines += ["", "## Modules", "", "### sdxl_tpu/", ""]
    for path in sorted(PACKAGE.glob("*.py")):
        lines.append(f"- `{path.name}`: {summary(path)}")
    for folder in folders:
        lines += ["", f"### {folder.name}/", ""]
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                lines.append(f"- `{path.name}`: {summary(path)}")
    lines += ["", "Besides the package: `app.py` (the Space's entry point: runs page/playground.py), `tests/`,",
              "`benchmarks/`, `deploy/` (Docker and Kubernetes), `docs/`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    MAP.write_text(module_map())
    print(f"wrote {MAP.relative_to(ROOT)}", file=sys.stderr)
