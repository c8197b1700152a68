"""`python -m sdxl_tpu generate --x-type ... --y-type ...`: AUTOMATIC1111's X/Y/Z plot on the command
line (cli/xyz.py), on the tiny checkpoint: each cell's PNG with its own parameters, the grid with the
plot's, a cell's pixels those of the same image made by a plain `generate`; bad axes one line each."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

# The settings test_cli.py's tests compile (64x64, float32, four images a call): the session's cache has them.
COMMON = ["a cat", "--seed", "5", "--size", "64x64", "--dtype", "float32"]


@pytest.fixture
def main(compile_cache, monkeypatch):
    """The CLI's entry point in this process (test_cli.py checks what a process of its own adds)."""
    from sdxl_tpu.__main__ import main

    monkeypatch.setenv("SDXL_TPU_COMPILE_CACHE", str(compile_cache))
    return main


def pixels(image) -> np.ndarray:
    return np.asarray((image if isinstance(image, Image.Image) else Image.open(image)).convert("RGB"))


def test_a_plot_writes_each_cell_and_the_labelled_grid(main, tiny_checkpoint, tmp_path, capsys):
    """Steps 2, 3 across and CFG 3, 5 down: two calls (a call's images may differ in CFG, not in
    steps), each cell's file in A1111's order (x fastest) saying its own steps and CFG; the grid two
    cells wide and two high plus A1111's label bands, its parameters the first cell's and the axes."""
    model = ["--model", str(tiny_checkpoint)]
    out = tmp_path / "plot"
    assert main(["generate", *COMMON, *model, "--steps", "2", "--x-type", "Steps", "--x-values", "2,3",
                 "--y-type", "CFG Scale", "--y-values", "3, 5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    calls = [line for line in printed if line.startswith("call ")]
    assert [re.fullmatch(r"call (\d) of 2: 2 images in \d+\.\d{3} s", line)[1] for line in calls] == ["1", "2"]
    assert sorted(p.name for p in out.glob("*.png")) == ["xyz-1.png", "xyz-2.png", "xyz-3.png", "xyz-4.png",
                                                         "xyz-grid.png"]
    assert printed[-1] == str(out / "xyz-grid.png")
    for n, (steps, cfg) in enumerate([(2, 3), (3, 3), (2, 5), (3, 5)], 1):
        text = Image.open(out / f"xyz-{n}.png").text["parameters"]
        assert f"Steps: {steps}, " in text and f"CFG scale: {cfg}, " in text and "Seed: 5, " in text, text
        assert "Script" not in text
    grid = Image.open(out / "xyz-grid.png")
    assert grid.text["parameters"] == (Image.open(out / "xyz-1.png").text["parameters"] + ", Script: X/Y/Z plot, "
                                       'X Type: Steps, X Values: "2,3", Y Type: CFG Scale, Y Values: "3, 5"')
    assert grid.width == 2 * 64 + 64 * 3 // 4 and 2 * 64 < grid.height < 3 * 64  # (A1111's row labels' band)
    np.testing.assert_array_equal(pixels(grid)[-64:, -64:], pixels(out / "xyz-4.png"))
    np.testing.assert_array_equal(pixels(grid)[-128:-64, -128:-64], pixels(out / "xyz-1.png"))

    # A cell is the image a plain generate makes with its settings and seed.
    assert main(["generate", *COMMON, *model, "--steps", "3", "--guidance", "5", "--out", str(tmp_path / "one")]) == 0
    np.testing.assert_array_equal(pixels(tmp_path / "one" / "5.png"), pixels(out / "xyz-4.png"))

    # Without the legend, the grid is the cells alone.
    assert main(["generate", *COMMON, *model, "--steps", "2", "--x-type", "cfg scale", "--x-values", "3-5 [2]",
                 "--no-legend", "--out", str(tmp_path / "bare")]) == 0
    bare = Image.open(tmp_path / "bare" / "xyz-grid.png")
    assert bare.size == (2 * 64, 64) and "X Type: CFG Scale, X Values: 3-5 [2]" in bare.text["parameters"]
    np.testing.assert_array_equal(pixels(bare)[:, :64], pixels(out / "xyz-1.png"))


@pytest.mark.parametrize("given, said", [
    (["--x-type", "Bogus", "--x-values", "1"], "X type 'Bogus' is not offered here; the txt2img axis types offered: "),
    (["--x-type", "Steps", "--x-values", "1-"], "X values (Steps): '1-' is not a whole number or a range"),
    (["--x-type", "Steps"], "X values (Steps): give at least one value for Steps."),
    (["--y-values", "3"], "--y-values are the values of an axis: give --y-type too."),
    (["--x-type", "Sampler", "--x-values", "Euler, Bogus"], "X values (Sampler): "),
    (["--x-type", "Prompt S/R", "--x-values", "dog, cat"], "Prompt S/R did not find 'dog'"),
    (["--x-type", "Steps", "--x-values", "2", "--images", "0"], "--images must be at least 1"),
])
def test_a_bad_axis_is_one_line_before_anything_loads(main, tmp_path, capsys, given, said):
    """(The model named does not exist: nothing is loaded before the axes are checked.)"""
    assert main(["generate", *COMMON, "--model", str(tmp_path / "none"), *given, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and err.count("\n") == 1, err
    assert not list(tmp_path.glob("*.png"))
