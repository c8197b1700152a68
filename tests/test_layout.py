"""The package's shape: folders that show the parts, no import cycles, modules one can hold in
one's head, and the parts that check requests importable without JAX."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sdxl_tpu"
MAX_LINES, MAX_PIPELINE_LINES = 400, 300


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The sdxl_tpu modules `path` imports at run time (function-level imports included, those
    under `if TYPE_CHECKING:` not)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sdxl_tpu")}
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if not target.startswith("sdxl_tpu"):
            continue
        for alias in node.names:  # `from . import sampling` names a module
            candidate = f"{target}.{alias.name}"
            found.add(candidate if module_path(candidate) else target)
    return {m for m in found if module_path(m)} - {name}


def module_path(name: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def graph() -> dict[str, set[str]]:
    # A package's __init__ is where `import sdxl_tpu.x.y` starts: sdxl_tpu/__init__.py imports
    # nothing at module level (its names load on first use), and neither do the folders'.
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def test_the_folders_show_the_parts():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert folders == ["bench", "generate", "models", "sampler", "server", "spec", "weights"]
    for folder in folders:
        assert ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())), folder
    # The generator sits at the top; the networks, weights and servers each in their folder.
    assert {p.stem for p in (PACKAGE / "models").glob("*.py")} >= {"clip", "unet", "vae", "taesd", "attention"}
    assert {p.stem for p in (PACKAGE / "server").glob("*.py")} >= {"core", "batcher", "backend", "remote", "guard"}
    assert all((PACKAGE / "generate" / f"{m}.py").is_file() for m in ("sampling", "update", "pipeline"))


def test_no_import_cycles():
    edges = graph()
    assert "sdxl_tpu.generate.sampling" in edges["sdxl_tpu.generate.pipeline"]  # the graph sees imports
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    """(The check above can fail: two modules importing each other are found.)"""
    package = tmp_path / "sdxl_tpu"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import x\n")
    (package / "b.py").write_text("def f():\n    from .a import y\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    edges = graph()
    assert edges["sdxl_tpu.a"] == {"sdxl_tpu.b"} and edges["sdxl_tpu.b"] == {"sdxl_tpu.a"}


def test_modules_are_short():
    lengths = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {m: n for m, n in lengths.items() if n > MAX_LINES} == {}
    assert lengths["sdxl_tpu.generate.pipeline"] <= MAX_PIPELINE_LINES


def test_request_checking_imports_no_jax():
    """What a front end needs to check requests and name things: no JAX, no flax."""
    code = ("import sys\n"
            "import sdxl_tpu, sdxl_tpu.spec.request, sdxl_tpu.spec.names, sdxl_tpu.spec.infotext\n"
            "import sdxl_tpu.spec.images, sdxl_tpu.spec.prompts, sdxl_tpu.spec.styles, sdxl_tpu.spec.recipes\n"
            "import sdxl_tpu.weights.hub, sdxl_tpu.weights.tiny_tokenizers, sdxl_tpu.server.page\n"
            "print(sorted(m for m in ('jax', 'flax', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]"]
