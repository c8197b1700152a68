"""Dynamic prompts (sd-dynamic-prompts' and Fooocus' syntax, issue 54 item 2): what each form makes,
the same prompt for the same seed, every combination listed, wildcards read from their folder only,
and hostile templates refused with one clear line."""

from __future__ import annotations

import collections
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdxl_tpu.a1111.dynamic_prompts import (MAX_COMBINATIONS, MAX_PROMPT_CHARS, MAX_WILDCARD_BYTES, Wildcards,
                                            combinations, draw, is_dynamic)
from sdxl_tpu.request.errors import RequestError

NONE = Wildcards(None)


@pytest.fixture
def wildcards(tmp_path):
    (tmp_path / "color.txt").write_text("red\n# a comment\n\n  blue  \n{light|dark} __animals/bird__\n")
    (tmp_path / "animals").mkdir()
    (tmp_path / "animals" / "bird.txt").write_text("owl\n")
    (tmp_path / "animals" / "cat.txt").write_text("tabby\nsiamese\n")
    return Wildcards(tmp_path)


def test_each_form_makes_what_sd_dynamic_prompts_makes():
    assert combinations("a {red|blue} cat", NONE) == ["a red cat", "a blue cat"]
    assert combinations("{2$$a|b|c}", NONE) == ["a, b", "a, c", "b, c"]
    assert combinations("{1-2$$ and $$a|b}", NONE) == ["a", "b", "a and b"]
    assert combinations("{a|{b|c}d}", NONE) == ["a", "bd", "cd"]
    assert combinations("{|x}y", NONE) == ["y", "xy"]  # an empty option
    assert combinations("\\{a\\|b\\} snake_case __x", NONE) == ["{a|b} snake_case __x"]  # text as written
    assert is_dynamic("{a|b}") and not is_dynamic("a (cat:1.2) [dog|fox] BREAK")  # A1111's own syntax is text


def test_each_image_draws_from_its_seed():
    template = "a {red|green|blue|white} {cat|dog|fox}"
    made = [draw(template, seed, NONE) for seed in range(40)]
    assert made == [draw(template, seed, NONE) for seed in range(40)]  # the same seed, the same prompt
    assert set(made) == set(combinations(template, NONE))  # 40 draws of 12: all seen
    # Several drawn at once come in the order drawn, as sd-dynamic-prompts' random sampler gives them.
    pairs = {draw("{2$$ and $$x|y|z}", seed, NONE) for seed in range(60)}
    assert {" and ".join(sorted(p.split(" and "))) for p in pairs} == {"x and y", "x and z", "y and z"}
    assert len(pairs) == 6


def test_weights_set_how_often_an_option_is_drawn():
    assert {draw("{0::never|1::always}", seed, NONE) for seed in range(50)} == {"always"}
    counts = collections.Counter(draw("{3::a|1::b}", seed, NONE) for seed in range(4000))
    assert 0.72 < counts["a"] / 4000 < 0.78, counts  # 3 to 1


def test_wildcards_are_the_lines_of_the_folders_files(wildcards):
    assert wildcards.names() == ["animals/bird", "animals/cat", "color"]
    assert combinations("__color__ cat", wildcards) == ["red cat", "blue cat", "light owl cat", "dark owl cat"]
    assert combinations("__animals/*__", wildcards) == ["owl", "tabby", "siamese"]
    assert {draw("__animals/cat__", seed, wildcards) for seed in range(30)} == {"tabby", "siamese"}


def test_a_wildcard_is_a_name_never_a_path(wildcards, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("the secret\n")
    os.symlink(outside / "secret.txt", wildcards.folder / "linked.txt")
    os.symlink(outside, wildcards.folder / "linked_dir")
    fresh = Wildcards(wildcards.folder)
    assert "linked" not in fresh.names() and not any(n.startswith("linked_dir") for n in fresh.names())
    for template in ("__linked__", "__linked_dir/secret__"):
        with pytest.raises(RequestError, match="which is not in the wildcards folder"):
            draw(template, 1, fresh)
    for template in ("__../outside/secret__", "__/etc/passwd__", "__C:\\x__", "a __./color__ b", "__sub/../x__"):
        with pytest.raises(RequestError, match="never by a path"):  # (refused, in every mode that reads them)
            draw(template, 1, fresh)
        with pytest.raises(RequestError, match="never by a path"):
            combinations(template, NONE)
    assert draw("__color.txt__ at __3.5__", 1, fresh) == "__color.txt__ at __3.5__"  # not a name: text
    with pytest.raises(RequestError, match=r"__nope__, which is not in the wildcards folder; its wildcards: __anim"):
        draw("__nope__", 1, fresh)
    with pytest.raises(RequestError, match="no wildcards folder was given"):
        draw("__color__", 1, NONE)


@pytest.mark.parametrize("template, message", [
    ("a {red|blue", "without its closing }"),
    ("{3-1$$a|b}", "at least 3 but at most 1"),
    ("{x$$a|b}", "not a number or a range"),
    ("{500$$a|b}", "more than 100 options"),
    ("{" * 40 + "}" * 40, "nested more than 12 deep"),
    ("{100$$" + "|".join("{" + "|".join(["x" * 300] * 2) + "}" for _ in range(100)) + "}",
     f"over {MAX_PROMPT_CHARS} characters"),
], ids=["unclosed", "backwards-range", "not-a-count", "too-many-picks", "too-deep", "too-long"])
@pytest.mark.parametrize("make", [lambda t: draw(t, 7, NONE), lambda t: combinations(t, NONE)],
                         ids=["random", "combinatorial"])
def test_hostile_templates_are_refused_in_one_line(template, message, make):
    with pytest.raises(RequestError, match=message) as refused:
        make(template)
    assert "\n" not in str(refused.value)


def test_a_template_of_too_many_combinations_is_refused():
    with pytest.raises(RequestError, match=f"more than {MAX_COMBINATIONS} prompts"):
        combinations("{a|b|c|d|e|f|g|h|i|j}" * 5, NONE)


def test_wildcards_that_name_themselves_or_are_too_big_are_refused(tmp_path):
    (tmp_path / "loop.txt").write_text("a __loop__\n")
    (tmp_path / "big.txt").write_bytes(b"x\n" * (MAX_WILDCARD_BYTES // 2 + 1))
    loop = Wildcards(tmp_path)
    with pytest.raises(RequestError, match="nested more than"):
        draw("__loop__", 1, loop)
    with pytest.raises(RequestError, match="nested more than"):
        combinations("__loop__", loop)
    with pytest.raises(RequestError, match="__big__ is over 1 MB"):
        draw("__big__", 1, loop)
    (tmp_path / "gone.txt").write_text("x\n")
    listed = Wildcards(tmp_path)
    assert "gone" in listed.names()
    (tmp_path / "gone.txt").unlink()  # (after the folder was listed)
    with pytest.raises(RequestError, match="__gone__ could not be read"):
        draw("__gone__", 1, listed)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab{}|$:_\\/.-*0123 ")), max_size=60), st.integers(0, 2**32 - 1))
def test_any_template_makes_a_prompt_or_a_clear_refusal(template, seed):
    for make in (lambda: draw(template, seed, NONE), lambda: combinations(template, NONE, limit=200)):
        try:
            made = make()
        except RequestError as e:
            assert str(e) and "\n" not in str(e)
        else:
            assert isinstance(made, (str, list))


def test_a_request_draws_each_images_prompts_and_keeps_the_templates(wildcards):
    """Request.of reads the prompts as templates (Random by default, as sd-dynamic-prompts): each
    image's prompt and negative prompt from its own seed, the templates kept for its parameters
    text (sd-dynamic-prompts' "Template" and "Negative Template", read back by the paste); Off
    keeps the text, Combinatorial takes the combinations in order, from the first again."""
    from sdxl_tpu.a1111.infotext import parameters_text, parse, request_fields
    from sdxl_tpu.request.request import Request

    template, negative = "a {big|small} __animals/cat__, __color__", "{blurry|dark}"
    infos = Request.of(template, negative, seed=10, size=(64, 64), wildcards=wildcards).images(4)
    assert [i.prompt for i in infos] == [draw(template, 10 + k, wildcards) for k in range(4)]
    assert [i.negative_prompt for i in infos] == [draw(negative, 10 + k, wildcards) for k in range(4)]
    assert {i.template for i in infos} == {template} and {i.negative_template for i in infos} == {negative}
    text = parameters_text(infos[0], "model")
    assert text.startswith(f"{infos[0].prompt}\nNegative prompt: {infos[0].negative_prompt}\n")
    assert f'Template: "{template}", Negative Template: {negative}, Version: ' in text
    fields, notes = request_fields(parse(text), [(64, 64)], ["Euler"])
    assert fields["prompt"] == infos[0].prompt and any(n.startswith("Template: ") for n in notes), notes

    off = Request.of(template, seed=10, size=(64, 64), dynamic_prompts="Off").images(2)
    assert [(i.prompt, i.template) for i in off] == [(template, None)] * 2
    assert "Template" not in parameters_text(off[0], "model")
    plain = Request.of("a cat (red:1.2) [dog|fox]", seed=10, size=(64, 64)).images(1)[0]
    assert (plain.prompt, plain.template) == ("a cat (red:1.2) [dog|fox]", None)  # A1111's syntax is not a template
    each = Request.of("{a|b}-{c|d}", seed=3, size=(64, 64), dynamic_prompts="Combinatorial").images(6)
    assert [i.prompt for i in each] == ["a-c", "a-d", "b-c", "b-d", "a-c", "a-d"]
    lists = Request.of(["{x|y}", "plain"], seed=[1, 2], size=(64, 64), count=2).images(2)
    assert [(i.prompt, i.template) for i in lists] == [(draw("{x|y}", 1, NONE), "{x|y}"), ("plain", None)]


def test_a_request_refuses_what_some_draw_would_fail_on_before_any_work(tmp_path):
    """Every wildcard a template can reach is looked up when the request is checked (a typo in a
    wildcard's own lines too), an empty one is refused, and the message names the field."""
    from sdxl_tpu.request.request import Request

    (tmp_path / "outer.txt").write_text("fine\n{ok|__inner_typo__}\n")
    (tmp_path / "empty.txt").write_text("# nothing here\n\n")
    folder = Wildcards(tmp_path)
    with pytest.raises(RequestError, match=r"^Prompt: The template names the wildcard __inner_typo__"):
        Request.of("a __outer__", size=(64, 64), wildcards=folder)
    with pytest.raises(RequestError, match=r"^Negative prompt: The wildcard __empty__ has no lines"):
        Request.of("a cat", "__empty__", size=(64, 64), wildcards=folder)
    with pytest.raises(RequestError, match=r"^Dynamic prompts 'random' is not available"):
        Request.of("a cat", size=(64, 64), dynamic_prompts="random")
    assert Request.of("a __outer__", size=(64, 64), wildcards=folder, dynamic_prompts="Off").prompt == "a __outer__"
    # A front end's (no wildcards of its own: its back end makes the prompts) checks the syntax alone.
    sent = Request.of("a __outer__", size=(64, 64), wildcards=None)
    assert [i.prompt for i in sent.images(2)] == ["a __outer__"] * 2
    with pytest.raises(RequestError, match="without its closing"):
        Request.of("a {b", size=(64, 64), wildcards=None)
    assert combinations("{3$$a|b}", NONE) == ["a, b"]  # (more asked than there are: all, as a draw takes)
