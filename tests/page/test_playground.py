"""The playground's logic without a browser: settings, styles, input checks, warm-up state."""

from __future__ import annotations

import threading

import pytest
from stand_in import LoadedStandIn

from sdxl_tpu.server.core import Server
from sdxl_tpu.server.form import picked_item, validate
from sdxl_tpu.server.offer import Offer, provisional
from sdxl_tpu.page.page import style_description
from sdxl_tpu.server.settings import Settings, parse_settings
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.request.names import RNGS, SAMPLERS, SCHEDULES
from sdxl_tpu.request.styles import STYLES, apply_style
from sdxl_tpu.request.values import clean_text, text_input

SIZES = [(64, 64), (96, 64)]
OK = dict(prompt="a cat", negative="", style="(No style)", seed=3, randomize=False, guidance=5.0, steps=20,
          size="64x64", sampler=None)
TINY = Settings(load=LoadOptions(model="tiny", sizes=SIZES))


def _validate(**overrides):
    return validate({**OK, **overrides}, provisional(TINY))


def test_ten_styles_with_templates():
    for name in ("(No style)", "Cinematic", "Photographic", "Anime", "Manga", "Digital Art", "Pixel art",
                 "Fantasy art", "Neonpunk", "3D Model"):
        assert "{prompt}" in STYLES[name][0]
    assert apply_style("Anime", "a cat", "blurry") == (
        "anime artwork a cat . anime style, key visual, vibrant, studio anime, highly detailed",
        "photo, deformed, black and white, realism, disfigured, low contrast, blurry")
    assert apply_style("(No style)", "a cat", "") == ("a cat", "")


def test_clean_text_strips_control_characters():
    assert clean_text("a\x00cat\x1b[31m\u200b\tand\ndog  ") == "a cat [31m and dog"


def test_text_input_refuses_what_is_not_text_instead_of_converting_it():
    assert text_input(None, "Prompt") == "" and text_input(" a\tcat ", "Prompt") == "a cat"
    assert text_input("x" * 1000, "Prompt") == "x" * 1000
    for value, message in [(["a"], "Prompt must be text, got a list."),
                           ({"a": 1}, "Prompt must be text, got an object."),
                           (5, "Prompt must be text, got a number."), (True, "Prompt must be text, got true/false."),
                           ("x" * 20_001, "Prompt is 20,001 characters long; at most 20,000 are accepted."),
                           ("a\ud800b", "Prompt contains a lone surrogate")]:
        with pytest.raises(RequestError) as info:
            text_input(value, "Prompt")
        assert str(info.value).startswith(message)


@pytest.mark.parametrize("overrides, message", [
    (dict(prompt=" \x00 "), "Prompt is empty: please enter a prompt."),
    (dict(prompt=["a cat"]), "Prompt must be text, got a list."),
    (dict(guidance=[]), "Guidance scale must be a number between 0 and 20, got a list."),  # found by the fuzz test
    (dict(guidance=[5.0]), "Guidance scale must be a number between 0 and 20, got a list."),
    (dict(seed=[1, 2, 3, 4]), "Seed must be a whole number between -1 (random) and 4294967295, got a list."),
    (dict(negative={"path": "/etc/passwd"}), "Negative prompt must be text, got a file object."),
    (dict(seed=-2), "Seed must be a whole number between -1 (random) and 4294967295."),
    (dict(seed=2**32), "Seed must be a whole number between -1 (random) and 4294967295."),
    (dict(seed=1.5), "Seed must be a whole number between -1 (random) and 4294967295."),
    (dict(seed=10**400), "Seed must be a whole number between -1 (random) and 4294967295."),  # found by the fuzz test
    (dict(guidance=-10**400), "Guidance scale must be a number between 0 and 20."),
    (dict(seed=True), "Seed must be a whole number between -1 (random) and 4294967295, got true/false."),
    (dict(seed="abc"), "Seed must be a whole number between -1 (random) and 4294967295, got text."),
    (dict(randomize="yes"), "Randomize seed must be true or false, got text."),
    (dict(guidance=float("nan")), "Guidance scale must be a finite number between 0 and 20."),
    (dict(guidance=float("inf")), "Guidance scale must be a finite number between 0 and 20."),
    (dict(guidance=20.5), "Guidance scale must be a number between 0 and 20."),
    (dict(guidance="5"), "Guidance scale must be a number between 0 and 20, got text."),
    (dict(steps=0), "Steps must be a whole number between 1 and 50."),
    (dict(steps=7.5), "Steps must be a whole number between 1 and 50."),
    (dict(steps=True), "Steps must be a whole number between 1 and 50, got true/false."),
    (dict(size="1024x1024"), "Size '1024x1024' is not available; choose one of: 64x64, 96x64."),
    (dict(size="big"), "Size 'big' is not available; choose one of: 64x64, 96x64."),
    (dict(size=["64x64"]), "Size must be text, got a list; choose one of: 64x64, 96x64."),
    (dict(size="\ud800\x00" + "x" * 100), "Size '\\ud800\\u0000xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' is not"),
    (dict(style="Bogus"), "Style 'Bogus' is not available; choose one of: (No style), Cinematic,"),
    (dict(style=3), "Style must be text, got a number; choose one of:"),
    (dict(sampler="Heun"), f"Sampler 'Heun' is not available; choose one of: {', '.join(SAMPLERS)}."),
    (dict(sampler=True), "Sampler must be text, got true/false; choose one of: Euler, Euler a,"),
    (dict(schedule="Beta"), f"Schedule type 'Beta' is not available; choose one of: {', '.join(SCHEDULES)}."),
    (dict(schedule=3), "Schedule type must be text, got a number; choose one of: Checkpoint, Automatic,"),
    (dict(schedule="karras"), "Schedule type 'karras' is not available"),  # (a request names it exactly)
    (dict(rng="GPU"), "RNG 'GPU' is not available; choose one of: JAX, CPU."),
    (dict(rng=["CPU"]), "RNG must be text, got a list; choose one of: JAX, CPU."),
    (dict(sampler="DDIM", schedule="Karras"),
     "DDIM runs on its own timesteps: choose Schedule type Checkpoint or Automatic, not Karras."),
    (dict(sampler="DPM++ 2M Karras", schedule="Uniform"),
     "DPM++ 2M Karras names its schedule (Karras): for Schedule type Uniform choose DPM++ 2M."),
])
def test_validation_messages(overrides, message):
    with pytest.raises(RequestError) as info:
        _validate(**overrides)
    assert str(info.value).startswith(message)
    str(info.value).encode("utf-8")  # what the user sees is always valid UTF-8 (JSON-encodable)


def test_valid_request_and_random_seed():
    request = _validate(style="Pixel art", negative="blurry", steps=12.0, size="96x64", guidance=7)
    assert request.prompt.startswith("pixel-art a cat") and request.negative_prompt.endswith(", blurry")
    assert (request.steps, request.size, request.seed, request.sampler) == (12, (96, 64), 3, "Euler")  # the offer's
    assert _validate(sampler="DPM++ 2M Karras").sampler == "DPM++ 2M Karras"
    assert (request.schedule, request.rng) == ("Checkpoint", "JAX")  # left out: the checkpoint's schedule, JAX noise
    chosen = _validate(sampler="DPM++ 2M", schedule="Karras", rng="CPU")
    assert (chosen.sampler, chosen.schedule, chosen.rng) == ("DPM++ 2M", "Karras", "CPU")
    assert {i.rng for i in chosen.images(4)} == {"CPU"} and {i.schedule for i in chosen.images(4)} == {"Karras"}
    assert request.guidance_scale == 7.0 and isinstance(request.guidance_scale, float)
    seeds = {_validate(randomize=True).seed for _ in range(5)} | {_validate(randomize=True, seed=None).seed}
    assert len(seeds) > 1 and all(0 <= s < 2**32 for s in seeds)


def test_seed_minus_one_is_random_with_randomize_off_as_in_a1111():
    first, second = _validate(seed=-1).seed, _validate(seed=-1.0).seed
    assert first != second  # (equal once in 2**32 pairs)
    assert all(0 <= i.seed < 2**32 for i in _validate(seed=-1).images(4))  # the seeds used, never -1
    assert _validate(seed=7).seed == 7 and _validate(seed=0).seed == 0  # any other seed is kept


def test_settings_from_arguments_and_environment(capsys):
    s = parse_settings([], env={"SDXL_MODEL": "tiny", "SDXL_SIZES": "64x64, 96x64", "GRADIO_SERVER_PORT": "9000",
                                "GRADIO_SERVER_NAME": "0.0.0.0", "SDXL_DTYPE": "float32"})
    assert (s.load.model, s.load.sizes, s.port, s.host, s.load.dtype) == ("tiny", ((64, 64), (96, 64)), 9000, "0.0.0.0",
                                                                      "float32")
    s = parse_settings(["--model", "/data/sdxl", "--sizes", "1024x1024,1152x896", "--port", "7000"], env={})
    assert (s.load.model, s.load.sizes, s.port, s.host) == ("/data/sdxl", ((1024, 1024), (1152, 896)), 7000,
                                                        "127.0.0.1")
    assert parse_settings([], env={}).load.sizes == ((1024, 1024),)
    assert parse_settings(["--model", "tiny"], env={}).load.sizes == ((256, 256),)  # quick to try on a CPU
    with pytest.raises(SystemExit):
        parse_settings(["--sizes", "huge"], env={})
    # The networks' programs at some sizes only: sizes of --sizes, said as one line otherwise.
    s = parse_settings(["--sizes", "1024x1024,1152x896"], env={"SDXL_NETWORK_SIZES": "1024x1024"})
    assert (s.load.network_sizes, parse_settings([], env={}).load.network_sizes) == (((1024, 1024),), None)
    with pytest.raises(SystemExit):
        parse_settings(["--network-sizes", "512x512"], env={})
    assert "--network-sizes 512x512 is not one of --sizes (1024x1024)" in capsys.readouterr().err
    s = parse_settings([], env={})
    assert (s.drain_seconds, s.metrics) == (60.0, "public")
    s = parse_settings(["--drain-seconds", "5", "--metrics", "127.0.0.1:9100"], env={})
    assert (s.drain_seconds, s.metrics) == (5.0, "127.0.0.1:9100")
    s = parse_settings([], env={"SDXL_DRAIN_SECONDS": "0", "SDXL_METRICS": "off"})
    assert (s.drain_seconds, s.metrics) == (0.0, "off")
    assert (s.load.unet, s.load.timestep_spacing) == (None, None)
    s = parse_settings(["--unet", "ByteDance/SDXL-Lightning/sdxl_lightning_4step_unet.safetensors"],
                       env={"SDXL_SPACING": "trailing"})
    assert (s.load.unet, s.load.timestep_spacing) == ("ByteDance/SDXL-Lightning/sdxl_lightning_4step_unet.safetensors",
                                            "trailing")
    s = parse_settings(["--preset", "Turbo"], env={})
    assert (s.load.model, s.load.sizes, s.load.timestep_spacing, s.load.unet, s.recipe.sampler) == (
        "stabilityai/sdxl-turbo", ((512, 512),), "trailing", None, "Euler a")
    s = parse_settings(["--model", "/data/my-sdxl", "--sizes", "768x768"], env={"SDXL_PRESET": "Lightning 4-step"})
    assert (s.load.model, s.load.sizes, s.load.timestep_spacing, s.recipe.steps, s.recipe.guidance) == (
        "/data/my-sdxl", ((768, 768),), "trailing", 4, 0.0)
    assert s.load.unet == "ByteDance/SDXL-Lightning/sdxl_lightning_4step_unet.safetensors"
    assert Server(s).presets == [s.recipe] and Server(s).offer.default_sampler == "Euler"
    assert [r.name for r in Server(parse_settings([], env={})).presets] == ["Quality", "Balanced", "Fast"]
    s = parse_settings(["--model", "/m/juggernaut.safetensors", "--config", "/m/sdxl-base"],
                       env={"SDXL_LORA": "a.safetensors:0.5, owner/repo/b.safetensors"})
    assert (s.load.model, s.load.config, s.load.loras) == ("/m/juggernaut.safetensors", "/m/sdxl-base",
                                                           ("a.safetensors:0.5", "owner/repo/b.safetensors"))
    s = parse_settings(["--lora", "c.safetensors", "--lora", "d.safetensors:2"], env={"SDXL_LORA": "a.safetensors"})
    assert (s.load.config, s.load.loras) == (None, ("c.safetensors", "d.safetensors:2"))  # given options win
    assert parse_settings([], env={}).load.loras == ()
    for bad in (["--metrics", "9100"], ["--preset", "Ultra"], ["--metrics", "host:99999"], ["--metrics", "yes"],
                ["--drain-seconds", "-1"], ["--spacing", "even"], ["--schedule", "Beta"], ["--rng", "GPU"]):
        with pytest.raises(SystemExit):
            parse_settings(bad, env={})


def test_default_schedule_and_noise_source_settings(capsys):
    """--schedule and --rng (env SDXL_SCHEDULE, SDXL_RNG): what a request that names none gets,
    and the page's defaults; checked like a request's, the launch preset's sampler included."""
    s = parse_settings([], env={})
    assert (s.schedule, s.rng) == ("Checkpoint", "JAX")
    s = parse_settings(["--schedule", "Karras", "--rng", "CPU"], env={})
    assert (s.schedule, s.rng) == ("Karras", "CPU")
    s = parse_settings([], env={"SDXL_SCHEDULE": "SGM Uniform", "SDXL_RNG": "CPU"})
    assert (s.schedule, s.rng) == ("SGM Uniform", "CPU")
    assert parse_settings(["--schedule", "Automatic"], env={"SDXL_SCHEDULE": "Karras"}).schedule == "Automatic"
    for argv, env, message in [([], {"SDXL_SCHEDULE": "karras"},
                                "SDXL_SCHEDULE (for --schedule) must be one of Checkpoint, Automatic,"),
                               ([], {"SDXL_RNG": "NV"}, "SDXL_RNG (for --rng) must be one of JAX, CPU, got 'NV'"),
                               (["--preset", "Quality", "--schedule", "Exponential"], {},
                                "--schedule Exponential with --preset Quality: DPM++ 2M Karras names its schedule")]:
        with pytest.raises(SystemExit):
            parse_settings(argv, env=env)
        assert message in capsys.readouterr().err
    assert parse_settings(["--preset", "Quality", "--schedule", "Karras"], env={}).schedule == "Karras"


def test_a_request_without_schedule_or_rng_gets_the_server_defaults_checked_with_the_sampler_that_runs():
    class FakePipeline(LoadedStandIn):
        sizes, samplers, default_sampler = SIZES, {"Euler": None, "DDIM": None}, "DDIM"

    server = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES), schedule="Automatic", rng="CPU"),
                    loader=lambda s: FakePipeline())
    server.warmup.load()
    assert (server.offer.schedules, server.offer.rngs) == (list(SCHEDULES), list(RNGS))
    assert (server.offer.default_schedule, server.offer.default_rng) == ("Automatic", "CPU")
    form = {**OK, "sampler": "Euler"}
    request = server.validate_form(form)  # (an API caller of before: nine fields)
    assert (request.sampler, request.schedule, request.rng) == ("Euler", "Automatic", "CPU")
    request = server.validate_form({**form, "schedule": None, "rng": None})
    assert (request.schedule, request.rng) == ("Automatic", "CPU")
    request = server.validate_form({**form, "schedule": "Karras", "rng": "JAX"})
    assert (request.schedule, request.rng) == ("Karras", "JAX")
    # No sampler named: the model's own (DDIM here) runs, and the schedule is checked with it.
    assert server.validate_form({**OK, "schedule": "Checkpoint", "rng": "JAX"}).sampler == "DDIM"
    with pytest.raises(RequestError, match="^DDIM runs on its own timesteps: choose Schedule type Checkpoint or "
                                           "Automatic, not Karras.$"):
        server.validate_form({**OK, "schedule": "Karras", "rng": "JAX"})
    with pytest.raises(RequestError, match="^Schedule type 'Fast' is not available"):
        server.validate_form({**form, "schedule": "Fast", "rng": "JAX"})


def test_front_end_settings_and_what_it_takes_from_a_back_end():
    assert parse_settings([], env={}).backend is None
    assert parse_settings(["--backend", "http://127.0.0.1:8080/"], env={}).backend == "http://127.0.0.1:8080/"
    assert parse_settings([], env={"SDXL_BACKEND": "https://lb.example"}).backend == "https://lb.example"
    for bad in ("127.0.0.1:8080", "file:///etc/passwd", "http://", "http://lb/?x=1"):
        with pytest.raises(SystemExit):
            parse_settings(["--backend", bad], env={})
    info = {"model": "tiny", "sizes": ["64x64"], "samplers": ["Euler", "Euler a"], "default_sampler": "Euler a",
            "preset": "Turbo", "presets": ["Turbo"], "images_per_call": 4, "image_format": "png",
            "max_prompt_chunks": 2, "schedules": ["Checkpoint", "Karras"], "default_schedule": "Karras",
            "rngs": ["JAX", "CPU"], "default_rng": "CPU"}
    parsed = Offer.from_json(info)  # (a back end of before: no LoRAs said)
    assert parsed.sizes == [(64, 64)] and parsed.loras == () and parsed.to_json() == {
        **info, "loras": [], "controlnets": [], "ip_adapters": [], "embeddings": [], "skipped_embeddings": [],
        "upscalers": [], "refiner": None}
    embeddings = {"embeddings": [{"name": "easynegative", "vectors": 8}],
                  "skipped_embeddings": [{"name": "sd15", "reason": "clip_l has shape (8, 768)"}]}
    assert Offer.from_json({**info, **embeddings}).to_json() == {**parsed.to_json(), **embeddings}
    assert Offer.from_json({**info, "controlnets": ["canny-xl"]}).controlnets == ("canny-xl",)
    assert Offer.from_json({**info, "upscalers": ["R-ESRGAN 4x+"]}).to_json()["upscalers"] == ["R-ESRGAN 4x+"]
    for bad in ("canny", [5], ["../x"], ["a b"]):
        with pytest.raises(ValueError, match="controlnets must be a list of names"):
            Offer.from_json({**info, "controlnets": bad})
    loras = [{"name": "detail", "scale": 0.8}, {"name": "style", "scale": 1}]
    assert Offer.from_json({**info, "loras": loras}).loras == (("detail", 0.8), ("style", 1.0))
    assert Offer.from_json({**info, "loras": loras}).to_json()["loras"] == loras
    server = Server(Settings(load=LoadOptions(model="ignored"), backend="http://lb"))
    server.warmup.offer, server.warmup.described = parsed, True  # (as a back end's description arrives)
    offer = server.offer
    assert (offer.sizes, offer.samplers, offer.default_sampler, offer.image_format) == (
        [(64, 64)], ["Euler", "Euler a"], "Euler a", "png")
    assert (offer.schedules, offer.default_schedule, offer.rngs, offer.default_rng) == (
        ["Checkpoint", "Karras"], "Karras", ["JAX", "CPU"], "CPU")
    assert server.recipe.name == "Turbo" and [r.name for r in server.presets] == ["Turbo"]
    assert server.token_count("") == "0 / 150 tokens"  # the back end's room for prompts, not this one's setting
    for key, value in [("sizes", []), ("sizes", ["huge"]), ("samplers", ["Mystery"]), ("default_sampler", "LMS"),
                       ("preset", "Ultra"), ("presets", "Turbo"), ("images_per_call", True), ("image_format", "gif"),
                       ("model", None), ("max_prompt_chunks", 0), ("max_prompt_chunks", 9), ("max_prompt_chunks", True),
                       ("schedules", ["Beta"]), ("schedules", "Karras"), ("default_schedule", "Uniform"),
                       ("rngs", ["NV"]), ("default_rng", "GPU"), ("default_rng", None), ("loras", None),
                       ("loras", [["detail", 0.8]]), ("loras", [{"name": "", "scale": 1}]),
                       ("loras", [{"name": "x", "scale": True}]), ("loras", [{"name": "x", "scale": float("nan")}]),
                       ("embeddings", {"x": 1}), ("embeddings", [{"name": "x", "vectors": 0}]),
                       ("embeddings", [{"name": "x", "vectors": 76}]), ("embeddings", [{"name": "x", "vectors": True}]),
                       ("embeddings", [{"name": "", "vectors": 1}]), ("skipped_embeddings", [{"name": "x"}]),
                       ("skipped_embeddings", [{"name": "x", "reason": "y" * 1001}]), ("upscalers", "R-ESRGAN 4x+"),
                       ("upscalers", ["Lanczos"]), ("upscalers", ["a", "a"]), ("upscalers", [""]), ("upscalers", [5]),
                       ("upscalers", ["x" * 256]), ("upscalers", ["a\nb"])]:
        with pytest.raises(ValueError):
            Offer.from_json({**info, key: value})
    with pytest.raises(ValueError, match="lacks images_per_call"):
        Offer.from_json({k: v for k, v in info.items() if k != "images_per_call"})
    with pytest.raises(ValueError):
        Offer.from_json(["not", "an", "object"])


def test_token_count_says_what_each_lora_tag_does_here(tiny_checkpoint):
    """A1111's <lora:name:weight> tags are not encoded (not counted), and each gets a line: the LoRA
    fused here at its scale (a tag's weight changes nothing), or not loaded here."""
    from sdxl_tpu import load_tokenizers

    class Loaded(LoadedStandIn):
        sizes, tokenizers = SIZES, (load_tokenizers(tiny_checkpoint)[0], None)

    fused = ["/models/detail.safetensors:0.8", "/models/style.safetensors"]
    server = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES, loras=fused)), loader=lambda s: Loaded())
    assert server.offer.loras == (("detail", 0.8), ("style", 1.0))  # known before the model is loaded
    server.warmup.load()
    assert server.offer.loras == (("detail", 0.8), ("style", 1.0))
    plain = server.token_count("a cat on a mat")
    assert plain.endswith("/ 225 tokens") and "LoRA" not in plain
    assert server.token_count("a cat <lora:detail:0.5> on a mat <lora:style> <lora:foo:1> <lora:detail:1>") == (
        f"{plain}  \n"
        "LoRA `detail`: loaded, fused at 0.8 (the tag's 1 is not applied: LoRAs are fused at start).  \n"
        "LoRA `style`: loaded, fused at 1.  \n"
        "LoRA `foo`: not loaded here (start the server with --lora to fuse it).")
    assert server.token_count("<lora:detail:0.8>") == "0 / 225 tokens  \nLoRA `detail`: loaded, fused at 0.8."
    assert server.token_count("a <hypernet:h:1> <lora:a`b**c**:2>") == (
        f"{server.token_count('a')}  \nHypernetwork `h`: not applied (this server loads LoRAs only).  \n"
        "LoRA `a'b**c**`: not loaded here (start the server with --lora to fuse it).")  # (no Markdown of the user's)
    many = server.token_count("a " + " ".join(f"<lora:n{i}:1>" for i in range(9)))
    assert many.count("  \n") == 6 and many.endswith("… and 4 more tags.")
    bare = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES)), loader=lambda s: Loaded())
    bare.warmup.load()
    assert bare.token_count("a cat <lora:detail:0.5>").endswith(
        "LoRA `detail`: not loaded here (start the server with --lora to fuse it).")


def test_token_count_counts_an_embeddings_vectors_and_names_it(tiny_checkpoint):
    """An embedding named in the prompt counts its vectors as tokens (as A1111 counts them) and gets
    a line; a name the server does not have is words; a prompt naming none lists those here."""
    from sdxl_tpu import load_tokenizers
    from sdxl_tpu.request.fields import DEFAULT_STYLE
    from sdxl_tpu.server.form import token_count

    tokenizer = load_tokenizers(tiny_checkpoint)[0]
    count = lambda prompt, here: token_count(tokenizer, 3, prompt, DEFAULT_STYLE, "", (), here)  # noqa: E731
    here = (("myemb", 3), ("onevec", 1))
    words = int(count("a photo of cat", here).split(" / ")[0])
    assert count("a photo of myemb cat", here) == f"{words + 3} / 225 tokens  \nEmbedding `myemb`: 3 vectors."
    assert count("onevec, a photo of cat onevec", here) == (
        f"{words + 3} / 225 tokens  \nEmbedding `onevec`: 1 vector.")  # (its two, and the comma)
    assert count("a photo of myemb cat", ()) == count("a photo of myemb cat", (("other", 2),)).split(" · ")[0]
    assert "Embedding" not in count("a photo of myemb cat", ())
    assert count("", here) == "0 / 225 tokens · embeddings: `myemb`, `onevec`"
    many = count("a cat", tuple((f"e{i}", 1) for i in range(14)))
    assert many.endswith("tokens · embeddings: `e0`, `e1`, `e2`, `e3`, `e4`, `e5`, `e6`, `e7`, `e8`, `e9`, `e10`, "
                         "`e11` and 2 more")


def test_server_warm_up_states_and_errors():
    release = threading.Event()

    class FakePipeline(LoadedStandIn):
        sizes = SIZES

    def slow_loader(settings):
        release.wait(10)
        return FakePipeline()

    server = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES)), loader=slow_loader)
    thread = server.start()
    assert server.warmup.status == "loading" and not server.ready
    with pytest.raises(RequestError, match="still warming up"):
        server.generate(_validate())
    release.set()
    thread.join(10)
    assert server.ready and server.warmup.message.startswith("Ready")

    def failing_loader(settings):
        raise OSError("repository not found")

    broken = Server(Settings(load=LoadOptions(model="nobody/nothing")), loader=failing_loader)
    broken.warmup.load()
    assert broken.warmup.status == "error"
    error = broken.warmup.error
    assert "nobody/nothing" in error and "--model tiny" in error and "\n" not in error


def test_token_count_counts_the_styled_prompt_and_warns_when_cut(tiny_checkpoint, capfd):
    from sdxl_tpu import load_tokenizers

    tokenizer = load_tokenizers(tiny_checkpoint)[0]

    class Loaded(LoadedStandIn):  # once loaded: its tokenizers (nothing is generated here)
        sizes, tokenizers = SIZES, (tokenizer, None)

    server = Server(TINY, loader=lambda s: Loaded())
    assert "once the model is loaded" in server.token_count("a cat")
    assert server.token_count("") == server.token_count("  \t") == "0 / 225 tokens"  # nothing to encode
    server.warmup.load()
    ids = lambda text: len(tokenizer(text).input_ids) - 2  # without the start and end tokens, as A1111 counts
    assert server.token_count("a cat") == f"{ids('a cat')} / 225 tokens"
    # The style's template is part of what is encoded, so it is counted.
    styled = STYLES["Anime"][0].replace("{prompt}", "a cat")
    assert server.token_count("a cat", "Anime") == f"{ids(styled)} / 225 tokens" and ids(styled) > ids("a cat")
    assert server.token_count("", "Anime") == "0 / 225 tokens"
    # Emphasis is syntax, not tokens; a longer prompt takes more chunks (A1111 counts a full chunk as 75).
    assert server.token_count("a (cat:1.3)") == server.token_count("a cat")
    assert ids("a photo of a dog " * 14) > 75
    # (no commas: the first chunk holds 75 tokens, so the count is every token)
    assert server.token_count("a photo of a dog " * 14) == f"{ids('a photo of a dog ' * 14)} / 225 tokens, 2 chunks"
    Loaded.tokenizers = (load_tokenizers(tiny_checkpoint)[0], None)  # (transformers warns once per tokenizer)
    server = Server(TINY, loader=lambda s: Loaded())
    server.warmup.load()
    capfd.readouterr()
    long = server.token_count("a photo of a cat " * 60)
    assert "sequence length is longer" not in capfd.readouterr().err  # transformers' warning, not logged
    total = ids("a photo of a cat " * 60)
    assert long == (f"⚠️ **{total} / 225 tokens**, 3 chunks: the prompt will be cut after token 225; "
                    f"the last {total - 225} are ignored."), long


def test_display_helpers_take_any_client_value():
    assert style_description("Anime").startswith("**Prompt template:** `anime artwork {prompt}")
    assert style_description(["Anime"]).startswith("Style must be text, got a list")
    assert style_description("\ud800").startswith("Style '\\ud800' is not available")
    assert picked_item([5, 6, 7, 8], 2) == 7 and picked_item(["a.jpg", "b.jpg"], 1) == "b.jpg"
    for seeds, index in [([5], 1), ([5], -1), ([5], True), ([5], "0"), ([5], 0.0), (None, 0), ([5], None)]:
        assert picked_item(seeds, index) is None
    server = Server(Settings(load=LoadOptions(model="tiny")))
    assert server.token_count(["a"]) == "⚠️ Prompt must be text, got a list."
    assert server.token_count("x" * 20_001).startswith("⚠️ Prompt is 20,001 characters long")


def test_the_length_limit_applies_to_what_the_user_typed_not_the_style():
    request = _validate(prompt="x" * 1000, style="Fantasy art")
    assert len(request.prompt) > 1000 and "x" * 1000 in request.prompt


class SlowPipeline(LoadedStandIn):
    """A pipeline as a server sees it, each step 10 ms, each image one grey from its seed."""

    sizes, stamp = SIZES, "fake-model"

    def stamp_for(self, info):
        return self.stamp

    def run_images(self, infos, progress=None, stop=None):
        import time

        from PIL import Image

        from sdxl_tpu.request.errors import Cancelled
        from sdxl_tpu.request.request import GenerationResult

        for step in range(infos[0].steps):
            time.sleep(0.01)
            if stop():
                raise Cancelled(f"stopped after step {step + 1}")
            if progress is not None:
                progress(step + 1, infos[0].steps)
        width, height = infos[0].size  # each image one grey, from its seed
        images = [Image.new("RGB", (width, height), (i.seed * 40 % 256,) * 3) for i in infos]
        return GenerationResult(images=images, infos=list(infos),
                                timings={"text_encoding": 0.01, "denoising": 0.1, "decoding": 0.02,
                                         "total": 0.13})


def test_batch_count_runs_its_calls_in_one_run_with_progress_over_all(tmp_path):
    """Batch count 3 (A1111's): one run, three calls of four images, the seeds following on; the
    steps counted over all of them; the finished calls' images in view while the next one runs;
    one Done with all twelve. Stop in the second call ends the run there. Out of range: refused."""
    from sdxl_tpu.server.events import Done, Progress, Shown, Started
    from sdxl_tpu.server.files import ImageStore

    server = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES), image_format="png"),
                    loader=lambda s: SlowPipeline(), images=ImageStore(tmp_path))
    server.warmup.load()
    values = dict(prompt="a cat", seed=3, steps=4, batch_count=3)
    updates = list(server.stream(values, previews=False))
    started, done = updates[0], updates[-1]
    assert isinstance(started, Started) and (started.calls, started.steps, started.seeds) == (3, 4, list(range(3, 15)))
    progress = [(u.step, u.steps) for u in updates if isinstance(u, Progress)]
    assert progress == [(i, 12) for i in range(1, 13)]
    shown = [len(u.gallery) for u in updates if isinstance(u, Shown)]
    assert shown == [4, 8]  # (after the first and the second call)
    assert isinstance(done, Done) and done.seeds == list(range(3, 15)) and len(done.gallery) == 12
    assert [caption for _, caption in done.gallery] == [f"seed {s}" for s in range(3, 15)]
    assert done.summary.startswith("3 calls, 12 images. The last call: Generated 4 images")
    assert [type(u) for u in server.stream({**values, "batch_count": None}, previews=False)][-1] is Done
    steps_seen = []

    def stop_in_the_second_call() -> bool:
        return len(steps_seen) > 5

    stream = server.stream(values, abandoned=stop_in_the_second_call, previews=False)
    with pytest.raises(Exception, match="stopped after step"):
        for update in stream:
            if isinstance(update, Progress):
                steps_seen.append(update.step)
    assert steps_seen == [1, 2, 3, 4, 5, 6]
    for bad in (0, 33, 1.5, "many", True):
        with pytest.raises(RequestError, match="Batch count"):
            list(server.stream({**values, "batch_count": bad}, previews=False))


def test_drain_finishes_accepted_work_then_cancels_at_the_deadline(tmp_path):
    """Server.drain: not ready at once; a request that finishes in time gets its images, one that
    would outlast the deadline is cancelled there; afterwards new work is refused. (Through
    Server.generate itself: the fake pipeline's images are encoded and written to `tmp_path`.)"""
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from PIL import Image

    from sdxl_tpu.server.files import ImageStore
    from sdxl_tpu.a1111.images import read_parameters
    from sdxl_tpu.request.errors import Cancelled
    from sdxl_tpu.server.batcher import SHUTTING_DOWN

    def server_with(pipeline, folder):
        server = Server(Settings(load=LoadOptions(model="tiny", sizes=SIZES), image_format="png"),
                        loader=lambda s: pipeline, images=ImageStore(tmp_path / folder))
        server.warmup.load()
        return server

    server = server_with(SlowPipeline(), "first")
    steps_seen, running = [], threading.Event()

    def seen(step: int, steps: int) -> None:
        steps_seen.append((step, steps))
        running.set()

    with ThreadPoolExecutor(1) as pool:
        short = pool.submit(server.generate, _validate(steps=10, sampler="Euler"), progress=seen)
        assert running.wait(10)  # (the call runs: the drain is to let it finish)
        assert server.drain(seconds=5) is True
        gallery, seeds, info = short.result(5)
    assert seeds == [3, 4, 5, 6] and [caption for _, caption in gallery] == ["seed 3", "seed 4", "seed 5", "seed 6"]
    assert steps_seen == [(i, 10) for i in range(1, 11)]
    assert info.startswith("Generated 4 images of 64x64 in 0.13 s (text 0.01 s, denoising 0.10 s for 10 steps of "
                           "Euler (Schedule type Checkpoint, RNG JAX), decoding 0.02 s; ")
    assert info.endswith("Seeds: 3, 4, 5, 6.")
    for (path, _), seed in zip(gallery, seeds):  # written where the server serves from, parameters embedded
        assert Path(path).is_relative_to(tmp_path / "first")
        with Image.open(path) as image:
            assert (image.format, image.size, image.getpixel((0, 0))) == ("PNG", (64, 64), (seed * 40 % 256,) * 3)
            assert read_parameters(image).startswith("a cat\nSteps: 10, Sampler: Euler, ")
            assert f"Seed: {seed}, " in read_parameters(image) and "Model: fake-model" in read_parameters(image)
    assert server.metrics.registry.get_sample_value("sdxl_images_total") == 4
    assert (server.warmup.status == "draining" and not server.ready
            and server.metrics.registry.get_sample_value("sdxl_ready") == 0)
    with pytest.raises(RequestError, match=SHUTTING_DOWN):
        server.generate(_validate())

    server = server_with(SlowPipeline(), "second")
    running.clear()
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(server.generate, _validate(steps=50), progress=lambda step, steps: running.set())
        assert running.wait(10)
        start = time.monotonic()
        assert server.drain(seconds=0.1) is False
        assert time.monotonic() - start < 0.4
        with pytest.raises(Cancelled):
            long.result(5)
    assert not any(p.is_file() for p in (tmp_path / "second").rglob("*"))  # no images written for it


@pytest.fixture(scope="module")
def page_demo():
    """The page as app.py builds it (no model loaded)."""
    from sdxl_tpu.page.playground import build_demo

    return build_demo(Server(TINY))


def test_the_queue_looks_for_work_every_10_ms_not_every_1(page_demo):
    """Gradio's queue polls (for work, and for progress to send) while idle: at its own 1 ms and 10 ms,
    4.4 % of a core for nothing; the page's at 10 and 50 ms. (A Gradio that no longer polls by these
    attributes fails the first check: then see whether it still needs this.)"""
    import gradio as gr

    from sdxl_tpu.page.playground import QUEUE_POLL_SECONDS

    plain = gr.Blocks().queue()._queue
    assert (plain.sleep_when_free, plain.progress_update_sleep_when_free) == (0.001, 0.01)
    queue = page_demo._queue
    assert (queue.sleep_when_free, queue.progress_update_sleep_when_free) == QUEUE_POLL_SECONDS == (0.01, 0.05)


def test_sessions_kept_and_event_records_are_bounded(page_demo):
    """Gradio keeps each browser session's state (a copy of the page's configuration, some 260 kB),
    10,000 of them unless told: the page keeps SESSIONS_KEPT, the least recently used dropped first.
    Its queue keeps one event's record for the monitoring dashboard (off) and never sums them up in
    pandas. (Checked through Gradio's own objects: a Gradio that stops bounding by these attributes
    fails here.)"""
    from gradio.state_holder import StateHolder

    from sdxl_tpu.page.playground import SESSIONS_KEPT

    holder = StateHolder()
    holder.set_blocks(page_demo)
    assert holder.capacity == SESSIONS_KEPT == 1000
    holder.capacity = 3  # (a thousand sessions would take 11 s to make: the same rule, smaller)
    for session in ("a", "b", "c", "d", "e"):
        holder[session]
    holder["c"]  # used again: kept ahead of d and e
    holder["f"]
    assert list(holder.session_data) == ["e", "c", "f"]

    queue = page_demo._queue
    records = [{"time": 0.0, "status": "success", "process_time": 1.0, "function": "generate", "session_hash": "a"}]
    queue.events_recorded += 10**6
    assert queue.compute_analytics_summary(records * 100) is queue.cached_event_analytics_summary == {"functions": {}}
    assert queue.ANALYTICS_MAX_EVENTS == 1
