"""The playground's logic without a browser: settings, styles, input checks, warm-up state."""

from __future__ import annotations

import threading

import pytest

from sdxl_tpu.playground import (STYLES, Server, Settings, UserInputError, apply_style, clean_text, parse_settings,
                                 validate)

SIZES = [(64, 64), (96, 64)]
OK = dict(prompt="a cat", negative="", style="(No style)", seed=3, randomize=False, guidance=5.0, steps=20,
          size="64x64")


def _validate(**overrides):
    args = {**OK, **overrides}
    return validate(args["prompt"], args["negative"], args["style"], args["seed"], args["randomize"],
                    args["guidance"], args["steps"], args["size"], SIZES)


def test_ten_styles_with_templates():
    for name in ("(No style)", "Cinematic", "Photographic", "Anime", "Manga", "Digital Art", "Pixel art",
                 "Fantasy art", "Neonpunk", "3D Model"):
        assert "{prompt}" in STYLES[name][0]
    assert apply_style("Anime", "a cat", "blurry") == (
        "anime artwork a cat . anime style, key visual, vibrant, studio anime, highly detailed",
        "photo, deformed, black and white, realism, disfigured, low contrast, blurry")
    assert apply_style("(No style)", "a cat", "") == ("a cat", "")


def test_clean_text_strips_control_characters_and_caps_length():
    assert clean_text("a\x00cat\x1b[31m\u200b\tand\ndog  ") == "a cat [31m and dog"
    assert len(clean_text("x" * 5000)) == 1000
    assert clean_text(None) == ""


@pytest.mark.parametrize("overrides, message", [
    (dict(prompt=" \x00 "), "Please enter a prompt."),
    (dict(seed=-1), "Seed must be a whole number between 0 and 4294967295."),
    (dict(seed=2**32), "Seed must be a whole number between 0 and 4294967295."),
    (dict(seed=1.5), "Seed must be a whole number"),
    (dict(seed="abc"), "Seed must be a number"),
    (dict(guidance=float("nan")), "Guidance scale must be a finite number"),
    (dict(guidance=20.5), "Guidance scale must be between 0 and 20."),
    (dict(steps=0), "Steps must be a whole number between 1 and 50."),
    (dict(steps=7.5), "Steps must be a whole number between 1 and 50."),
    (dict(size="1024x1024"), "Size 1024x1024 is not available; choose one of: 64x64, 96x64"),
    (dict(size="big"), "size must look like WIDTHxHEIGHT"),
    (dict(style="Bogus"), "Unknown style 'Bogus'"),
])
def test_validation_messages(overrides, message):
    with pytest.raises(UserInputError, match=message.replace(".", r"\.").replace("(", r"\(")):
        _validate(**overrides)


def test_valid_request_and_random_seed():
    request = _validate(style="Pixel art", negative="blurry", steps=12.0, size="96x64")
    assert request.prompt.startswith("pixel-art a cat") and request.negative_prompt.endswith(", blurry")
    assert (request.steps, request.size, request.seed) == (12, (96, 64), 3)
    seeds = {_validate(randomize=True).seed for _ in range(5)}
    assert len(seeds) > 1 and all(0 <= s < 2**32 for s in seeds)


def test_settings_from_arguments_and_environment():
    s = parse_settings([], env={"SDXL_MODEL": "tiny", "SDXL_SIZES": "64x64, 96x64", "GRADIO_SERVER_PORT": "9000",
                                "GRADIO_SERVER_NAME": "0.0.0.0", "SDXL_DTYPE": "float32"})
    assert (s.model, s.sizes, s.port, s.host, s.dtype) == ("tiny", [(64, 64), (96, 64)], 9000, "0.0.0.0", "float32")
    s = parse_settings(["--model", "/data/sdxl", "--sizes", "1024x1024,1152x896", "--port", "7000"], env={})
    assert (s.model, s.sizes, s.port, s.host) == ("/data/sdxl", [(1024, 1024), (1152, 896)], 7000, "127.0.0.1")
    assert parse_settings([], env={}).sizes == [(1024, 1024)]
    assert parse_settings(["--model", "tiny"], env={}).sizes == [(256, 256)]  # quick to try on a CPU
    with pytest.raises(SystemExit):
        parse_settings(["--sizes", "huge"], env={})


def test_server_warm_up_states_and_errors():
    release = threading.Event()

    class FakePipeline:
        sizes = SIZES
        tokenizers = (None, None)

    def slow_loader(settings):
        release.wait(10)
        return FakePipeline()

    server = Server(Settings(model="tiny", sizes=SIZES), loader=slow_loader)
    thread = server.start()
    assert server.status == "loading" and not server.ready
    with pytest.raises(UserInputError, match="still warming up"):
        server.generate(_validate())
    release.set()
    thread.join(10)
    assert server.ready and server.message.startswith("Ready")

    def failing_loader(settings):
        raise OSError("repository not found")

    broken = Server(Settings(model="nobody/nothing"), loader=failing_loader)
    broken.load()
    assert broken.status == "error"
    assert "nobody/nothing" in broken.error and "--model tiny" in broken.error and "\n" not in broken.error


def test_token_count_warns_when_truncated(tiny_checkpoint):
    from sdxl_tpu import load_tokenizers

    server = Server(Settings(model="tiny"))
    assert "once the model is loaded" in server.token_count("a cat")
    server.tokenizer = load_tokenizers(tiny_checkpoint)[0]
    assert server.token_count("a cat").endswith("/ 77 tokens") and "⚠️" not in server.token_count("a cat")
    long = server.token_count("a photo of a cat " * 40)
    assert "⚠️" in long and "truncated" in long
