"""A1111's X/Y/Z plot (issue 54 item 1): every value form read as A1111 1.10's process_axis reads
it, its axis types by their index in its lists, script_args in its run()'s order, the cells in its
order, the cells packed into full calls, clear one-line refusals, and the grid with its labels.

Nothing of A1111 is importable here: each expected value below is what its code makes, the rule
named beside it (process_axis's branches: `re_range` -> range(start, end + 1, step); `re_range_count`
-> [int(x) for x in np.linspace(start, end, num)]; `re_range_float` -> np.arange(start, end + step,
step); `re_range_count_float` -> np.linspace(start, end, num); otherwise opt.type(value))."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from sdxl_tpu.a1111.xyz_axes import AXIS_TYPES, MAX_VALUES, a1111_axis_labels, axis, axis_type, parse_values
from sdxl_tpu.a1111.xyz_plot import SCRIPT_ARGS, Plot, calls, cells, script_plot
from sdxl_tpu.imaging.grid import MIN_FONT_SIZE, font_size, xyz_grids
from sdxl_tpu.request.errors import RequestError

SDXL_SIZES = [(1024, 1024), (1152, 896), (896, 1152)]


@pytest.mark.parametrize("kind, text, expected", [
    ("int", "1-5", [1, 2, 3, 4, 5]),  # re_range: range(1, 5 + 1, 1)
    ("int", "1-10 (+2)", [1, 3, 5, 7, 9]),  # re_range: range(1, 11, 2)
    ("int", "10-1 (-3)", [10, 7, 4]),  # re_range: range(10, 1 + 1, -3)
    ("int", "10-1 (-1)", [10, 9, 8, 7, 6, 5, 4, 3]),  # re_range: range(10, 2, -1): A1111's end + 1 going down too
    ("int", "5-20 [4]", [5, 10, 15, 20]),  # re_range_count: linspace(5, 20, 4)
    ("int", "1-2 [4]", [1, 1, 1, 2]),  # re_range_count: int() cuts 1.33 and 1.67, not rounded
    ("int", "-5--3", [-5, -4, -3]),  # re_range: signed ends
    ("int", " 8, 12 ,16", [8, 12, 16]),  # csv_string_to_list_strip, int(value)
    ("int", "1-3, 7,, ", [1, 2, 3, 7]),  # (1.10: empty values skipped for numbers)
    ("int", "-1", [-1]),  # neither range: int("-1")
    ("float", "1.5-3 (+0.5)", [1.5, 2.0, 2.5, 3.0]),  # re_range_float: arange(1.5, 3.5, 0.5)
    ("float", "1-2 [5]", [1.0, 1.25, 1.5, 1.75, 2.0]),  # re_range_count_float: linspace(1, 2, 5)
    ("float", "1-2", [1.0, 2.0]),  # re_range_float, step 1: arange(1, 3, 1)
    ("float", "0.1-0.3 (+0.1)", np.arange(0.1, 0.3 + 0.1, 0.1).tolist()),  # arange's float steps: 4 values, as A1111's
    ("float", "7, 5.5", [7.0, 5.5]),  # float(value)
    ("text", '"a, b", c ,d', ["a, b", "c", "d"]),  # csv quoting, each value stripped
    ("text", "a\nb, c", ["a", "b", "c"]),  # every line's values (chain.from_iterable of csv rows)
    ("text", "Euler,", ["Euler", ""]),  # text keeps an empty value (confirm_samplers then refuses it)
    ("order", "a, b", [("a", "b"), ("b", "a")]),  # Prompt order: permutations(values)
])
def test_each_value_form_reads_as_a1111_reads_it(kind, text, expected):
    assert parse_values(text, kind) == expected


@pytest.mark.parametrize("kind, text, message", [
    ("int", "1-10 (2)", "'1-10 (2)' is not a whole number or a range"),  # (A1111: int() raises: a step has a sign)
    ("int", "1-5 (+0)", "a range's step must not be 0"),  # (A1111: range() raises)
    ("float", "1-2 (+0.0)", "a range's step must not be 0"),  # (A1111: ZeroDivisionError in arange)
    ("int", "5-1", "'5-1' makes no values (a range down takes a negative step"),
    ("int", "1-5 [0]", "'1-5 [0]' makes no values."),
    ("float", "1-2 [2.5]", "is not a number or a range"),  # (A1111: int('2.5') raises)
    ("int", "1.5", "'1.5' is not a whole number"),
    ("int", "7" * 80, "is not a whole number"),  # (too long to be one: checked before any pattern)
    ("int", "1-1000", "'1-1000' makes 1,000 values; the axis has room for 100 more."),  # (counted, never made)
    ("int", "1-10**9", "is not a whole number"),
    ("int", "1-99, 200-201", "makes 2 values; the axis has room for 1 more"),
    ("int", "0-9 [100000000000]", "makes 100,000,000,000 values"),
    ("text", ",".join("x" * (MAX_VALUES + 1)), "101 values; at most 100 an axis"),
    ("order", "a,b,c,d,e", "120 values; at most 100 an axis"),  # 5! orders
    ("text", 'a\rb', "do not read as comma-separated text"),
])
def test_values_a1111_cannot_read_are_refused_in_one_line(kind, text, message):
    with pytest.raises(RequestError) as e:
        parse_values(text, kind)
    assert message in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("0123456789-+.()[], \"'\nx e"), max_size=40) | st.text(max_size=40),
       st.sampled_from(["int", "float", "text", "order"]))
def test_any_text_reads_as_values_or_one_line_refusal(text, kind):
    try:
        values = parse_values(text, kind)
    except RequestError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(values, list) and len(values) <= MAX_VALUES


OFFERED = [i for i, label in enumerate(a1111_axis_labels()) if label != "Nothing" and label in
           {t.label for t in AXIS_TYPES}]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(OFFERED), st.text(alphabet=st.sampled_from("0123456789-+.()[], \"xKEulra"), max_size=30)
       | st.text(max_size=30), st.booleans())
def test_any_text_on_any_axis_makes_an_axis_or_a_one_line_refusal(which, text, csv_mode):
    try:
        made = axis(which, text, [text] if text else None, csv_mode=csv_mode, sizes=SDXL_SIZES)
    except RequestError as e:
        assert str(e).startswith("X values") and "\n" not in str(e)
        return
    assert 1 <= len(made.values) == len(made.labels) <= MAX_VALUES


def test_axis_types_are_a1111_s_by_their_index_in_its_tabs_lists():
    txt2img, img2img = a1111_axis_labels(), a1111_axis_labels(img2img=True)
    assert len(txt2img) == 42 and len(img2img) == 41  # (A1111 1.10's lists, the other tab's types left out)
    offered = {i: axis_type(i).label for i, label in enumerate(txt2img) if label in (
        "Nothing", "Seed", "Steps", "Hires steps", "CFG Scale", "Prompt S/R", "Prompt order", "Sampler",
        "Schedule type", "Denoising", "Hires upscaler", "Styles", "RNG source", "Size")}
    assert offered == {0: "Nothing", 1: "Seed", 4: "Steps", 5: "Hires steps", 6: "CFG Scale", 7: "Prompt S/R",
                       8: "Prompt order", 9: "Sampler", 17: "Schedule type", 25: "Denoising", 28: "Hires upscaler",
                       30: "Styles", 39: "RNG source", 41: "Size"}
    assert axis_type(25).field == "hires_strength" and axis_type(24, img2img=True).field == "strength"
    assert axis_type(5, img2img=True).label == "CFG Scale" and axis_type(" cfg scale ").field == "guidance"
    assert axis_type(None).label == "Nothing"  # (A1111's `x_type or 0`)
    with pytest.raises(RequestError, match=r"^X type 24 \(Clip skip\) is not offered here; the txt2img axis types "
                                           r"offered: Nothing \(0\), Seed \(1\), Steps \(4\),"):
        axis_type(24)
    with pytest.raises(RequestError, match=r"Y type 42 is not one of A1111's txt2img axis types \(0 to 41\)"):
        axis_type(42, name="Y")
    with pytest.raises(RequestError, match="'Hires steps' is not offered here; the img2img axis types"):
        axis_type("Hires steps", img2img=True)
    for bad in (True, 4.0, [4]):
        with pytest.raises(RequestError, match="X type must be the index of one of A1111's axis types or its label"):
            axis_type(bad)


def test_each_value_is_checked_as_its_field_and_labelled_as_a1111_labels_it():
    steps = axis(4, "10-30 [3]")
    assert steps.values == (10, 20, 30) and steps.labels == ("Steps: 10", "Steps: 20", "Steps: 30")
    assert axis(6, "5, 7.5").labels == ("CFG Scale: 5.0", "CFG Scale: 7.5")  # (a float written as Python does)
    sampler = axis(9, "euler A, DPM++ 2M", csv_mode=True)  # (any case, as A1111 finds a sampler)
    assert sampler.values == ("Euler a", "DPM++ 2M") and sampler.labels == ("euler A", "DPM++ 2M")
    assert axis(17, "karras, sgm_uniform", csv_mode=True).values == ("Karras", "SGM Uniform")
    assert axis(41, "1152x896", sizes=SDXL_SIZES).values == ((1152, 896),)
    assert axis(39, "cpu", csv_mode=True).values == ("CPU",)
    for which, text, message in [
            (4, "0, 20", r"X values \(Steps\): Steps must be a whole number between 1 and 50\."),
            (6, "25", r"Guidance scale must be a number between 0 and 20"),
            (9, "Eular", r"Sampler 'Eular' is not available; choose one of: Euler, Euler a,"),
            (41, "512x512", r"Size '512x512' is not available; choose one of: 1024x1024"),
            (39, "GPU", r"RNG source GPU \(A1111's GPU noise\) is not made here"),
            (1, "5000000000", r"Seed must be a whole number between -1 \(random\) and 4294967295"),
            (4, "", r"give at least one value for Steps"),
            (7, ", dog", r"the first value is the text to replace: it must not be empty")]:
        with pytest.raises(RequestError, match=message):
            axis(which, text, csv_mode=True, sizes=SDXL_SIZES)
    drawn = axis(1, "-1, 7")
    assert drawn.values[1] == 7 and 0 <= drawn.values[0] < 2**32 and drawn.labels[0] == f"Seed: {drawn.values[0]}"
    assert axis(1, "-1, 7", no_fixed_seeds=True).values == (-1, 7)  # ("Keep -1 for seeds")


def test_script_args_are_read_in_a1111_s_order():
    assert SCRIPT_ARGS[9:] == ("draw_legend", "include_lone_images", "include_sub_grids", "no_fixed_seeds",
                               "vary_seeds_x", "vary_seeds_y", "vary_seeds_z", "margin_size", "csv_mode")
    args = [4, "10,20", [], 9, "", ["Euler", "DDIM"], 0, "", [],
            True, False, True, False, False, False, False, 8, False]
    plot = script_plot(args)  # (Sampler's values from its dropdown list, as A1111's without csv_mode)
    assert plot.x.values == (10, 20) and plot.y.values == ("Euler", "DDIM") and plot.z.labels == ("",)
    assert plot.include_sub_grids and plot.margin_size == 8 and plot.draw_legend and plot.count == 4
    assert script_plot([9, "Euler a, LCM", None, 0, "", None, 0, "", None]).x.values == ("Euler a", "LCM")
    assert script_plot(args[:9]).draw_legend  # (left out: A1111's defaults)
    for bad, message in [
            (args[:8], r"script_args for the X/Y/Z plot: 9 to 18 values in A1111's order \(x_type, x_values,"),
            ([*args, False], r"9 to 18 values .* got 19 values"),
            ("4,10", r"got text"),
            ([*args[:9], "yes"], r"script_args draw_legend must be true or false, got text"),
            ([*args[:16], 501], r"script_args margin_size must be a whole number between 0 and 500"),
            ([4, ["10"], [], *args[3:]], r"X values must be text, got a list"),
            ([9, "", [1], *args[3:]], r"X values \(dropdown\) must be a list of text"),
            ([4, "1-50", [], 6, "1-10", [], *args[6:]], r"The X/Y/Z plot has 500 cells \(50x10x1\); at most 64")]:
        with pytest.raises(RequestError, match=message):
            script_plot(bad)


def test_cells_come_in_a1111_s_order_with_their_fields_and_labels():
    plot = Plot(axis(4, "10,20,30"), axis(6, "3,7"), axis(41, "1024x1024,1152x896"))
    made = cells(plot, {"prompt": "a cat", "seed": 5})
    assert [c.position for c in made] == [(x, y, z) for z in range(2) for y in range(2) for x in range(3)]
    assert [c.index for c in made] == list(range(12))  # ix + iy * len(xs) + iz * len(xs) * len(ys)
    assert made[4].fields == {"seed": 5, "steps": 20, "guidance": 7.0, "size": (1024, 1024)}
    assert made[11].labels == ("Steps: 30", "CFG Scale: 7.0", "Size: 1152x896")
    with pytest.raises(RequestError, match=r"The X/Y/Z plot has 12 cells \(3x2x2\); at most 10 are made here"):
        cells(plot, {"prompt": "a cat"}, max_cells=10)


def test_prompt_s_r_replaces_the_first_value_in_both_prompts():
    plot = Plot(axis(7, "cat, dog, red fox"), axis(7, "night, day"))
    made = cells(plot, {"prompt": "a cat at night", "negative": "cat hair", "seed": 1})
    assert [c.fields["prompt"] for c in made[:3]] == ["a cat at night", "a dog at night", "a red fox at night"]
    assert made[4].fields["prompt"] == "a dog at day" and made[4].fields["negative"] == "dog hair"
    assert made[1].labels == ("dog", "night", "")
    order = cells(Plot(axis(8, "cat, dog")), {"prompt": "a cat and a dog"})
    assert [c.fields["prompt"] for c in order] == ["a cat and a dog", "a dog and a cat"]
    with pytest.raises(RequestError, match=r"^Prompt S/R did not find 'cow' in the prompt or the negative prompt\.$"):
        cells(Plot(axis(7, "cow, pig")), {"prompt": "a cat", "negative": "blurry"})
    with pytest.raises(RequestError, match=r"one prompt and one negative prompt, each text \(not a list\)"):
        cells(Plot(axis(7, "cat, dog")), {"prompt": ["a cat", "a dog"]})
    with pytest.raises(RequestError, match=r"makes a prompt of 40,003 characters; at most 20,000"):
        cells(Plot(axis(7, "a, " + "b" * 10_000)), {"prompt": "a a a a"})


def test_a_random_seed_is_drawn_once_and_vary_seeds_adds_each_cell_s_offset():
    one = {c.fields["seed"] for c in cells(Plot(axis(4, "10,20"), axis(6, "5,7")), {"prompt": "p", "seed": -1})}
    assert len(one) == 1 and -1 not in one  # (A1111's fix_seed: one seed for the whole plot)
    varied = cells(Plot(axis(4, "10,20,30"), axis(6, "5,7"), vary_seeds=(True, True, False)),
                   {"prompt": "p", "seed": 100})
    assert [c.fields["seed"] for c in varied] == [100, 101, 102, 103, 104, 105]  # + ix + iy * len(xs)
    kept = cells(Plot(axis(4, "10,20"), no_fixed_seeds=True, vary_seeds=(True, False, False)), {"prompt": "p"})
    assert [c.fields["seed"] for c in kept] == [-1, -1]  # (each image draws its own)


def test_cells_that_share_a_compiled_call_are_packed_into_full_calls():
    same_call = cells(Plot(axis(1, "1,2,3,4"), axis(6, "3,5,7,9")), {"prompt": "p"})
    packed = calls(same_call, per_call=4)
    assert [len(c.cells) for c in packed] == [4, 4, 4, 4] and all(c.fields == {} for c in packed)
    by_steps = calls(cells(Plot(axis(4, "10,20,30,40"), axis(6, "3,5,7,9")), {"prompt": "p"}), per_call=4)
    assert [c.fields for c in by_steps] == [{"steps": 10}, {"steps": 20}, {"steps": 30}, {"steps": 40}]
    assert all(len(c.cells) == 4 and {cell.fields["steps"] for cell in c.cells} == set(c.fields.values())
               for c in by_steps)
    mixed = calls(cells(Plot(axis(4, "10,20,30"), axis(1, "1,2"), axis(41, "1024x1024,1152x896")),
                        {"prompt": "p"}), per_call=4)
    assert [(c.fields, [cell.index for cell in c.cells]) for c in mixed] == [
        ({"steps": 10, "size": (1024, 1024)}, [0, 3]), ({"steps": 20, "size": (1024, 1024)}, [1, 4]),
        ({"steps": 30, "size": (1024, 1024)}, [2, 5]), ({"steps": 10, "size": (1152, 896)}, [6, 9]),
        ({"steps": 20, "size": (1152, 896)}, [7, 10]), ({"steps": 30, "size": (1152, 896)}, [8, 11])]
    assert [len(c.cells) for c in calls(same_call, per_call=3)] == [3, 3, 3, 3, 3, 1]


def test_what_a_cell_sets_must_apply_to_the_request():
    with pytest.raises(RequestError, match=r"sets Hires steps, which applies with Hires. fix: give it too"):
        cells(Plot(axis(5, "10")), {"prompt": "p", "hires": False})
    assert cells(Plot(axis(25, "0.5")), {"prompt": "p", "hires": True})[0].fields["hires_strength"] == 0.5
    with pytest.raises(RequestError, match=r"DDIM runs on its own timesteps: choose Schedule type Checkpoint"):
        cells(Plot(axis(9, "Euler, DDIM", csv_mode=True)), {"prompt": "p", "schedule": "Karras"})


def _solid(size, colour=(255, 0, 0)):
    return Image.new("RGB", size, colour)


def _dark(region: Image.Image) -> np.ndarray:
    return np.asarray(region.convert("L")) < 96


@pytest.mark.parametrize("cell", [64, 1024])
def test_the_grid_puts_legible_labels_in_its_margins_only(cell):
    x_labels, y_labels = ["Steps: 10", "Steps: 20"], ["CFG Scale: 3.0", "CFG Scale: 5.0", "CFG Scale: 7.0"]
    nx, ny = (2, 3) if cell == 64 else (2, 1)
    grid, = xyz_grids([_solid((cell, cell)) for _ in range(nx * ny)], x_labels[:nx], y_labels[:ny], [""])
    left, top = cell * 3 // 4, grid.height - ny * cell  # (A1111's: the row labels' band 3/4 of a cell)
    assert grid.width == left + nx * cell and top > 0
    pixels = np.asarray(grid)
    assert (pixels[top:, left:] == (255, 0, 0)).all()  # the images, untouched
    for col in range(nx):  # each column's label above it, within its column
        band = _dark(grid.crop((left + col * cell, 0, left + (col + 1) * cell, top)))
        rows = np.flatnonzero(band.any(axis=1))
        assert rows.size and rows[-1] - rows[0] + 1 >= 0.6 * font_size(cell, cell) >= 0.6 * MIN_FONT_SIZE
    for row in range(ny):
        assert _dark(grid.crop((0, top + row * cell, left, top + (row + 1) * cell))).any()
    assert font_size(64, 64) == MIN_FONT_SIZE and font_size(1024, 1024) == 81  # ((w + h) // 25 above the least)


def test_the_grid_s_size_margins_and_z_axis():
    images = [_solid((64, 64)) for _ in range(6)]
    plain, = xyz_grids(images, ["", ""], ["", "", ""], [""])
    assert plain.size == (128, 192)  # (no labels: no bands)
    spaced, = xyz_grids(images, ["a", "b"], ["c", "d", "e"], [""], margin_size=10)
    assert spaced.width == 48 + 2 * 64 + 10 and (np.asarray(spaced)[-64:, 48 + 64:48 + 74] == 255).all()
    grids = xyz_grids([_solid((64, 64), (0, 0, 255))] * 8, ["1", "2"], ["3", "4"], ["Steps: 9", "Steps: 20"],
                      include_sub_grids=True)
    assert len(grids) == 3 and grids[1].size == grids[2].size  # the plot, then each z value's grid
    assert grids[0].width == 2 * grids[1].width and grids[0].height > grids[1].height  # side by side, titled
    unlabelled, = xyz_grids(images, ["a", "b"], ["c", "d", "e"], [""], draw_legend=False)
    assert unlabelled.size == (128, 192)
    with pytest.raises(ValueError, match="5 images for a plot of 2x3x1 cells"):
        xyz_grids(images[:5], ["a", "b"], ["c", "d", "e"], [""])
