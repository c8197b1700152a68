"""The page's X/Y/Z plot without a browser (page/page_xyz.py): the panel's values checked, the plot
run through the server's stream as the page runs it (progress over all its calls, each call's cells
kept in the history as it ends, the grid first with A1111's parameters, then each cell), and its
refusals, one line each, before anything runs. The browser's side: test_app.py."""

from __future__ import annotations

import pytest
from PIL import Image

from sdxl_tpu import CompileCounter
from sdxl_tpu.a1111.images import read_parameters
from sdxl_tpu.page.page_run import Kept, page_run
from sdxl_tpu.page.page_xyz import PANEL, XYZ, axis_hint, page_plot, panel_values
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.server.core import Server
from sdxl_tpu.server.events import Called, Done, Progress, Started
from sdxl_tpu.server.files import ImageStore
from sdxl_tpu.server.settings import Settings

SIZES = [(64, 64), (96, 64)]
FORM = dict(prompt="a cat", negative="", style="(No style)", seed=5, randomize=False, guidance=5.0, steps=3,
            size="64x64", sampler=None, schedule=None, rng=None)
OFF = ["None", "Nothing", "", "Nothing", "", "Nothing", "", True, False]  # the panel as the page starts


def panel(**given):
    return [given.get(name, default) for name, default in zip(PANEL, [XYZ, *OFF[1:]])]


@pytest.fixture(scope="module")
def server(tiny_pipeline, tmp_path_factory):
    server = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES), preview_every=0),
                    loader=lambda s: tiny_pipeline, images=ImageStore(tmp_path_factory.mktemp("images")))
    server.warmup.load()
    yield server
    server.engine.batcher.close()


def test_the_panels_values_are_checked_whatever_a_client_sends():
    assert panel_values(OFF)["script"] == "None" and panel_values([None] * len(PANEL)) == dict(zip(PANEL, OFF))
    for at, value, message in [(0, "Loopback", "Script 'Loopback' is not available; choose one of: None, X/Y/Z plot."),
                               (1, "Var. seed", "X type 'Var. seed' is not available; choose one of: Nothing, Seed,"),
                               (3, 4, "Y type must be text, got a number"),
                               (4, ["1"], "Y values must be text, got a list"),
                               (6, "x" * 20_001, "Z values is 20,001 characters long"),
                               (7, "yes", "Draw legend must be true or false, got text"),
                               (8, 1, "Include lone images must be true or false, got a number")]:
        values = list(OFF)
        values[at] = value
        with pytest.raises(RequestError) as refused:
            panel_values(values)
        assert str(refused.value).startswith(message), (at, str(refused.value))


def test_axis_hints_name_what_this_server_offers(server):
    assert axis_hint("Size", server) == "64x64, 96x64, 96x96"  # (the tiny pipeline's)
    assert "Euler" in axis_hint("Sampler", server) and axis_hint("Steps", server).startswith("10, 20, 30")
    assert axis_hint("Nothing", server) == "" and axis_hint({"a": 1}, server) == "" and axis_hint(None, server) == ""


def test_a_plot_runs_its_calls_as_one_run_and_shows_the_grid_first(server):
    """Steps 2, 3 by CFG 3, 5: two calls (cells differing only in CFG share one), the steps counted
    over both (2 + 3), each call's cells kept as it ends, the grid first (2 x 2 cells of 64x64 with
    the legend's bands) with the first cell's parameters and the plot's, then each cell; nothing
    compiles."""
    plot = page_plot(server, panel(x_type="Steps", x_values="2,3", y_type="CFG Scale", y_values="3, 5",
                                   include_lone_images=True))
    with CompileCounter() as counter:
        updates = list(plot.updates(server.stream(FORM, plan=plot.requests, previews=False)))
    assert counter.compiles == 0
    started = updates[0]
    assert isinstance(started, Started) and started.calls == 2 and started.all_steps == 5 and started.seeds == [5] * 4
    progress = [(u.step, u.steps, u.call) for u in updates if isinstance(u, Progress)]
    assert progress == [(1, 5, 1), (2, 5, 1), (3, 5, 2), (4, 5, 2), (5, 5, 2)], progress
    kept = [u for u in updates if isinstance(u, Kept)]
    assert [[(r["steps"], r["guidance"], r["seed"]) for r in k.runs] for k in kept] == [[(2, 3.0, 5), (2, 5.0, 5)],
                                                                                         [(3, 3.0, 5), (3, 5.0, 5)]]
    assert not any(isinstance(u, Called) for u in updates)  # (turned into Kept)
    done = updates[-1]
    assert isinstance(done, Done) and len(done.gallery) == 5 and done.seeds == [5] * 5
    assert [caption for _, caption in done.gallery] == ["X/Y/Z plot", "Steps: 2, CFG Scale: 3.0 · seed 5",
                                                        "Steps: 3, CFG Scale: 3.0 · seed 5",
                                                        "Steps: 2, CFG Scale: 5.0 · seed 5",
                                                        "Steps: 3, CFG Scale: 5.0 · seed 5"]
    with Image.open(done.gallery[0][0]) as grid:
        assert grid.width == 2 * 64 + 48 and grid.height > 2 * 64, grid.size  # (the row labels' band: 3/4 of a cell)
        text = read_parameters(grid)
    with Image.open(done.gallery[1][0]) as first:
        assert text == read_parameters(first) + ', Script: X/Y/Z plot, X Type: Steps, X Values: "2,3", Y Type: ' \
                                                 'CFG Scale, Y Values: "3, 5"', text
    assert done.summary.startswith("X/Y/Z plot of 4 images (2 × 2) in 2 calls: the grid, then each image. The last ")
    # As the page shows it: the history gets the four cells (newest first), not a run of the form's.
    changes = list(page_run(iter(updates), {**FORM, "batch_count": 1}, [], keep_run=False))
    history = changes[-1]["history"]
    assert [(e["steps"], e["guidance"]) for e in history] == [(3, 5.0), (3, 3.0), (2, 5.0), (2, 3.0)], history
    panels = [c["panel"] for c in changes if "panel" in c]
    assert "Generating · call 1 of 2 · step 1 of 5 · " in panels[1] and "call 2 of 2 · step 5 of 5" in panels[-2]


@pytest.mark.parametrize("given, form, message", [
    (dict(x_type="Steps", x_values="abc"), {}, "X values (Steps): 'abc' is not a whole number or a range"),
    (dict(x_type="Steps", x_values="0-2"), {}, "X values (Steps): Steps must be a whole number between 1 and 50"),
    (dict(y_type="Size", y_values="64x64, 1024x1024"), {}, "Y values (Size): Size '1024x1024' is not available"),
    (dict(z_type="Sampler", z_values="Euler, Nope"), {}, "Z values (Sampler): Sampler 'Nope' is not available"),
    (dict(x_type="Hires steps", x_values="2, 4"), {}, "The X/Y/Z plot sets Hires steps, which applies with Hires"),
    (dict(x_type="Steps", x_values="1-50", y_type="Seed", y_values="1-2"), {}, "The X/Y/Z plot has 100 cells"),
    (dict(x_type="Steps", x_values="2, 3"), dict(batch_count=2), "The X/Y/Z plot makes one image a cell"),
    (dict(x_type="Steps", x_values="2, 3"), dict(steps=0), "Steps must be a whole number between 1 and 50"),
    (dict(x_type="Steps", x_values=""), {}, "X values (Steps): give at least one value for Steps."),
])
def test_a_bad_plot_is_refused_in_one_line_before_anything_runs(server, given, form, message):
    plot = page_plot(server, panel(**given))
    with pytest.raises(RequestError) as refused:
        list(plot.updates(server.stream({**FORM, **form}, plan=plot.requests)))
    assert str(refused.value).startswith(message), str(refused.value)
    assert "\n" not in str(refused.value)


def test_stop_in_a_later_call_keeps_the_calls_before_it(server):
    """Stop (the stream closed) in the plot's second call: the first call's cells were kept as it
    ended, no grid is made, and the run panel names the call it stopped in."""
    from sdxl_tpu.page.page_run import stopped

    plot = page_plot(server, panel(x_type="Steps", x_values="2, 40"))
    stream = plot.updates(server.stream(FORM, plan=plot.requests, previews=False))
    seen = []
    for update in stream:
        seen.append(update)
        if isinstance(update, Progress) and update.call == 2 and update.step >= 4:
            break
    stream.close()
    kept = [u for u in seen if isinstance(u, Kept)]
    assert [[r["steps"] for r in k.runs] for k in kept] == [[2]] and not any(isinstance(u, Done) for u in seen)
    at = {"seeds": [5, 5], "step": seen[-1].step, "steps": 42, "call": [2, 2]}
    assert stopped("running", at)["panel"].count(f"Stopped at step {seen[-1].step} of 42, in call 2 of 2: the calls "
                                                 "before it are kept.") == 1
