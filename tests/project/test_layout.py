"""The package's shape: folders that show the parts, no import cycles (type-only imports counted),
modules one can hold in one's head, JAX-free plain parts (request/, a1111/, imaging/, cli/) that the
front end's imports rest on, the
generator imported by the local engine alone, and a module map that says what is true."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import layout
from layout import PACKAGE, cycles, graph, module_name

MAX_LINES = 330  # a file one can hold in one's head (the UNet, mirroring its checkpoint's tree, is the longest)
FOLDERS = ["a1111", "bench", "cli", "generate", "imaging", "models", "page", "request", "routes", "sampler", "server",
           "weights"]
PLAIN = ("a1111", "cli", "imaging", "request")  # no JAX, no HTTP: what a generation is and the formats around it


def test_the_folders_show_the_parts():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert folders == FOLDERS
    for folder in folders:
        init = PACKAGE / folder / "__init__.py"
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree) and len(tree.body) == 1, f"{folder}/__init__.py: a docstring and nothing else"
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py", "version.py"]
    assert {p.stem for p in (PACKAGE / "generate").glob("*.py")} >= {"sampling", "pipeline", "call", "loading"}
    compiling = {p.stem for p in (PACKAGE / "generate" / "compiling").glob("*.py")}
    assert compiling >= {"programs", "compiled", "stored_programs"}
    assert {p.stem for p in (PACKAGE / "models").glob("*.py")} >= {"clip", "unet", "vae", "taesd", "attention"}


def test_no_import_cycles():
    edges = graph()
    # (the graph sees imports: top-level, relative, `from . import module`)
    assert "sdxl_tpu.generate.sampling" in edges["sdxl_tpu.generate.call"]
    assert "sdxl_tpu.generate.sampler_update" in edges["sdxl_tpu.generate.sampling"]
    assert cycles(edges) == []


def test_the_cycle_check_sees_cycles_of_every_kind(tmp_path):
    """(The check above can fail: a cycle closed inside a function, or only for type checking, is found.)"""
    package = tmp_path / "sdxl_tpu"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import x\n")
    (package / "b.py").write_text("def f():\n    from .a import y\n")
    (package / "c.py").write_text("from . import d\n")
    (package / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import Z\n")
    edges = graph(package)
    assert edges["sdxl_tpu.b"] == {"sdxl_tpu.a"} and edges["sdxl_tpu.d"] == {"sdxl_tpu.c"}
    assert sorted(map(sorted, cycles(edges))) == [["sdxl_tpu.a", "sdxl_tpu.a", "sdxl_tpu.b"],
                                                  ["sdxl_tpu.c", "sdxl_tpu.c", "sdxl_tpu.d"]]


def test_modules_are_short():
    lengths = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {m: n for m, n in lengths.items() if n > MAX_LINES} == {}


def test_the_plain_parts_import_nothing_but_each_other():
    """request/, a1111/, imaging/ and cli/ are JAX-free by construction: none of their modules imports
    another sdxl_tpu module (but the version) nor any of JAX, flax, torch, gradio."""
    forbidden = {"jax", "jaxlib", "flax", "torch", "gradio", "transformers", "safetensors"}
    plain = tuple(f"sdxl_tpu.{folder}." for folder in PLAIN)
    for folder in PLAIN:
        for path in (PACKAGE / folder).glob("*.py"):
            tree = ast.parse(path.read_text())
            names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
            assert not {n.split(".")[0] for n in names} & forbidden, path.name
    outside = {m: {t for t in targets if not t.startswith(plain)} - {"sdxl_tpu.version"}
               for m, targets in graph().items() if m.startswith(plain)}
    assert outside and {m: t for m, t in outside.items() if t} == {}


def test_what_a_front_end_imports_maps_no_jax():
    """A front end's modules (the plain parts, the server but its local engine, its routes and page, the
    tokenizers) import without JAX or flax in the process."""
    server = sorted(module_name(p) for folder in ("server", "routes", "page") for p in (PACKAGE / folder).glob("*.py")
                    if p.stem != "local_engine")
    plain = sorted(module_name(p) for folder in PLAIN for p in (PACKAGE / folder).glob("*.py"))
    code = (f"import sys, importlib\n"
            f"for m in {plain + server + ['sdxl_tpu', 'sdxl_tpu.weights.hub']!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('jax', 'flax', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]"]


def test_only_the_local_engine_imports_the_generator():
    edges = graph()
    importers = {m for m, targets in edges.items() if any(t.startswith("sdxl_tpu.generate") for t in targets)}
    outside = {m for m in importers if not m.startswith(("sdxl_tpu.generate", "sdxl_tpu.bench"))}
    assert outside == {"sdxl_tpu.server.local_engine", "sdxl_tpu.__main__"}, outside
    app = ast.parse((PACKAGE.parent / "app.py").read_text())
    app_imports = {n.module for n in ast.walk(app) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in app_imports if m and m.startswith("sdxl_tpu.generate")}


def test_the_module_map_is_current():
    assert layout.MAP.read_text() == layout.module_map(), (
        "docs/layout.md is stale: rewrite it with `python tests/helpers/layout.py`")
    text = layout.MAP.read_text()
    for path in PACKAGE.rglob("*.py"):  # every module and folder is on the map
        if path.parent != PACKAGE or path.name != "__init__.py":
            assert (f"`{path.name}`" if path.name != "__init__.py" else f"`{path.parent.name}/`") in text, path
    assert Path(PACKAGE.parent / "README.md").read_text().count("docs/layout.md") >= 1


# Files the text names that are not this repository's: other projects' (the modules mirrored or
# cited), what a run writes, and what a tool reads.
NAMED_ELSEWHERE = {"unet_2d_blocks.py", "transformer_2d.py", "comfy/latent_formats.py", "Processed.js", "Node.js",
                   "merges.txt", "params.txt", "installed.txt", "environment.txt", "log.txt", "summary.txt",
                   "unet-hlo.txt", "backends.conf", "listen.conf"}
NAMED_FILE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|sh|js|mjs|css|yaml|toml|txt|conf))\b")


def test_every_file_the_code_and_docs_name_exists():
    """A docstring, comment or page that names a file names one that is here (a renamed module
    leaves no pointer to nothing behind). benchmarks/RESULTS.md is a record of its dates: not read."""
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=PACKAGE.parent,
                             capture_output=True, text=True, check=True).stdout.split()  # (new files too)
    here = set(tracked) | {path.rsplit("/", 1)[-1] for path in tracked}
    texts = [path for path in tracked if path.startswith(("sdxl_tpu/", "docs/", "benchmarks/", "deploy/"))
             or path in ("app.py", "README.md")]
    missing = {}
    for path in texts:
        if path == "benchmarks/RESULTS.md" or not path.endswith((".py", ".md", ".sh", ".yaml", ".conf")):
            continue
        for named in NAMED_FILE.findall((PACKAGE.parent / path).read_text()):
            name = named.rsplit("/", 1)[-1]
            if named not in here and name not in here and name not in NAMED_ELSEWHERE and named not in NAMED_ELSEWHERE:
                missing.setdefault(named, []).append(path)
    assert missing == {}
    named = NAMED_FILE.findall("(guard.py, api_key.py) in docs/deploy.md")  # (the check can fail)
    assert named == ["guard.py", "api_key.py", "docs/deploy.md"]


def test_the_benchmarks_that_borrow_the_tests_helpers_find_them():
    """A benchmark script that drives the app as the tests do (served_app.py) starts: its path to
    tests/helpers/ follows the helpers wherever they move."""
    scripts = sorted(p for p in (PACKAGE.parent / "benchmarks").glob("*.py") if "served_app" in p.read_text())
    assert {p.name for p in scripts} >= {"screenshot.py", "ready.py"}
    for script in scripts:
        done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                              cwd=PACKAGE.parent)
        assert done.returncode == 0, (script.name, done.stderr[-2000:])
