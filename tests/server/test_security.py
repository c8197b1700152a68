"""The public surface, attacked as a stranger would attack a public Space: crafted file-read
requests, then a fuzz run of malformed inputs through gradio_client and raw HTTP against
`python app.py --model tiny` (the server shared with test_app.py; see served_app.py).

Pass: no file outside Gradio's cache is read, copied or served; every malformed request gets a
4xx (or, through the queue, an error event) whose message names the problem, never a 5xx, a
traceback or a Python repr; at most two log lines per rejected input; the server stays up."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from images import hostile_files
from upscaler_files import GENERAL
from raw_http import OWN_SOURCE, AppLog, Http, refusal
from served_app import ROOT, SIZES, get
from sdxl_tpu.routes.guard import MAX_BODY_BYTES
from sdxl_tpu.page.page import PASTED_INTO
from sdxl_tpu.request.fields import FEWEST_INPUTS, FIELD, FORM, MAX_PROMPT_CHARS
from sdxl_tpu.imaging.hires import UPSCALERS
from sdxl_tpu.imaging.mask import INPAINT_AREAS, MASKED_CONTENT
from sdxl_tpu.request.names import PROMPT_MODES, RESIZE_MODES, RNGS, SAMPLERS, SCHEDULES, resolve_schedule

# A valid call (1 step), from noise: no image (its strength and resize mode are checked, not used),
# no mask (its blur and masked content likewise).
GENERATE = ["a cat", "", "(No style)", 1, False, 5.0, 1, "64x64", "Euler", "Checkpoint", "JAX", None, 0.75,
            "Just resize", None, 4, "original", False, 2.0, "Latent", 0, 0.7, "Whole picture", 32,
            None, None, "none", 1.0, 0.0, 1.0, 100, 200, "Random", 1, False, 0.8]
RUN = {"prompt": "a cat", "negative": "", "style": "(No style)", "seed": 1, "guidance": 5.0, "steps": 1,
       "sampler": "Euler", "size": "64x64", "schedule": "Checkpoint", "rng": "JAX"}  # a run as the history keeps it
# The page's own generation event takes the history the browser keeps, then the Script menu and
# its X/Y/Z plot panel (page_xyz.PANEL: no script, three axes of Nothing, the two switches).
PLOT_PANEL = ["None", "Nothing", "", "Nothing", "", "Nothing", "", True, False]
CALLS = {"generate": GENERATE, "generate_in_page": GENERATE + [[RUN]] + PLOT_PANEL}
HISTORY = len(GENERATE)  # (its position)
FIELDS = list(FORM)  # the form's fields, in the order /generate takes them


def _png_html() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(out, "PNG")
    return out.getvalue() + b"<html><script>alert(document.domain)</script></html>"


PNG_HTML = _png_html()  # a polyglot: a valid PNG with a page after it


# ---------------------------------------------------------------------------------------------
# Raw HTTP: http.client sends the path exactly as given (no normalisation of '..' or '%2e')
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def http_client(app_server):
    return Http(app_server)


@pytest.fixture(scope="module")
def fn_index(app_server):
    config = json.loads(get(app_server["url"] + "/config")[1])
    return {dep["api_name"]: dep["id"] for dep in config["dependencies"] if dep.get("backend_fn")}


def _file_data(path: str) -> dict:
    return {"path": path, "url": None, "orig_name": None, "meta": {"_type": "gradio.FileData"}}


def _cached_files_containing(cache_dir: Path, needles: list[str]) -> list[Path]:
    found = []
    for path in cache_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            content = path.read_bytes()
            if any(n.encode() in content for n in needles):
                found.append(path)
    return found


# ---------------------------------------------------------------------------------------------
# The crafted request of the report: a file-data object in place of a text or a number
# ---------------------------------------------------------------------------------------------

def test_file_data_inputs_never_read_a_file(app_server, http_client, fn_index):
    secret_file = app_server["secret_file"]
    cache_dir = app_server["cache_dir"]
    planted = cache_dir / "planted"  # a symlink inside the cache dir, as if something had put it there
    planted.mkdir(parents=True, exist_ok=True)
    link = planted / "image.png"
    link.unlink(missing_ok=True)
    link.symlink_to(secret_file)
    relative = os.path.relpath(secret_file, ROOT)
    paths = ["/etc/passwd", "/proc/self/environ", str(ROOT / "app.py"), "app.py", str(secret_file), relative,
             f"{cache_dir}/../{secret_file.parent.name}/{secret_file.name}", "../" * 12 + "etc/passwd", str(link),
             f"file://{secret_file}", "/proc/self/cwd/app.py"]
    for path in paths:
        for position in (0, 3, 7):  # prompt (text), seed (number), size (dropdown)
            data = list(GENERATE)
            data[position] = _file_data(path)
            status, detail = http_client.join(data, fn_index["generate"])
            assert status == 422 and detail == f"input {position + 1} is a file object; only an image input takes one."
        status, detail = http_client.join([_file_data(path), "(No style)"], fn_index["token_count"])
        assert status == 422 and "file object" in detail
        status, detail = http_client.join(GENERATE + [[{"prompt": _file_data(path)}]] + PLOT_PANEL,
                                          fn_index["generate_in_page"])
        assert status == 422 and detail == f"input {HISTORY + 1} is a file object; only an image input takes one."
        # The inpaint editor's value: its images are uploads too, in the shape the editor sends.
        painter = fn_index["mask_painted"]
        for value, said in (({"background": None, "layers": [_file_data(path)], "composite": None},
                             "must be null or a file uploaded"),
                            ({"background": _file_data(path), "layers": [], "composite": None, "script": "x"},
                             "must be null or an image editor's value"),
                            ({"background": None, "layers": [_file_data(path)] * 50}, "an image editor's value"),
                            ({"background": None, "layers": {"path": path}}, "an image editor's value")):
            status, detail = http_client.join([value], painter)
            assert status == 422 and said in detail, (value, detail)
        status, detail = http_client.join(GENERATE[:9] + [_file_data(path)] + GENERATE[10:], fn_index["generate"])
        assert status == 422 and detail == "input 10 is a file object; only an image input takes one."
        # The image input takes a file object: only that of an upload (or of the app's own images).
        image = FIELDS.index("image")
        status, detail = http_client.join(GENERATE[:image] + [_file_data(path)] + GENERATE[image + 1:],
                                          fn_index["generate"])
        assert status == 422 and detail.startswith(f"Image (input {image + 1}) must be null or a file uploaded"), detail
        status, detail = http_client.join([_file_data(path), "Lanczos", 2], fn_index["extras_upscale"])  # (Extras')
        assert status == 422 and detail.startswith("Source image (input 1) must be null or a file uploaded"), detail
        # ... and asked for directly, by every spelling of the path
        for spelled in (path, path.replace("/", "%2F"), path.replace(".", "%2e")):
            status, _ = http_client.request("GET", f"/gradio_api/file={spelled}")
            assert status in (403, 404), spelled
    assert _cached_files_containing(cache_dir, [app_server["secret"], OWN_SOURCE, "root:x:0:0"]) == []
    # The images the app wrote are still served.
    status, message = http_client.join(GENERATE, fn_index["generate"])
    assert message["success"], message
    image = message["output"]["data"][0][0]["image"]["path"]
    status, content = http_client.request("GET", f"/gradio_api/file={image}")
    assert status == 200 and content.startswith(b"\xff\xd8\xff")  # a JPEG, as the app writes them
    link.unlink()


def test_gradio_own_upload_check_is_in_force_behind_the_guard(tmp_path, monkeypatch):
    """Without the guard in front, Gradio itself refuses a file it did not receive as an upload:
    the mounted Blocks count as launched. Shown to fail without mark_launched."""
    import gradio.processing_utils as pu
    import gradio.utils as gu
    from gradio.context import LocalContext

    import app as app_module
    from sdxl_tpu.routes.internals import mark_launched
    from sdxl_tpu.server.core import Server
    from sdxl_tpu.server.settings import Settings
    from sdxl_tpu.request.load import LoadOptions

    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "cache"))
    demo = app_module.build_demo(Server(Settings(load=LoadOptions(model="tiny", sizes=[(64, 64)]))))
    prompt = demo.fns[next(i for i, f in demo.fns.items() if f.api_name == "generate")].inputs[0]

    def move(blocks):
        token = LocalContext.blocks.set(blocks)
        try:
            return pu.move_files_to_cache(_file_data(str(secret)), prompt, check_in_upload_folder=True)
        finally:
            LocalContext.blocks.reset(token)

    copied = move(demo)  # mounted, not marked: Gradio copies the file (the hole of the report)
    assert Path(copied["path"]).read_text() == "secret" and Path(copied["path"]).is_relative_to(gu.get_upload_folder())
    mark_launched(demo)
    with pytest.raises(pu.InvalidPathError, match="it was not uploaded by a user"):
        move(demo)


# ---------------------------------------------------------------------------------------------
# Fuzz: malformed inputs through gradio_client and raw HTTP, >= 1,000 in all
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def app_log(app_server):
    return AppLog(app_server)


text = st.text(st.characters(codec="utf-8"), max_size=30)
not_text = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                     st.lists(text, max_size=3), st.dictionaries(text, text, max_size=2))
control = st.text(st.characters(categories=["Cc", "Cf", "Zs"]), min_size=1, max_size=20)
huge_text = st.integers(MAX_PROMPT_CHARS + 1, 100_000).map(lambda n: "x" * n)
# A1111's emphasis with a weight out of range, in among bracket soup (refused by name, not NaN images).
absurd_weight = st.tuples(st.text(st.sampled_from("()[]:\\ ,aBREAK"), max_size=20),
                          st.one_of(st.floats(1e4, 1e300), st.floats(-1e300, -1e4)),  # (past [[...]] too)
                          st.text(st.sampled_from("()[]:\\ ,b"), max_size=20)).map(
    lambda t: f"{t[0]} (cat:{t[1]:.6g}) {t[2]}".replace("e+", "e"))
bad_number = st.one_of(st.booleans(), text, st.lists(st.integers(), max_size=2),
                       st.dictionaries(text, text, max_size=1), st.integers(max_value=-1), st.integers(min_value=2**32),
                       st.floats(-1e300, -1e-9), st.floats(1e12, 1e300))
# Dynamic prompts a server must refuse (sd-dynamic-prompts' syntax, read by default): unclosed,
# nested past the bound, too many picks or combinations, a wildcard it lacks or a path for one.
hostile_template = st.one_of(
    st.text(st.sampled_from("ab |$"), max_size=12).map(lambda t: "{" + t),
    st.integers(13, 200).map(lambda n: "{" * n + "x" + "}" * n),
    st.integers(101, 10**6).map(lambda n: f"{{{n}$$a|b}}"),
    st.sampled_from(["__nope__", "a __../color__", "__/etc/passwd__", "{__color__|__missing/x__}", "__animals/dog__",
                     "{3-1$$a|b}", "{x$$a|b}"]))
# One field made malformed per case, so no case is a valid request (none runs the model).
MALFORMED = {
    "prompt": st.one_of(not_text.filter(lambda v: v is not None), control, huge_text, absurd_weight, hostile_template),
    "negative": st.one_of(not_text.filter(lambda v: v is not None), huge_text, absurd_weight, hostile_template),
    # (null, for any field but the prompt: its default, as Gradio's JavaScript client leaves it out)
    "style": st.one_of(not_text.filter(lambda v: v is not None), text.filter(lambda s: s != "(No style)")),
    "seed": st.one_of(bad_number.filter(lambda v: v != -1), st.floats(0.01, 0.99)),
    "randomize": st.one_of(st.integers(), text, st.lists(st.booleans(), max_size=2)),
    "guidance": st.one_of(bad_number.filter(lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 0),
                          st.floats(20.001, 1e6)),
    "steps": st.one_of(bad_number, st.floats(1.01, 49.99).filter(lambda v: v != int(v)), st.integers(51, 10**6),
                       st.just(0)),
    "size": st.one_of(not_text.filter(lambda v: v is not None),
                      text.filter(lambda s: s.strip() not in SIZES.split(","))),
    "sampler": st.one_of(not_text.filter(lambda v: v is not None), text.filter(lambda s: s not in SAMPLERS)),
    "schedule": st.one_of(not_text.filter(lambda v: v is not None), text.filter(lambda s: s not in SCHEDULES),
                          st.sampled_from([s.lower() for s in SCHEDULES] + ["sgm_uniform", "normal", "Beta"])),
    "rng": st.one_of(not_text.filter(lambda v: v is not None), text.filter(lambda s: s not in RNGS),
                     st.sampled_from(["cpu", "GPU", "NV", "jax"])),
    # (checked with or without an image; the image itself is refused at the envelope unless it is an
    # upload's file object, which gradio_client cannot send malformed: fuzzed raw below)
    "strength": st.one_of(bad_number.filter(lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 0),
                          st.floats(1.001, 1e6), st.floats(-1e6, -0.001)),
    "resize_mode": st.one_of(not_text.filter(lambda v: v is not None), text.filter(lambda s: s not in RESIZE_MODES),
                             st.sampled_from(["just resize", "Fit", "Stretch", "crop"])),
    "mask_blur": st.one_of(bad_number, st.floats(0.01, 63.99).filter(lambda v: v != int(v)), st.integers(65, 10**6),
                           st.integers(-10**6, -1)),
    "hires": st.one_of(bad_number.filter(lambda v: not isinstance(v, bool)), text, st.lists(st.booleans())),
    "hires_scale": st.one_of(bad_number, st.floats(4.001, 1e6), st.floats(-1e6, 0.999)),
    "hires_upscaler": st.one_of(not_text.filter(lambda v: v is not None), text.filter(lambda s: s not in UPSCALERS),
                                st.sampled_from(["latent", "ESRGAN_4x", "R-ESRGAN 4x+", "Nearest"])),
    "hires_steps": st.one_of(bad_number, st.floats(0.01, 49.99).filter(lambda v: v != int(v)), st.integers(51, 10**6),
                             st.integers(-10**6, -1)),
    "hires_strength": st.one_of(bad_number.filter(lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 0),
                                st.floats(1.001, 1e6), st.floats(-1e6, -0.001)),
    "masked_content": st.one_of(not_text.filter(lambda v: v is not None),
                                text.filter(lambda s: s not in MASKED_CONTENT),
                                st.sampled_from(["Fill", "latent_noise", "noise", "nothing"])),
    "inpaint_area": st.one_of(not_text.filter(lambda v: v is not None), text.filter(lambda s: s not in INPAINT_AREAS),
                              st.sampled_from(["only masked", "Whole", "inpaint_full_res"])),
    "mask_padding": st.one_of(bad_number, st.floats(0.01, 255.99).filter(lambda v: v != int(v)),
                              st.integers(257, 10**6)),
    # The page's ControlNet unit (the app loads one ControlNet, "edges")
    "control_model": st.one_of(not_text.filter(lambda v: v is not None), text.filter(lambda s: s != "edges")),
    "control_module": st.one_of(not_text.filter(lambda v: v is not None),
                                text.filter(lambda s: s not in ("none", "canny", "invert")),
                                st.sampled_from(["Canny", "openpose", "depth_midas",
                                                 "invert (from white bg & black line)"])),
    "control_weight": st.one_of(bad_number.filter(lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 0),
                                st.floats(2.001, 1e6), st.floats(-1e6, -0.001)),
    **{name: st.one_of(bad_number.filter(lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 0),
                       st.floats(1.001, 1e6), st.floats(-1e6, -0.001)) for name in ("control_start", "control_end")},
    **{name: st.one_of(bad_number, st.floats(1.01, 254.99).filter(lambda v: v != int(v)), st.integers(256, 10**6),
                       st.integers(-10**6, 0)) for name in ("control_low", "control_high")},
    "dynamic_prompts": st.one_of(not_text.filter(lambda v: v is not None),
                                 text.filter(lambda s: s not in PROMPT_MODES),
                                 st.sampled_from(["random", "On", "combinatorial", "Wildcards"])),
    "batch_count": st.one_of(bad_number, st.floats(1.01, 31.99).filter(lambda v: v != int(v)), st.integers(33, 10**9),
                             st.integers(-10**6, 0)),
    "refiner": st.one_of(bad_number.filter(lambda v: not isinstance(v, bool)), text, st.lists(st.booleans())),
    "refiner_switch_at": st.one_of(bad_number.filter(lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 0),
                                   st.floats(1.001, 1e6), st.floats(-1e6, -0.001)),
}


def _refused(sampler: str, schedule: str) -> bool:
    try:
        resolve_schedule(sampler, schedule)
    except ValueError:
        return True
    return False


def test_every_field_is_fuzzed():
    """A new field joins the fuzzing (the image and the mask: raw, below, as uploads)."""
    assert set(MALFORMED) == set(FIELDS) - {"image", "mask", "control_image"}, set(FIELDS) ^ set(MALFORMED)


# A sampler and a Schedule type, each valid, together not (DDIM on Karras): both set.
REFUSED_PAIRS = [(sampler, schedule) for sampler in SAMPLERS for schedule in SCHEDULES if _refused(sampler, schedule)]
PAIR = "sampler+schedule"
CASES = st.one_of(st.sampled_from([f for f in FIELDS if f in MALFORMED]).flatmap(
                      lambda f: st.tuples(st.just(f), MALFORMED[f])),
                  st.tuples(st.just(PAIR), st.sampled_from(REFUSED_PAIRS)))


@pytest.fixture(scope="module")
def fuzz_client(app_server):
    from gradio_client import Client

    return Client(app_server["url"] + "/", verbose=False)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=CASES)
def test_fuzz_gradio_client(fuzz_client, http_client, case):
    field, value = case
    log = AppLog(http_client.app)
    _predict_refused(fuzz_client, http_client, log, field, value)
    log.assert_quiet()


def _predict_refused(fuzz_client, http_client, log: AppLog, field: str, value) -> None:
    """/generate through gradio_client with `field` malformed: an error event naming the field."""
    from gradio_client.exceptions import AppError

    args = list(GENERATE)
    if field == PAIR:
        args[FIELDS.index("sampler")], args[FIELDS.index("schedule")] = value
    else:
        args[FIELDS.index(field)] = value
    log.inputs += 1
    with pytest.raises(AppError) as info:
        fuzz_client.predict(*args, api_name="/generate")
    message = str(info.value)
    assert message and "Traceback" not in message and " object at 0x" not in message, message
    assert names_the_field(message, field, value), (field, value, message)
    http_client.check("PREDICT", field, 200, message.encode())


def names_the_field(message: str, field: str, value) -> bool:
    """Whether a refusal names the field that carried the bad value by its label, as the page shows
    it (case and all: "Prompt" is not in "Negative prompt ..."); a sampler and a Schedule type refused
    together: both, the sampler by its name."""
    if field == PAIR:
        return "Schedule type" in message and value[0] in message
    return FIELD[field].label in message


def test_the_field_check_sees_a_wrong_message():
    """(The fuzz tests' check can fail: a message about another field, or about none, does not pass.)"""
    assert names_the_field("Negative prompt must be text, got a list.", "negative", ["a"])
    assert not names_the_field("Negative prompt must be text, got a list.", "prompt", ["a"])
    assert not names_the_field("Steps must be a whole number between 1 and 50.", "seed", -1)
    assert not names_the_field("Something went wrong on the server; it has been logged.", "steps", 0)
    assert names_the_field("DDIM runs on its own timesteps: choose Schedule type Checkpoint or Automatic, not Karras.",
                           PAIR, ("DDIM", "Karras"))


# Values gradio_client cannot send (not JSON-compliant or not UTF-8) go as raw JSON text.
RAW_VALUES = ["NaN", "Infinity", "-Infinity", "1e999", '"\\ud800"', '"a\\udfffb"', '"\\u0000\\u0007"',
              '{"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}', '{"path": "/etc/passwd"}',
              '{"url": "http://127.0.0.1:1/x"}', "[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]", "1" + "0" * 400,
              "true", "false", "null", "[]", "{}", '"' + "y" * 100_000 + '"']
# (position, value) pairs among those that make a valid call: no negative prompt, randomize on or off,
# the default sampler, schedule and noise source.
STILL_VALID = {(1, '"\\u0000\\u0007"'), (4, "true"), (4, "false"), *((i, "null") for i in range(1, 11)),
               (11, "null"), (12, "null"), (13, "null"), (14, "null"), (15, "null"),
               (16, "null"), (17, "null"), (17, "false"), (18, "null"), (19, "null"), (20, "null"),
               (21, "null"), (22, "null"), (23, "null"), *((i, "null") for i in range(24, 34)),
               *((i, "null") for i in range(HISTORY + 1, HISTORY + 10)),
               *((HISTORY + i, '"\\u0000\\u0007"') for i in (3, 5, 7)),
               *((HISTORY + i, v) for i in (8, 9) for v in ("true", "false")),
               *((FIELDS.index("refiner"), v) for v in ("null", "true", "false")),  # (this app has a refiner)
               (FIELDS.index("refiner_switch_at"), "null")}
# (null but for the prompt: the default; no image: no strength and resize mode needed; no mask: no
# blur, content, area or padding; no hires; no ControlNet image: the unit's fields their defaults;
# no script: its panel's defaults, any text for an axis of Nothing's values, either switch; the
# refiner on or off, where it takes over left to its default)


def _join_raw(http_client, log: AppLog, fn: int, values: list[str], position: int, raw: str,
              session: str | None = None) -> tuple[int, str, str]:
    """queue/join with input `position` replaced by the raw JSON text `raw` (the others as given,
    JSON text too), in `session` (default: a new one): (status, body, session)."""
    values = list(values)
    values[position] = raw
    session = session or uuid.uuid4().hex
    body = ('{"data": [%s], "fn_index": %d, "session_hash": "%s"}' % (", ".join(values), fn, session)).encode()
    log.inputs += 1
    status, text = http_client.request("POST", "/gradio_api/queue/join", body)
    return status, text, session


@pytest.mark.parametrize("endpoint", CALLS)  # the API's event and the page's
def test_fuzz_raw_values_through_the_queue(app_server, http_client, fn_index, app_log, endpoint):
    # All in one session, as a page sends its calls: each refusal leaves the next call as it found it.
    # (A new session for each would add Gradio's 11 ms of making one to each of some 1,800 calls; the
    # sessions a client may make are bounded in test_playground.)
    session = uuid.uuid4().hex
    for position in range(len(CALLS[endpoint])):
        for raw in RAW_VALUES:
            _raw_value_refused(http_client, app_log, fn_index, endpoint, position, raw, session)
    if endpoint == "generate":
        _light_handlers_answer_raw_values(http_client, app_log, fn_index)
        _kept_run_names_no_file_it_did_not_write(http_client, app_log, fn_index, app_server["cache_dir"])
    app_log.assert_quiet()


PAGE_PANEL = 4  # the run panel's place among the page event's outputs (app.py: `shown`)


def _raw_value_refused(http_client, log: AppLog, fn_index, endpoint: str, position: int, raw: str,
                       session: str | None = None) -> None:
    """`endpoint` through the queue in `session` (default: a new one) with input `position` the raw JSON text `raw`:
    refused at the envelope (4xx) or by the handler (an error event, or the page's warning line)."""
    call = CALLS[endpoint]
    status, text, session = _join_raw(http_client, log, fn_index[endpoint], [json.dumps(v) for v in call], position,
                                      raw, session)
    if status == 200:  # a value the envelope allows: the handler refuses it through the queue
        message = http_client.completion(session, json.loads(text)["event_id"])
        # (a malformed history is dropped, not refused)
        if (position, raw) in STILL_VALID or position == HISTORY:
            assert message["success"] is True, message
        elif endpoint == "generate":
            assert message["success"] is False and message.get("output", {}).get("error"), (position, raw, message)
        else:  # the page's event shows the refusal in its run panel instead of failing
            panel = message["output"]["data"][PAGE_PANEL]
            assert message["success"] is True and 'data-state="refused"' in panel and "⚠️ " in panel, (
                position, raw, message)
    else:
        assert status in (413, 422) and refusal(text), text


def _kept_run_names_no_file_it_did_not_write(http_client, log: AppLog, fn_index, cache_dir: Path) -> None:
    """The last run the browser keeps is the client's to forge: files outside the store (or in the
    cache but not written by it) are not shown, so nothing is served from them."""
    planted = cache_dir / "planted-by-another.png"
    planted.write_bytes(b"\x89PNG planted")
    for path in ("/etc/passwd", str(planted), str(cache_dir / ".." / "secret.txt"), "../../etc/passwd"):
        kept = json.dumps({"images": [[path, "seed 1"]], "seeds": [1], "summary": "x"})
        status, _, session = _join_raw(http_client, log, fn_index["restore_last_run"], [kept], 0, kept)
        message = http_client.completion(session)
        assert status == 200 and message["success"], message
        assert path not in json.dumps(message["output"]["data"]), message


def _light_handlers_answer_raw_values(http_client, log: AppLog, fn_index) -> None:
    # The light handlers (token count, style description, the fixed-seed note, parameters read
    # from the prompt box, the size proposed for an image) answer, not fail: every input of each,
    # malformed in turn.
    for raw in RAW_VALUES:
        for name, valid in (("token_count", ['"a cat"', '"(No style)"']),
                            ("style_description", ['"a cat"', '"Anime"']), ("seed_note", ["5", '""']),
                            ("fill_from_pasted", ['"a cat\\nSteps: 3"']), ("restore_last_run", ["{}"]),
                            ("propose_size", ["null"]), ("paint_over", ["null"]), ("read_png_info", ["null"]),
                            ("values_hint", ['"Steps"']), ("values_hint_1", ['"Size"']),
                            ("send_to_extras", ["null", "null"]),
                            ("mask_painted", ['{"background": null, "layers": [], "composite": null}'])):
            for position in range(len(valid)):
                status, _, session = _join_raw(http_client, log, fn_index[name], valid, position, raw)
                if status == 200:
                    message = http_client.completion(session)
                    assert message["msg"] == "process_completed" and message["success"], message


TRAVERSALS = ["../" * 8 + "etc/passwd", "..%2f" * 8 + "etc%2fpasswd", "%2e%2e/" * 8 + "etc/passwd",
              "%2e%2e%2f" * 8 + "etc/passwd", "%252e%252e%252f" * 8 + "etc/passwd", "..%5c" * 8 + "etc/passwd",
              "%c0%ae%c0%ae/" * 8 + "etc/passwd", "....//" * 8 + "etc/passwd", "/etc/passwd", "//etc/passwd",
              "/proc/self/environ", "%2fproc%2fself%2fenviron", "/proc/self/cwd/app.py", "file:///etc/passwd",
              "http://127.0.0.1:1/", "\\..\\..\\etc\\passwd", "/./././etc/passwd", "%00/etc/passwd",
              "/etc/passwd%00.png"]
ROUTES = ["/gradio_api/file=", "/gradio_api/file/", "/gradio_api/proxy=", "/assets/", "/static/", "/svelte/",
          "/gradio_api/stream/", "/gradio_api/custom_component/", "/", "/gradio_api/run-history/records/"]
OTHER_ROUTES = [("POST", "/gradio_api/vibe-edit"), ("GET", "/gradio_api/vibe-code"),
                ("POST", "/gradio_api/component_server"), ("POST", "/gradio_api/process_recording"),
                ("POST", "/gradio_api/reset"), ("GET", "/gradio_api/runs"), ("POST", "/gradio_api/run/predict"),
                ("POST", "/gradio_api/api/predict"), ("POST", "/gradio_api/run/generate"),
                ("POST", "/gradio_api/call/v2/generate"), ("POST", "/login"), ("GET", "/logout"),
                ("GET", "/monitoring"), ("GET", "/gradio_api/upload_progress"), ("POST", "/gradio_api/stream/x"),
                ("GET", "/openapi.json"), ("GET", "/gradio_api/openapi.json"), ("GET", "/gradio_api/deep_link"),
                ("GET", "/gradio_api/app_id"), ("PUT", "/gradio_api/queue/join"), ("DELETE", "/config"), ("PATCH", "/"),
                ("OPTIONS", "/gradio_api/info"), ("GET", "/gradio_api/queue/join"), ("POST", "/gradio_api/queue/data"),
                ("POST", "/healthz")]


def test_fuzz_raw_routes(app_server, http_client, fn_index, app_log):
    generate = fn_index["generate"]
    session = uuid.uuid4().hex
    good = {"data": GENERATE, "fn_index": generate, "session_hash": session}
    cases: list[tuple[str, str, bytes | None, dict]] = []
    for route in ROUTES:
        for path in TRAVERSALS:
            cases += [("GET", route + path, None, {}), ("HEAD", route + path, None, {})]
    cases += [(method, path, b"{}", {}) for method, path in OTHER_ROUTES]
    envelopes = [b"", b"{", b"[]", b"null", b'"x"', b"\xff\xfe\x00", b"{" * 5000 + b"}" * 5000, b'{"data": 1}',
                 b'{"fn_index": 1}', b'{"data": [], "fn_index": "1", "session_hash": "s"}']
    beyond = 1 + max(dep["id"] for dep in json.loads(get(app_server["url"] + "/config")[1])["dependencies"])
    for fn in (-1, beyond, 999, 2**31, 2**63, "NaN", "1e999", "1.5", "true", '"1"', "null", "[]"):
        envelopes.append(('{"data": [], "fn_index": %s, "session_hash": "s"}' % fn).encode())
    for session_hash in ('""', "1", '"a b"', '"../x"', '"' + "s" * 65 + '"', '"\\ud800"', "[]"):
        envelopes.append(json.dumps({**good, "session_hash": 0}).replace("0}", session_hash + "}").encode())
    assert FEWEST_INPUTS == 1  # (the prompt alone may be sent: the rest take their defaults)
    for arity in (0, len(GENERATE) + 1, 100):
        envelopes.append(json.dumps({**good, "data": (GENERATE * 20)[:arity]}).encode())
    for key, value in [("event_id", 5), ("trigger_id", "x"), ("trigger_id", True), ("simple_format", "yes"),
                       ("batched", 1), ("oauth_token", [1]), ("event_data", [[[[[[[[[[[[1]]]]]]]]]]]])]:
        envelopes.append(json.dumps({**good, key: value}).encode())
    envelopes.append(json.dumps({**good, "data": ["x" * (MAX_BODY_BYTES + 1)] + GENERATE[1:]}).encode())  # too big
    for body in envelopes:
        cases += [("POST", "/gradio_api/queue/join", body, {}), ("POST", "/gradio_api/call/generate", body, {})]
    # The queue needs a session; call/<api_name> makes one when none is given (a valid call there).
    cases.append(("POST", "/gradio_api/queue/join", json.dumps({**good, "session_hash": None}).encode(), {}))
    cases += [("POST", f"/gradio_api/call/{name}", json.dumps({"data": GENERATE}).encode(), {})
              for name in ("nope", "token_count", "reuse_seed", "lambda", "load_example", "%00", "..%2fgenerate", "")]
    cases += [("POST", path, body, {})
              for body in envelopes[:12] for path in ("/gradio_api/cancel", "/gradio_api/reset")]
    cases += [("GET", f"/gradio_api/queue/data?session_hash={s}", None, {})
              for s in ("", "%00", "a%20b", "x" * 65, uuid.uuid4().hex, "..%2f..%2f")]
    cases += [("GET", "/gradio_api/queue/data", None, {})]
    cases += [("GET", f"/gradio_api/heartbeat/{s}", None, {}) for s in ("", "%00", "a%20b", "x" * 65, "a/b")]
    cases += [("GET", f"/gradio_api/call/generate/{e}", None, {}) for e in (uuid.uuid4().hex, "%00", "x" * 65, "")]
    cases += [("POST", "/gradio_api/upload", b"--x\r\nContent-Disposition: form-data; name=\"files\"; "
               b"filename=\"../../a.txt\"\r\n\r\n" + content + b"\r\n--x--\r\n",
               {"Content-Type": "multipart/form-data; boundary=x"})
              for content in (b"hello", b"<svg onload=alert(1)>", PNG_HTML[:40], b"")]
    cases += [("POST", "/gradio_api/upload", b"x" * (3 << 20), {"Content-Type": "multipart/form-data; boundary=x"})]
    cases += [("POST", "/gradio_api/queue/join", b"{}", {"Content-Length": "-1"})]
    assert len(cases) >= 500
    for method, path, body, headers in cases:
        _route_refused(app_server, http_client, app_log, method, path, body, headers)
    app_log.assert_quiet()


def _route_refused(app_server, http_client, log: AppLog, method: str, path: str, body: bytes | None = None,
                   headers: dict | None = None) -> None:
    """A raw request the app must refuse: a 4xx, with a message where there is a body."""
    headers = headers or {}
    log.inputs += 1
    if "Content-Length" in headers:  # a lying header: sent by hand
        status = _raw_lying_length(app_server["port"], path)
        http_client.check(method, path, status, b"")
        assert 400 <= status < 500
        return
    status, data = http_client.request(method, path, body, headers)
    assert 400 <= status < 500, (method, path[:100], status, data[:200])
    if method != "HEAD" and data:
        assert refusal(data), (method, path[:100], data[:200])


def _raw_lying_length(port: int, path: str) -> int:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{{}}".encode())
        reply = s.recv(4096).decode("latin-1")
    return int(reply.split()[1])


# The page's paste box: anything at all, as text or as any JSON value.
PASTES = st.one_of(st.text(max_size=400), st.text(st.sampled_from('abc:, "\\\n()<>0123456789.x-Negative prompt:Steps'),
                                                  max_size=600),
                   st.lists(st.sampled_from(["a cat\n", "Steps: 3", "Sampler: ", "DDIM", "DPM++ 2M", "Euler a",
                                             " Karras", "Schedule type: ", "karras", "sgm_uniform", "Exponential",
                                             "Beta", "Checkpoint", "RNG: ", "CPU", "NV", "Version: sdxl-tpu 0.1.0",
                                             ", ", "Seed: 5"]), max_size=24).map("".join),
                   huge_text, not_text, st.sampled_from([v for v in RAW_VALUES if len(v) < 1000]).map(json.loads))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=PASTES)
def test_fuzz_the_paste_box(http_client, fn_index, value):
    """Whatever is pasted: the event succeeds with a line of notes (what was filled, what was not
    used, or what is wrong), the form gets only values it can take, nothing is a 5xx."""
    log = AppLog(http_client.app)
    _paste(http_client, log, fn_index, value)
    log.assert_quiet()


def _paste(http_client, log: AppLog, fn_index, value) -> None:
    try:
        raw = json.dumps(value, allow_nan=True)
    except ValueError:  # (a lone surrogate: send it as JSON escapes)
        raw = json.dumps(value, ensure_ascii=True)
    status, text, session = _join_raw(http_client, log, fn_index["paste_parameters"], ["null"], 0, raw)
    if status != 200:  # refused at the envelope (a file object: this app takes no files)
        assert 400 <= status < 500 and refusal(text), text[:300]
        return
    message = http_client.completion(session)
    assert message["success"] is True, message
    *form, notes = message["output"]["data"]
    assert isinstance(notes, str) and notes and "Traceback" not in notes
    filled = dict(zip(PASTED_INTO, (None if isinstance(v, dict) and v.get("__type__") == "update" else v
                                    for v in form)))  # (None: left as it was)
    prompt, negative, seed, randomize, guidance, steps, sampler, schedule, size, rng = (
        filled[name] for name in ("prompt", "negative", "seed", "randomize", "guidance", "steps", "sampler",
                                  "schedule", "size", "rng"))
    assert all(v is None or isinstance(v, str) for v in (prompt, negative)), form
    assert seed is None or (type(seed) is int and -1 <= seed < 2**32 and randomize is False), form
    assert guidance is None or 0 <= guidance <= 20, form
    assert steps is None or (type(steps) is int and 1 <= steps <= 50), form
    assert sampler in (None, *SAMPLERS) and size in (None, *SIZES.split(",")), form
    assert schedule in (None, *SCHEDULES) and rng in (None, *RNGS), form
    assert sampler is None or schedule is None or not _refused(sampler, schedule), form  # a pair that runs


# The Extras tab's Upscale (page/page_extras.py): the image (an upload's file object), the upscaler
# and the Resize factor, each malformed in turn; a label its refusals name.
EXTRAS_LABELS = ("image", "Upscaler", "Resize")
EXTRAS_MALFORMED = {1: st.one_of(not_text, text.filter(lambda s: s not in ("None", "Lanczos", GENERAL)),
                                 st.sampled_from(["Latent", "lanczos", "Nearest", "4x-UltraSharp", "ESRGAN_4x",
                                                  "../" + GENERAL, GENERAL + " "])),
                    2: st.one_of(not_text.filter(lambda v: isinstance(v, bool) or not isinstance(v, (int, float))
                                                 or not 1 <= v <= 4),
                                 st.floats(4.0001, 1e300), st.floats(-1e300, 0.9999), text, st.just([2]))}


def _upload(http_client, data: bytes) -> str:
    """`data` sent to the upload route as the page sends a file: the path it answered."""
    boundary = "sdxl" + uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"x.png\"\r\n"
            "Content-Type: image/png\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    status, text = http_client.request("POST", "/gradio_api/upload", body,
                                       {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert status == 200, text
    return json.loads(text)[0]


@pytest.fixture(scope="module")
def extras_call(http_client):
    """A call of the Extras tab's Upscale that works (raw JSON values): an uploaded picture, Lanczos, 2."""
    from images import encoded, picture

    return [json.dumps(_file_data(_upload(http_client, encoded(picture(40, 32), "PNG")))), '"Lanczos"', "2"]


def _extras_refused(http_client, log: AppLog, fn_index, call: list[str], position: int, raw: str) -> None:
    """Upscale with input `position` the raw JSON text `raw`: refused at the envelope (4xx: a file
    object where no image is taken, or naming no upload), or the event succeeds with the last result
    kept (a skip) and a line under the button naming the input."""
    status, text, session = _join_raw(http_client, log, fn_index["extras_upscale"], call, position, raw)
    if status != 200:
        assert status in (413, 422) and refusal(text), text[:300]
        return
    message = http_client.completion(session)
    assert message["success"] is True, (position, raw[:100], message)
    shown, note = message["output"]["data"]
    assert isinstance(shown, dict) and shown.get("__type__") == "update", (position, raw[:100], shown)
    assert note.startswith("⚠️ ") and EXTRAS_LABELS[position] in note and "Traceback" not in note, (position, raw[:100],
                                                                                                   note)


def test_fuzz_the_extras_tab_raw(app_server, http_client, fn_index, app_log, extras_call):
    """Every raw value on each input of the Extras tab's Upscale is refused, naming that input (the
    server up, its log quiet); the valid call then makes its image."""
    for position in range(len(extras_call)):
        for raw in RAW_VALUES + ['"/etc/passwd"', '"Lanczos"' if position != 1 else '"Latent"']:
            _extras_refused(http_client, app_log, fn_index, extras_call, position, raw)
    app_log.assert_quiet()
    status, message = http_client.join([json.loads(v) for v in extras_call], fn_index["extras_upscale"])
    assert status == 200 and message["success"] and message["output"]["data"][1].startswith("**80 × 64**"), message


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=st.sampled_from(sorted(EXTRAS_MALFORMED)).flatmap(lambda i: st.tuples(st.just(i), EXTRAS_MALFORMED[i])))
def test_fuzz_the_extras_tab(http_client, fn_index, extras_call, case):
    position, value = case
    log = AppLog(http_client.app)
    _extras_refused(http_client, log, fn_index, extras_call, position, json.dumps(value))
    log.assert_quiet()


# One of each kind of malformed input above, sent by the test below itself (it runs alone too).
SAMPLE_FIELDS = [("prompt", ["a cat"]), ("negative", {"a": "b"}), ("style", "Bogus"), ("seed", -2),
                 ("randomize", "yes"), ("guidance", 25.0), ("steps", 0), ("size", "huge"), ("sampler", "Heun"),
                 ("schedule", "Beta"), ("rng", "GPU"), ("prompt", "x" * (MAX_PROMPT_CHARS + 1)),
                 ("prompt", "(cat:1e300)"), (PAIR, REFUSED_PAIRS[0])]
SAMPLE_PASTES = ["a cat\nSteps: 3, Sampler: DDIM, Schedule type: Karras", ["not", "text"], "x" * 70_000, None]


def test_malformed_inputs_leave_the_server_up_its_log_quiet_and_a_normal_call_working(app_server, http_client,
                                                                                      fuzz_client, fn_index,
                                                                                      app_log):
    def file_object(log: AppLog, path: str, position: int) -> None:  # in place of a text, a number, a dropdown
        data = list(GENERATE)
        data[position] = _file_data(path)
        log.inputs += 1
        assert http_client.join(data, fn_index["generate"])[0] == 422

    sends = [lambda log, f=f, v=v: _predict_refused(fuzz_client, http_client, log, f, v) for f, v in SAMPLE_FIELDS]
    sends += [lambda log, e=e, p=p, r=r: _raw_value_refused(http_client, log, fn_index, e, p, r)
              for e in CALLS for p in (0, 3, 6, HISTORY - 1) for r in RAW_VALUES]
    for path in ("/etc/passwd", str(app_server["secret_file"]), "../" * 12 + "etc/passwd"):
        sends += [lambda log, path=path, p=p: file_object(log, path, p) for p in (0, 3, 7)]
        sends.append(lambda log, path=path: _route_refused(app_server, http_client, log, "GET",
                                                           f"/gradio_api/file={path}"))
    sends += [lambda log, path=route + t: _route_refused(app_server, http_client, log, "GET", path)
              for route in ROUTES[:4] for t in TRAVERSALS]
    sends.append(lambda log: _route_refused(app_server, http_client, log, "POST", "/gradio_api/queue/join", b"{"))
    sends.append(lambda log: _route_refused(app_server, http_client, log, "POST", "/gradio_api/queue/join", b"{}",
                                            {"Content-Length": "-1"}))
    sends += [lambda log, v=v: _paste(http_client, log, fn_index, v) for v in SAMPLE_PASTES]
    for send in sends:  # each input's own lines, then all of them together
        log = AppLog(app_server)
        send(log)
        log.assert_quiet()
        app_log.inputs += log.inputs

    assert app_log.inputs >= 200, app_log.inputs
    assert get(app_server["url"] + "/healthz")[0] == 200
    lines = app_log.assert_quiet()
    print(f"{app_log.inputs} malformed inputs, {len(lines)} log lines ({len(lines) / app_log.inputs:.2f} per input)")
    assert lines, "no refusal was logged"  # (so the window read is the app's log)
    gallery, info = fuzz_client.predict(*GENERATE, api_name="/generate")
    assert len(gallery) == 4 and "Generated 4 images" in info
    assert _cached_files_containing(app_server["cache_dir"], [app_server["secret"], OWN_SOURCE, "root:x:0:0"]) == []


def test_fuzz_uploads(app_server, http_client, fn_index, app_log):
    """Every hostile or broken file of hostile_files (over 300) sent to the upload route: a
    non-image is refused (4xx naming the upload, nothing kept); an image that decodes (corruptions
    may leave one) is kept and served back only as fresh PNG pixels (never the file itself: a PNG
    with a page after it comes back without the page), and a run from it works."""
    files = [(name, data) for name, data in hostile_files() if isinstance(data, bytes)]
    files.append(("png+html", PNG_HTML))
    assert len(files) >= 300
    taken = []
    for name, data in files:
        boundary = "sdxl" + uuid.uuid4().hex
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}.html\"\r\n"
                "Content-Type: text/html\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
        app_log.inputs += 1
        status, text = http_client.request("POST", "/gradio_api/upload", body,
                                           {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        if status == 200:
            taken.append((name, json.loads(text)[0]))
            continue
        assert status in (400, 413, 415) and json.loads(text)["detail"].startswith(("The upload", "An upload")), (
            name, status, text[:200])
    assert 0 < len(taken) < len(files) // 2, len(taken)
    for name, path in taken:
        status, content = http_client.request("GET", f"/gradio_api/file={path}")
        assert status == 200 and content.startswith(b"\x89PNG") and b"<html" not in content, (name, content[:100])
    # The page's run from an upload (the last: the polyglot), its image as the page sends it; and
    # the same upload as the image's mask (inpainting). A mask without its image is refused by name.
    image = FIELDS.index("image")
    data = GENERATE[:image] + [_file_data(taken[-1][1]), 0.5, "Just resize"] + GENERATE[image + 3:]
    status, message = http_client.join(data, fn_index["generate"])
    assert status == 200 and message["success"], message
    mask = FIELDS.index("mask")
    status, message = http_client.join(data[:mask] + [_file_data(taken[-1][1])] + data[mask + 1:], fn_index["generate"])
    assert status == 200 and message["success"], message
    status, message = http_client.join(GENERATE[:mask] + [_file_data(taken[-1][1])] + GENERATE[mask + 1:],
                                       fn_index["generate"])
    assert status == 200 and not message["success"] and "Mask applies to a starting image" in str(message), message
    # The Extras tab's Upscale of it: its pixels (16x16) upscaled, as a PNG of the app's.
    status, message = http_client.join([_file_data(taken[-1][1]), "Lanczos", 2], fn_index["extras_upscale"])
    assert status == 200 and message["output"]["data"][1].startswith("**32 × 32** (from 16 × 16)"), message
    assert not _cached_files_containing(app_server["cache_dir"], [app_server["secret"]])
    app_log.assert_quiet()


def test_uploads_are_read_by_their_name_alone_and_swept_by_age_and_size(tmp_path):
    """Only a path an upload answered (or one of the app's own images) is read, as given; uploads go
    when older than the images are kept, and the oldest first while they take more than the budget;
    a run naming one that went says to drop the image in again."""
    import time

    from sdxl_tpu.server.uploads import Uploads
    from sdxl_tpu.request.errors import RequestError

    now = time.time()
    files = []
    for i in range(4):
        path = tmp_path / f"upload-{i}.png"
        path.write_bytes(bytes([i]) * 1000)
        os.utime(path, (now - 10 + i, now - 10 + i))  # oldest first, all younger than kept
        files.append(path)
    ours = tmp_path / "sdxl-1.jpg"
    ours.write_bytes(b"ours")
    uploaded = {str(p) for p in files}
    uploads = Uploads(uploaded, lambda path: path == str(ours), keep_seconds=60, max_bytes=2500)
    assert uploads.read({"path": str(files[1])}) == bytes([1]) * 1000 and uploads.read({"path": str(ours)}) == b"ours"
    for value in ({"path": "/etc/passwd"}, {"path": f"{tmp_path}/x/../upload-1.png"}, str(files[1]),
                  {"url": str(files[1])}, {"path": [str(files[1])]}, None, 5):
        with pytest.raises(RequestError, match="must be a file uploaded to this page"):
            uploads.read(value)
    uploads.sweep()  # 4,000 bytes over a budget of 2,500: the two oldest go
    assert uploaded == {str(files[2]), str(files[3])} and not files[0].exists() and not files[1].exists()
    os.utime(files[2], (now - 120, now - 120))  # older than kept
    uploads.sweep()
    assert uploaded == {str(files[3])} and not files[2].exists() and files[3].exists() and ours.exists()
    files[3].unlink()  # (gone behind its back: a run naming it says so)
    with pytest.raises(RequestError, match="no longer on the server"):
        uploads.read({"path": str(files[3])})
