"""One table of options (sdxl_tpu/options.py) for the app, serve, generate, bench and make-tiny:
every parser is built from it, every option reads its environment variable in every command
that takes it, and docs/options.md's table is the one it writes."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from sdxl_tpu.__main__ import _build_parser
from sdxl_tpu.server.settings import Settings, parse_settings
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.cli.options import COMMANDS, OPTIONS, load_values, options_for
from sdxl_tpu.cli.parsing import add_options, fill_defaults
from sdxl_tpu.cli.options_table import markdown_table

ROOT = Path(__file__).resolve().parents[2]


def parse(command: str, argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(parser, command)
    required = [o.flag.upper() for o in options_for(command) if o.positional and o.default is None]
    return fill_defaults(parser, parser.parse_args(required + argv), command, env)


def samples(o) -> tuple[str, str]:
    """Two valid, different values of option `o`, as text."""
    if o.choices:
        return o.choices[0], o.choices[-1]
    return {int: ("3", "5"), float: ("2.5", "7.5")}.get(o.type, ("2", "3") if o.name == "preview_every" else ("a", "b"))


def test_no_parser_is_built_outside_the_table():
    """The options cannot drift apart again: no add_argument anywhere in the package or app.py
    but parsing.py's (from options.py's table)."""
    calls = []
    for path in [ROOT / "app.py", *sorted((ROOT / "sdxl_tpu").rglob("*.py"))]:
        if path.relative_to(ROOT).as_posix() == "sdxl_tpu/cli/parsing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == []


def test_each_command_has_each_flag_once_and_every_command_its_options():
    for command in COMMANDS:
        flags = [o.flag for o in options_for(command)]
        assert len(flags) == len(set(flags)), command
    subparsers = next(a for a in _build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("generate", "serve", "bench", "make-tiny"):
        actions = subparsers.choices[command]._actions
        seen = {s for a in actions for s in a.option_strings or [a.dest]} - {"-h", "--help"}
        assert seen == {o.flag if not o.positional else o.name for o in options_for(command)}, command
    # Options with one name mean the same in every command that shares a row, and the model's options
    # are the same rows for the servers, generate and bench (the drift the table removed).
    for flag in ("--model", "--dtype", "--attention", "--lora", "--unet", "--spacing", "--prediction-type"):
        rows = [o for o in OPTIONS if o.flag == flag]
        assert len(rows) == 1 and set(rows[0].commands) == {"app", "serve", "generate", "bench"}, flag


@pytest.mark.parametrize("command", ["app", "serve", "generate", "bench"])
def test_command_line_wins_over_environment_which_wins_over_default(command):
    for o in options_for(command):
        if o.switch or o.positional:
            continue
        first, second = samples(o)
        default = parse(command, [], {}).__dict__[o.name]
        assert default == o.default, (command, o.flag)
        if o.env is None:
            assert parse(command, [], {"SDXL_" + o.name.upper(): first}).__dict__[o.name] == default
            continue
        value = lambda text, o=o: [text] if o.action == "append" else o.type(text)
        assert parse(command, [], {o.env: first}).__dict__[o.name] == value(first), (command, o.flag)
        assert parse(command, [o.flag, second], {o.env: first}).__dict__[o.name] == value(second), (command, o.flag)
        assert parse(command, [], {o.env: "  "}).__dict__[o.name] == default  # blank: unset


def test_generate_reads_the_environment_like_the_servers():
    """Before the table, `generate` ignored SDXL_DTYPE (and the model's other variables) and listed
    no presets."""
    env = {"SDXL_DTYPE": "float32", "SDXL_MODEL": "tiny", "SDXL_LORA": "a.safetensors, b.safetensors:0.5",
           "SDXL_TPU_ATTENTION": "xla", "SDXL_SCHEDULE": "Karras"}
    args = parse("generate", ["a cat"], env)
    assert (args.dtype, args.model, args.lora, args.attention, args.schedule) == (
        "float32", "tiny", ["a.safetensors", "b.safetensors:0.5"], "xla", "Karras")
    served = parse_settings([], env=env)
    assert (served.load.dtype, served.load.model, served.load.loras, served.load.attention, served.schedule) == (
        "float32", "tiny", ("a.safetensors", "b.safetensors:0.5"), "xla", "Karras")
    help_text = _build_parser()._actions[1].choices["generate"].format_help()
    assert "Lightning 4-step" in " ".join(help_text.split()) and "SDXL_DTYPE" in help_text


def test_generate_takes_pasted_parameters_before_the_environment():
    parser = argparse.ArgumentParser()
    add_options(parser, "generate")
    args = fill_defaults(parser, parser.parse_args(["--rng", "JAX"]), "generate", {"SDXL_SCHEDULE": "Karras",
                                                                                  "SDXL_RNG": "CPU"},
                         given={"schedule": "Exponential", "rng": "CPU", "prompt": "a dog"})
    assert (args.schedule, args.rng, args.prompt) == ("Exponential", "JAX", "a dog")


@pytest.mark.parametrize("env, named", [
    ({"SDXL_QUEUE_SIZE": "many"}, "SDXL_QUEUE_SIZE (for --queue-size) must be a whole number, got 'many'"),
    ({"SDXL_DRAIN_SECONDS": "1m"}, "SDXL_DRAIN_SECONDS (for --drain-seconds) must be a number, got '1m'"),
    ({"SDXL_DTYPE": "float16"}, "SDXL_DTYPE (for --dtype) must be one of bfloat16, float32, got 'float16'"),
    ({"SDXL_PRESET": "Ultra"}, "SDXL_PRESET (for --preset) must be one of"),
    ({"SDXL_PREVIEW_EVERY": "often"}, "SDXL_PREVIEW_EVERY (for --preview-every) must be 'auto' or a whole number"),
    ({"GRADIO_SERVER_PORT": "http"}, "GRADIO_SERVER_PORT (for --port) must be a whole number"),
])
def test_a_bad_environment_value_is_one_line_naming_the_variable(env, named, capsys):
    """Before the table, a bad number in the environment was a traceback at start (int() on it)."""
    with pytest.raises(SystemExit) as exit_:
        parse_settings([], env=env)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and named in err and "Traceback" not in err


def test_settings_defaults_are_the_tables():
    s, parsed = Settings(), parse_settings([], env={})
    for field in ("load", "host", "port", "queue_size", "image_format", "keep_images_seconds", "max_image_bytes",
                  "drain_seconds", "metrics", "compile_cache", "schedule", "rng"):
        assert getattr(s, field) == getattr(parsed, field), field
    assert LoadOptions() == LoadOptions.of(load_values(parse("generate", ["a cat"], {}), "generate"))


def test_the_documented_table_is_the_tables():
    doc = (ROOT / "docs" / "options.md").read_text()
    begin, end = "<!-- options table: begin -->\n", "\n<!-- options table: end -->"
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == markdown_table(), (
        "docs/options.md's option table is stale: rewrite it with `python -m sdxl_tpu.cli.options_table`")


def test_mcp_is_on_by_itself_on_a_space_only_and_the_api_key_reads_its_variable():
    """--mcp auto (the default) serves the MCP tool where Hugging Face runs the app (SPACE_ID set),
    not elsewhere; on and off say so anywhere. --api-key reads SDXL_API_KEY; empty is no key."""
    space = {"SPACE_ID": "someone/sdxl"}
    assert [parse_settings(["--model", "tiny", *mcp], env=env).mcp
            for mcp in ([], ["--mcp", "on"], ["--mcp", "off"]) for env in ({}, space)] == [
        False, True, True, True, False, False]
    assert parse_settings(["--model", "tiny"], env={"SDXL_API_KEY": "k1"}).api_key == "k1"
    assert parse_settings(["--model", "tiny"], env={"SDXL_API_KEY": " "}).api_key is None
    assert parse_settings(["--model", "tiny", "--api-key", "k2"], env={"SDXL_API_KEY": "k1"}).api_key == "k2"


def test_wildcards_is_a_folder_from_the_command_line_or_its_variable(tmp_path, capsys):
    """--wildcards (SDXL_WILDCARDS): the server's folder of wildcard files; anything but a folder
    ends the program with one line naming the option."""
    assert parse_settings(["--model", "tiny"], env={}).wildcards is None
    assert parse_settings(["--model", "tiny"], env={"SDXL_WILDCARDS": str(tmp_path)}).wildcards == str(tmp_path)
    (tmp_path / "color.txt").write_text("red\n")
    for given in ([str(tmp_path / "color.txt")], [str(tmp_path / "nowhere")]):
        with pytest.raises(SystemExit):
            parse_settings(["--model", "tiny", "--wildcards", *given], env={})
        assert "--wildcards must be a folder of wildcard files" in capsys.readouterr().err


def test_embeddings_is_a_folder_from_the_command_line_or_its_variable(tmp_path, capsys):
    """--embeddings (SDXL_EMBEDDINGS): the folder of textual inversion embeddings, loaded with the
    model; anything but a folder ends the program with one line naming the option."""
    assert parse_settings(["--model", "tiny"], env={}).load.embeddings is None
    assert parse_settings(["--model", "tiny"], env={"SDXL_EMBEDDINGS": str(tmp_path)}).load.embeddings == str(tmp_path)
    (tmp_path / "x.safetensors").write_bytes(b"")
    for given in ([str(tmp_path / "x.safetensors")], [str(tmp_path / "nowhere")]):
        with pytest.raises(SystemExit):
            parse_settings(["--model", "tiny", "--embeddings", *given], env={})
        assert "--embeddings must be a folder of embedding files" in capsys.readouterr().err
