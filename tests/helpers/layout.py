"""The package's shape, read from its source: the import graph (every import of one sdxl_tpu module
by another, inside functions and under `if TYPE_CHECKING:` included), its cycles, and the module
map that docs/layout.md holds (`python tests/helpers/layout.py` writes it; test_layout.py checks it is current).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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



# docs/layout.md's walk: one request's way through the folders above (a test checks that every file it
# names exists, tests/project/test_layout.py).
WALK = """
## A request's way

From the page to its images, part by part (the back end's JSON and the tools' APIs are checked into the
same `Request` by their own readers, `routes/http_io.py` and `a1111/a1111_api.py`, and join at step 3):

1. `page/page_events.py`: Generate runs the server's `stream` (`server/core.py`) with the form's values,
   in Gradio's queue.
2. `server/form.py`: the values, field by field (`request/fields.py`, `request/values.py`), checked into
   one `Request` (`request/request.py`; each image's `ImageInfo`); what is wrong is refused, naming the
   field.
3. `server/engine.py`: the engine takes it: `local_engine.py`, the model in this process, or
   `remote_engine.py`, which sends it to a back end (`routes/backend.py`, where it goes on from step 3).
4. `server/batcher.py`: requests of one size and kind share one compiled call of `images_per_call` images.
5. `generate/pipeline.py` (`Pipeline.run_images`) and `generate/call.py` (`run_call`), top to bottom:
   token ids, the text encoders, noise, the denoising loop (`generate/denoising_loop.py`: one compiled step
   per row of the sampler's table, `sampler/`), the VAE's decode. Each stage's math is in
   `generate/sampling.py`; `generate/compiling/` makes them programs per size (`programs.py`), compiles
   them side by side when first needed (`compiled.py`) and stores them for a restart (`stored_programs.py`).
6. Back: the images as files carrying A1111's parameters text (`a1111/infotext.py`, `a1111/images.py`,
   `server/files.py`), the steps and previews on the way as events (`server/events.py`), and what the
   page shows of them (`page/page_run.py`).
"""

def module_map() -> str:
    """docs/layout.md: every folder and module with the first sentence of its docstring, and which
    folders each folder imports (read from the source, so it cannot drift)."""
    edges = graph()
    uses = parts_imported(edges)
    lines = ["# Layout", "",
             "Where each part of the code lives. Written by `python tests/helpers/layout.py` from the modules' own",
             "docstrings and imports; `tests/project/test_layout.py` fails when it is stale.", "",
             "| folder | imports | what it holds |", "|---|---|---|"]
    folders = sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    for folder in folders:
        used = ", ".join(sorted(uses.get(folder.name, ()) - {"version"})) or "nothing"
        lines.append(f"| `{folder.name}/` | {used} | {summary(folder / '__init__.py')} |")
    lines += ["", *WALK.strip().splitlines(), "", "## Modules", "", "### sdxl_tpu/", ""]
    for path in sorted(PACKAGE.glob("*.py")):
        lines.append(f"- `{path.name}`: {summary(path)}")
    for folder in folders:
        lines += ["", f"### {folder.name}/", ""]
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                lines.append(f"- `{path.name}`: {summary(path)}")
        subfolders = sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file())
        lines += [f"- `{sub.name}/`: {summary(sub / '__init__.py')}" for sub in subfolders]
        for sub in subfolders:
            lines += ["", f"#### {folder.name}/{sub.name}/", ""]
            lines += [f"- `{path.name}`: {summary(path)}" for path in sorted(sub.glob("*.py"))
                      if path.name != "__init__.py"]
    lines += ["", "Besides the package: `app.py` (the Space's entry point: runs page/playground.py), `tests/`,",
              "`benchmarks/`, `deploy/` (Docker and Kubernetes), `docs/`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    MAP.write_text(module_map())
    print(f"wrote {MAP.relative_to(ROOT)}", file=sys.stderr)
