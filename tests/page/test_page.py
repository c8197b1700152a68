"""What the page shows, without a browser: the streamed updates of a request (progress per step,
live previews, the images), size labels, the browser-kept history, the preset menu's match; and
the live previews themselves (cadence, what they show, that they change nothing and compile
nothing)."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdxl_tpu import CompileCounter, Request
from sdxl_tpu.request.fields import MAX_PROMPT_CHARS
from sdxl_tpu.generate.preview import LATENT_RGB_BIAS, LATENT_RGB_FACTORS, approx_rgb
from sdxl_tpu.server.core import Server
from sdxl_tpu.server.events import Done, Progress, Shown, Started
from sdxl_tpu.server.files import ImageStore
from sdxl_tpu.page.history import HISTORY_LENGTH, history_after, history_entry, history_rows
from sdxl_tpu.page.page import CUSTOM, aspect_ratio, matching_preset, size_choices, size_label
from sdxl_tpu.server.settings import SDXL_SIZES, Settings, parse_settings, parse_sizes
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.request.request import preview_cadence as every

SIZES = [(64, 64), (96, 64)]
RUN = dict(prompt="a cat", negative="", style="(No style)", seed=7, guidance=5.0, steps=20, sampler="Euler",
           size="64x64", schedule="Checkpoint", rng="JAX", dynamic_prompts="Random", batch_count=1, refiner=False,
           refiner_switch_at=0.8)


# -- sizes --------------------------------------------------------------------------------------

def test_sdxl_sizes_are_offered_as_aspect_ratios():
    sizes = parse_sizes("sdxl")
    assert [f"{w}x{h}" for w, h in sizes] == list(SDXL_SIZES) and len(sizes) == 9
    assert all(abs(w * h - 1024 * 1024) / (1024 * 1024) < 0.07 and w % 64 == h % 64 == 0 for w, h in sizes)
    labels = dict((value, label) for label, value in size_choices(sizes))
    assert labels["1024x1024"] == "1:1 square · 1024 × 1024"
    assert labels["1536x640"] == "12:5 landscape · 1536 × 640" and labels["640x1536"] == "5:12 portrait · 640 × 1536"
    assert labels["1216x832"] == "≈ 3:2 landscape · 1216 × 832" and labels["832x1216"] == "≈ 2:3 portrait · 832 × 1216"
    assert aspect_ratio((1344, 768)) == "7:4" and size_label((96, 64)) == "3:2 landscape · 96 × 64"
    assert parse_sizes(" SDXL ") == sizes and parse_sizes("64x64,96x64,64x64") == SIZES


# -- the preset menu ----------------------------------------------------------------------------

def test_the_preset_menu_says_custom_once_the_form_matches_no_preset():
    presets = {"Quality": [30, "DPM++ 2M Karras", 5.0], "Balanced": [20, "Euler", 5.0]}
    assert matching_preset(presets, 30, "DPM++ 2M Karras", 5.0) == "Quality"
    assert matching_preset(presets, 20, "Euler", 5) == "Balanced"
    for steps, sampler, guidance in [(21, "Euler", 5.0), (20, "Euler a", 5.0), (20, "Euler", 5.1), (20, "Euler", None)]:
        assert matching_preset(presets, steps, sampler, guidance) == CUSTOM


# -- the history --------------------------------------------------------------------------------

def test_history_keeps_the_newest_runs_first_and_drops_what_is_not_a_run():
    history: list = []
    for i in range(HISTORY_LENGTH + 5):
        history = history_after(history, {**RUN, "seed": i})
    assert len(history) == HISTORY_LENGTH and [e["seed"] for e in history[:3]] == [HISTORY_LENGTH + 4,
                                                                                   HISTORY_LENGTH + 3,
                                                                                   HISTORY_LENGTH + 2]
    again = history_after(history, {**RUN, "seed": HISTORY_LENGTH + 2})  # the same run again moves to the top
    assert [e["seed"] for e in again[:3]] == [HISTORY_LENGTH + 2, HISTORY_LENGTH + 4, HISTORY_LENGTH + 3]
    assert len(again) == HISTORY_LENGTH
    assert history_entry({**RUN, "extra": "x"}) == RUN  # only the fields a restore fills
    for bad in [None, [], "x", {**RUN, "prompt": ""}, {**RUN, "seed": -2}, {**RUN, "seed": True}, {**RUN, "steps": 0},
                {**RUN, "steps": 51}, {**RUN, "guidance": float("nan")}, {**RUN, "guidance": 21},
                {**RUN, "prompt": "x" * (MAX_PROMPT_CHARS + 1)}, {**RUN, "size": 5},
                {k: v for k, v in RUN.items() if k != "sampler"},
                {**RUN, "schedule": "Beta"}, {**RUN, "schedule": None}, {**RUN, "schedule": ["Karras"]},
                {**RUN, "rng": "GPU"}, {**RUN, "rng": 1}, {**RUN, "dynamic_prompts": "random"},
                {**RUN, "batch_count": 0}, {**RUN, "batch_count": 1.5}, {**RUN, "refiner": 1},
                {**RUN, "refiner_switch_at": 1.5}]:
        assert history_entry(bad) is None, bad
        assert history_after([bad, RUN], None) == [RUN]
    rows = history_rows([{**RUN, "negative": "blurry", "style": "Anime"}])
    assert rows == [["", "a cat  —  not: blurry", "seed 7 · 20 steps · CFG 5 · 64x64 · Anime", "Euler"]]
    rows = history_rows([{**RUN, "sampler": "DPM++ 2M", "schedule": "Karras", "rng": "CPU"}])
    assert rows == [["", "a cat", "seed 7 · 20 steps · CFG 5 · 64x64", "DPM++ 2M, Karras schedule · CPU noise"]]
    # (the page shows 60 characters of each: the longest sampler column fits)
    longest = history_rows([{**RUN, "sampler": "DPM++ 2M SDE Karras", "schedule": "SGM Uniform", "rng": "CPU"}])
    assert len(longest[0][3]) <= 60
    # A run kept before the schedule and the noise source were chosen ran on the defaults.
    old = {k: v for k, v in RUN.items() if k not in ("schedule", "rng", "dynamic_prompts", "batch_count", "refiner",
                                                     "refiner_switch_at")}
    assert history_entry(old) == RUN and history_after([old], None) == [RUN]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(history=json_values | st.lists(st.fixed_dictionaries({k: json_values for k in RUN}), max_size=3),
       run=json_values)
def test_history_takes_any_client_value(history, run):
    """The browser's copy comes back with every call and may be anything: nothing raises, and
    whatever is kept is a well-formed run."""
    kept = history_after(history, run)
    assert len(kept) <= HISTORY_LENGTH and all(history_entry(e) == e for e in kept)
    assert len(history_rows(history)) <= HISTORY_LENGTH


# -- live previews ------------------------------------------------------------------------------

def test_preview_cadence_is_about_four_a_run():
    assert [s for s in range(1, 21) if s % every(None, 20) == 0 and s < 20] == [4, 8, 12, 16]
    assert every(None, 30) == 6 and every(None, 4) == 1 and every(None, 1) == 0
    assert every(3, 20) == 3 and every(0, 20) == 0


def test_the_approximation_maps_each_latent_pixel_to_rgb_where_it_is():
    """ComfyUI's SDXL factors, applied per pixel (NHWC: channels last), in [-1, 1] -> [0, 255]."""
    latents = np.zeros((2, 4, 6, 4), np.float32)
    latents[0, :, :3, 0] = 1.0  # channel 0 on the left half of image 0
    latents[1, 1, 2, 3] = -2.0  # one pixel of channel 3 in image 1
    rgb = approx_rgb(latents)
    assert rgb.shape == (2, 4, 6, 3) and rgb.dtype == np.uint8
    expect = lambda v: np.round(np.clip((v + 1) / 2, 0, 1) * 255)
    np.testing.assert_array_equal(rgb[0, :, :3],
                                  np.broadcast_to(expect(LATENT_RGB_FACTORS[0] + LATENT_RGB_BIAS), (4, 3, 3)))
    np.testing.assert_array_equal(rgb[0, :, 3:], np.broadcast_to(expect(LATENT_RGB_BIAS), (4, 3, 3)))
    np.testing.assert_array_equal(rgb[1, 1, 2], expect(-2 * LATENT_RGB_FACTORS[3] + LATENT_RGB_BIAS))
    assert (rgb[1, 0] == expect(LATENT_RGB_BIAS)).all()


def test_previews_come_at_their_steps_change_nothing_and_compile_nothing(tiny_pipeline):
    """Previews every 3 steps of a 10-step run: after steps 3, 6 and 9 (not the last), of the
    images asked for only (not the batch's padding), at latent resolution; the final images are
    the same with and without them; nothing compiles. (That a preview shows the sampler's estimate
    of the clean latents is test_scheduler's: the state's data prediction.)"""
    infos = Request.of("a cat", seed=11, steps=10, size=(96, 64), sampler="Euler a").images(3)
    seen = []
    with CompileCounter() as counter:
        plain = tiny_pipeline.run_images(infos)
        shown = tiny_pipeline.run_images(infos, preview=lambda i, n, images: seen.append((i, n, images)),
                                         preview_every=3)
    assert counter.compiles == 0
    assert [(i, n) for i, n, _ in seen] == [(3, 10), (6, 10), (9, 10)]
    assert all(images.shape == (3, 64 // 8, 96 // 8, 3) and images.dtype == np.uint8 for _, _, images in seen)
    for a, b in zip(plain.images, shown.images):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(seen[0][2], seen[2][2])  # the estimate moves as the steps go
    assert not np.array_equal(seen[2][2][0], seen[2][2][1])  # each image its own


# -- the server's stream ----------------------------------------------------------------------------

@pytest.fixture
def server(tiny_pipeline, tmp_path):
    server = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES), preview_every=2),
                    loader=lambda s: tiny_pipeline, images=ImageStore(tmp_path / "images"))
    server.warmup.load()
    yield server
    server.engine.batcher.close()


def fields(**overrides):
    values = dict(prompt="a cat", negative="", style="(No style)", seed=5, randomize=False, guidance=5.0, steps=6,
                  size="96x64", sampler=None, schedule=None, rng=None)
    return {**values, **overrides}


def test_stream_reports_every_step_then_previews_then_the_images(server):
    from PIL import Image

    with CompileCounter() as counter:
        updates = list(server.stream(fields()))
    assert counter.compiles == 0
    kinds = [type(u) for u in updates]
    assert updates[0] == Started([5, 6, 7, 8], 6, total=6)  # (the page says what runs before the first step)
    assert kinds[1:] == [Progress, Progress, Shown, Progress, Progress, Shown, Progress, Progress, Done]
    assert [u for u in updates if isinstance(u, Progress)] == [Progress(i, 6) for i in range(1, 7)]
    previews = [u.gallery for u in updates if isinstance(u, Shown)]
    assert [[caption for _, caption in p] for p in previews] == [["preview · step 2 / 6"] * 4,
                                                                 ["preview · step 4 / 6"] * 4]
    for path, _ in previews[0]:
        with Image.open(path) as image:
            assert image.format == "JPEG" and image.size == (96 // 8, 64 // 8)
    done = updates[-1]
    gallery, seeds, summary, ran = done.gallery, done.seeds, done.summary, done.ran
    assert (seeds == [5, 6, 7, 8] and ran == {"sampler": "Euler", "schedule": "Checkpoint", "rng": "JAX"}
            and "6 steps of Euler (Schedule type Checkpoint, RNG JAX)" in summary)
    assert [caption for _, caption in gallery] == ["seed 5", "seed 6", "seed 7", "seed 8"]
    assert all(Image.open(path).size == (96, 64) for path, _ in gallery)
    # An API caller that asks for no previews gets the same images, without them.
    quiet = list(server.stream(fields(), previews=False))
    assert not any(isinstance(u, Shown) for u in quiet) and isinstance(quiet[-1], Done)
    for (a, _), (b, _) in zip(gallery, quiet[-1].gallery):
        np.testing.assert_array_equal(np.asarray(Image.open(a)), np.asarray(Image.open(b)))
    assert server.metrics.registry.get_sample_value("sdxl_requests_total", {"route": "page", "outcome": "ok"}) == 2


def test_the_schedule_and_the_noise_source_reach_the_images_and_the_line_that_reports_them(server):
    from PIL import Image

    from sdxl_tpu.a1111.images import read_parameters

    *_, done = server.stream(fields(sampler="Euler a", schedule="Checkpoint", rng="CPU", steps=2), previews=False)
    gallery, info = done.gallery, done.summary
    assert "2 steps of Euler a (Schedule type Checkpoint, RNG CPU)" in info
    texts = [read_parameters(Image.open(path)) for path, _ in gallery]
    assert all("Sampler: Euler a, Schedule type: Checkpoint, " in t and ", RNG: CPU, " in t for t in texts), texts
    # A combination the sampler does not run on is refused before anything runs, saying why.
    from sdxl_tpu.request.errors import RequestError

    with pytest.raises(RequestError, match=r"^DPM\+\+ 2M Karras names its schedule \(Karras\)"):
        list(server.stream(fields(sampler="DPM++ 2M Karras", schedule="Exponential")))
    page = {"route": "page"}
    assert server.metrics.registry.get_sample_value("sdxl_requests_total", {**page, "outcome": "user_error"}) == 1


def test_a_closed_stream_stops_its_request_and_counts_it_cancelled(server):
    """What Stop (or a vanished page) does to the work: the stream is closed while a 50-step
    request runs; the request stops within two steps and the next one starts at once."""
    steps_run = []
    stream = server.stream(fields(steps=50, size="64x64"))
    for update in stream:
        if update == Progress(3, 50):
            break
    server.engine.batcher.enqueue(Request.of("x", seed=1, steps=1, size=(64, 64)).images(4),
                           progress=lambda i, n: steps_run.append(i))
    stream.close()
    deadline = threading.Event()
    for _ in range(200):  # bounded: 10 s
        if steps_run:
            break
        deadline.wait(0.05)
    assert steps_run == [1], "the next request did not start"
    cancelled = server.metrics.registry.get_sample_value("sdxl_requests_total",
                                                         {"route": "page", "outcome": "cancelled"})
    assert cancelled == 1


def test_stream_refuses_a_size_still_compiling_with_its_own_message(tiny_pipeline, tmp_path, monkeypatch):
    """Ready with the first size; a request for one still compiling is refused, saying so, until
    it is compiled in the background; then it runs without compiling."""
    from sdxl_tpu.request.errors import RequestError

    monkeypatch.setitem(tiny_pipeline._compiled.by_size, (96, 64), None)  # restored afterwards
    del tiny_pipeline._compiled.by_size[(96, 64)]  # as if not compiled yet (it comes back from the compile cache)
    gate, warmup = threading.Event(), tiny_pipeline.warmup
    monkeypatch.setattr(tiny_pipeline, "warmup", lambda sizes=None: (gate.wait(60), warmup(sizes))[1])
    server = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES)), loader=lambda s: tiny_pipeline,
                    images=ImageStore(tmp_path / "images"))
    server.warmup.load()
    assert server.ready and server.warmup.compiling == [(96, 64)]
    assert server.warmup.ready_sizes == [(64, 64), (96, 96)]  # (the pipeline's sizes: 96x96 compiled too)
    assert "1 more size compiling (96x64)" in server.warmup.status_line
    assert server.warmup.readiness() == ({"status": "ready", "message": server.warmup.status_line,
                                         "compiling": ["96x64"], "unfinished": ["96x64"]}, 200)
    with pytest.raises(RequestError, match=r"Size 96x64 is still being compiled; it will be available in a moment "
                                           r"\(the sizes ready now: 64x64, 96x96\)"):
        list(server.stream(fields(size="96x64", steps=1)))
    gate.set()
    assert server.warmup.compiled_event.wait(120)
    assert server.warmup.compiling == [] and server.warmup.status_line == server.warmup.message
    with CompileCounter() as counter:
        assert isinstance(list(server.stream(fields(size="96x64", steps=1)))[-1], Done)
    assert counter.compiles == 0
    server.engine.batcher.close()


def test_preview_files_are_small_jpegs():
    from PIL import Image

    from sdxl_tpu.a1111.images import encode_preview

    pixels = (np.arange(32 * 48 * 3) % 256).astype(np.uint8).reshape(32, 48, 3)
    blob = encode_preview(pixels)
    with Image.open(io.BytesIO(blob)) as image:
        assert image.format == "JPEG" and image.size == (48, 32) and "exif" not in image.info
    assert len(blob) < 8000


def test_taesd_previews_are_decoded_on_the_device_at_preview_size(tiny_checkpoint, tiny_pipeline, compile_cache,
                                                                  tmp_path):
    """With a TAESD checkpoint (--preview DIR), previews come from its decoder, compiled with the
    other programs (nothing compiles per call), at twice the latent resolution, images unchanged."""
    from sdxl_tpu import load_pipeline
    from sdxl_tpu.weights.tiny import write_tiny_taesd

    pipe = load_pipeline(tiny_checkpoint, dtype="float32", sizes=[(64, 64)], preview=str(write_tiny_taesd(tmp_path)),
                         compile_cache=compile_cache)  # the programs but the preview are the fixture's
    assert pipe.preview_decoder == "taesd" and "preview" in pipe.compiled((64, 64))
    infos = Request.of("a cat", seed=3, steps=8, size=(64, 64)).images(4)
    seen = []
    with CompileCounter() as counter:
        result = pipe.run_images(infos, preview=lambda i, n, images: seen.append((i, images)), preview_every=2)
        approx = []
        plain = tiny_pipeline.run_images(infos, preview=lambda i, n, images: approx.append(images), preview_every=2)
    assert counter.compiles == 0
    # Handed over once ready, at a later step: never after the last, at most one in flight.
    assert 1 <= len(seen) <= 3 and all(i in (2, 4, 6) for i, _ in seen) and len(approx) == 3
    assert all(images.shape == (4, 16, 16, 3) and images.dtype == np.uint8 for _, images in seen)
    assert approx[0].shape == (4, 8, 8, 3)  # the approximation: latent resolution
    for a, b in zip(result.images, plain.images):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_preview_and_size_options_parse_or_say_what_is_wrong(capsys):
    parse = lambda *argv, **env: parse_settings(list(argv), env={k.upper(): v for k, v in env.items()})
    assert parse().preview_every is None and parse().load.preview == "approx"
    assert parse("--preview-every", "3").preview_every == 3 and parse(sdxl_preview_every="0").preview_every == 0
    assert parse("--preview", "taesd").load.preview == "taesd"
    assert list(parse("--sizes", "sdxl").load.sizes) == parse_sizes("sdxl")
    for argv in (["--preview-every", "often"], ["--preview-every", "-1"]):
        with pytest.raises(SystemExit):
            parse(*argv)
        assert "must be 'auto' or a whole number of steps" in capsys.readouterr().err


def test_the_run_panel_says_the_state_in_words_escaped():
    from sdxl_tpu.page.page import run_panel, running_text, seed_note, stopped_summary

    assert run_panel("refused", "Style '<img src=x>' & more") == (
        '<div class="run-panel" data-state="refused"><span class="run-text">Style &#x27;&lt;img src=x&gt;&#x27; '
        '&amp; more</span></div>')
    assert '<progress max="20" value="7"' in run_panel("running", "x", 7, 20)
    assert running_text(1, 20, 0.5) == "Generating · step 1 of 20 · 0.5 s"  # (no estimate from the first step)
    assert running_text(5, 20, 2.0) == "Generating · step 5 of 20 · 2.0 s · about 6 s left"
    assert running_text(20, 20, 8.0) == "Generating · step 20 of 20 · 8.0 s"
    assert stopped_summary([7, 8, 9, 10], 50, 12) == ("Stopped at step 12 of 50. The images are its last previews. "
                                                      "Seeds: 7, 8, 9, 10.")
    assert stopped_summary([7, 8], 50, 0) == "Stopped before the first step. Seeds: 7, 8."
    assert stopped_summary(None, None, None) == "Stopped before it started: nothing was made."
    assert seed_note(5) == seed_note(5.0) == "Seed 5 is fixed: each run makes the same images. 🎲 for random seeds."
    for random_or_not_a_seed in (-1, 5.5, float("nan"), float("inf"), True, None, "5", 2**40, [5]):
        assert seed_note(random_or_not_a_seed) == ""
    # Beside another note (what the prompt box's parameters filled): kept; a stale seed line replaced.
    filled = "Filled: prompt, seed, steps."
    assert seed_note(-1, filled) == filled
    assert seed_note(7, f"{filled}  \n{seed_note(5)}") == f"{filled}  \n{seed_note(7)}"
    assert seed_note(-1, seed_note(5)) == "" and seed_note(5, ["not text"]) == seed_note(5)


def test_the_sampler_menu_names_each_sampler_once_and_only_the_schedules_it_runs_on():
    from sdxl_tpu.page.sampler_menu import (CHECKPOINT_KARRAS, fitted_schedule, menu_pair, menu_samplers,
                                              request_pair, schedule_menu)
    from sdxl_tpu.request.names import SAMPLERS, SCHEDULES, resolve_schedule

    assert menu_samplers(SAMPLERS) == ["Euler", "Euler a", "DPM++ 2M", "DPM++ 2M SDE", "DPM++ SDE", "DDIM", "LCM"]
    assert [v for _, v in schedule_menu("DDIM", SAMPLERS, SCHEDULES)] == ["Checkpoint", "Automatic"]
    assert [v for _, v in schedule_menu("DPM++ 2M", SAMPLERS, SCHEDULES)] == [
        "Checkpoint", CHECKPOINT_KARRAS, "Automatic", "Uniform", "Karras", "Exponential", "SGM Uniform"]
    assert CHECKPOINT_KARRAS not in [v for _, v in schedule_menu("Euler", SAMPLERS, SCHEDULES)]
    assert fitted_schedule("LCM", "Karras", SAMPLERS, SCHEDULES)[1] == "Checkpoint"
    assert fitted_schedule("Euler a", "Karras", SAMPLERS, SCHEDULES)[1] == "Karras"
    # Every pair the menus offer is a request that runs, and goes back to the same menus.
    for sampler in menu_samplers(SAMPLERS):
        for _, schedule in schedule_menu(sampler, SAMPLERS, SCHEDULES):
            named = request_pair(sampler, schedule)
            resolve_schedule(*named)  # (raises for a pair that does not run)
            assert menu_pair(*named) == (sampler, schedule)
    assert request_pair("DPM++ 2M", CHECKPOINT_KARRAS) == ("DPM++ 2M Karras", "Checkpoint")
    assert menu_pair("DPM++ 2M Karras", "Automatic") == ("DPM++ 2M", "Karras")  # (k-diffusion's Karras either way)
    assert request_pair(None, CHECKPOINT_KARRAS) == (None, CHECKPOINT_KARRAS)  # (refused by the request's check)


def test_a_kept_last_run_comes_back_only_with_files_the_store_wrote_and_still_keeps(tmp_path):
    from sdxl_tpu.server.files import ImageStore
    from sdxl_tpu.page.history import last_run, restored_run

    store = ImageStore(tmp_path / "store", keep_seconds=3600, max_bytes=10_000)
    paths = store.write([b"a" * 4000, b"b" * 4000], [7, 8], "png")
    kept = last_run([(p, f"seed {s}") for p, s in zip(paths, (7, 8))], [7, 8], "Generated 2 images")
    assert restored_run(kept, store.holds) == ([(paths[0], "seed 7"), (paths[1], "seed 8")], [7, 8],
                                               "Generated 2 images")
    (tmp_path / "store" / "other.png").write_bytes(b"x")  # in the store's folder, not written by it
    for forged in ([[str(tmp_path / "store" / "other.png"), "x"]], [["/etc/passwd", "x"]],
                   [[paths[0] + "/../" + paths[0].rsplit("/", 1)[1], "x"]], [[paths[0], 1]], [], "x", None):
        assert restored_run({**kept, "images": forged}, store.holds) is None, forged
    for broken in (None, [], "x", {**kept, "seeds": ["7"]}, {**kept, "summary": None}, {"images": kept["images"]}):
        assert restored_run(broken, store.holds) is None, broken
    store.write([b"c" * 4000, b"d" * 4000], [9, 10], "png")  # over max_bytes: the first call's files go
    assert not store.holds(paths) and restored_run(kept, store.holds) is None


def test_history_rows_show_a_thumbnail_only_if_it_is_a_small_jpeg_data_url(tmp_path):
    from PIL import Image

    from sdxl_tpu.page.history import MAX_THUMBNAIL_CHARS, thumbnail

    Image.new("RGB", (96, 64), (200, 30, 30)).save(tmp_path / "run.png")
    thumb = thumbnail(str(tmp_path / "run.png"))
    assert thumb.startswith("data:image/jpeg;base64,") and len(thumb) < 4000
    assert thumbnail(str(tmp_path / "missing.png")) is None
    (row,) = history_rows([{**RUN, "thumb": thumb}])
    assert row[0] == (f'<img src="{thumb}" alt="seed 7" width="64" height="64" style="object-fit: contain">')
    for forged in ['" onerror="alert(1)', "javascript:alert(1)", "data:image/svg+xml;base64,PHN2Zz4=",
                   'data:image/jpeg;base64,AAAA" onload="x', "data:image/jpeg;base64," + "A" * MAX_THUMBNAIL_CHARS,
                   5, None, ["x"]]:
        assert "thumb" not in history_entry({**RUN, "thumb": forged}), forged  # (the run itself is kept)
        assert history_rows([{**RUN, "thumb": forged}])[0][0] == ""
