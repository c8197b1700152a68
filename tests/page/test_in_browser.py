"""What the page does in the browser (sdxl_tpu/page/web/in_browser.js): the form's rules against
their Python twins, in Node, on every input the menus can hold (the page's browser tests see them
act, this sees every case); the run panel's answers are the server's own."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from sdxl_tpu.page.in_browser import NOT_TAKEN, SCRIPT, browser_config, offered_now
from sdxl_tpu.page.page import CUSTOM, matching_preset, preset_fields, run_panel
from sdxl_tpu.page.sampler_menu import CHECKPOINT_KARRAS, KARRAS, fitted_schedule, menu_pair, menu_samplers
from sdxl_tpu.request.fields import FIELDS, FORM, HISTORY
from sdxl_tpu.request.names import SAMPLERS, SCHEDULES
from sdxl_tpu.request.recipes import RECIPES

PRESETS = preset_fields(RECIPES.values())
CONFIG = browser_config(PRESETS)


def in_the_browser(calls: list[tuple[str, list]]) -> list:
    """Each (rule, arguments) as the page's JavaScript computes it (Node, as the tests' npm tools)."""
    node = shutil.which("node")
    assert node, "Node is not installed (README's test command installs it with npm)"
    script = (f"const rules = ({SCRIPT})({json.dumps(CONFIG)});\n"
              f"const calls = {json.dumps(calls)};\n"
              "console.log(JSON.stringify(calls.map(([rule, args]) => rules[rule](...args))));")
    # (the script on stdin: no limit on its size, as an argument has)
    done = subprocess.run([node, "-"], input=script, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_menus_pair_is_menu_pair():
    pairs = [(sampler, schedule) for sampler in [*SAMPLERS, None, 5] for schedule in [*SCHEDULES, CHECKPOINT_KARRAS]]
    got = in_the_browser([("menuPair", list(pair)) for pair in pairs])
    assert [tuple(g) for g in got] == [menu_pair(*pair) for pair in pairs]
    assert any(s.endswith(KARRAS) for s in SAMPLERS)  # (so the translation is exercised)


@pytest.mark.parametrize("offered", ["all", "some"])
def test_the_schedule_menu_follows_the_sampler_as_fitted_schedule_does(offered):
    """Every sampler (those offered, others, none) with every schedule the menus can hold, against
    the Python rule: the menu, and the schedule kept or the first; before the page knows the model,
    the menu is left as it is."""
    samplers = list(SAMPLERS) if offered == "all" else [s for s in SAMPLERS if "DPM" in s or s == "DDIM"]
    schedules = list(SCHEDULES)
    cases = [[sampler, schedule, offered_now([], samplers, schedules)]
             for sampler in [*menu_samplers(SAMPLERS), "DPM++ 2M Karras", "nonesuch", None, 5]
             for schedule in [*SCHEDULES, CHECKPOINT_KARRAS, None]]
    got = in_the_browser([("fitSchedule", case) for case in cases] + [("fitSchedule", ["Euler", "Karras", ""])])
    for (sampler, schedule, _), update in zip(cases, got):
        menu, kept = fitted_schedule(sampler, schedule, samplers, schedules)
        assert update == {"__type__": "update", "choices": [list(pair) for pair in menu], "value": kept}, (sampler,
                                                                                                         schedule)
    assert got[-1] == {"__type__": "update"}
    assert {u["value"] for u in got[:-1]} >= {"Checkpoint", CHECKPOINT_KARRAS, "Karras"}  # (kept and replaced)


@pytest.mark.parametrize("offered", ["all", "none"])
def test_the_preset_menu_follows_the_fields_as_matching_preset_does(offered):
    """Each preset's own values (as the menus show them), and each nudged, against the Python rule on
    the sampler as a request names it; a preset the menu does not offer is never chosen."""
    names = list(PRESETS) if offered == "all" else []
    cases = []
    for steps, sampler, guidance in PRESETS.values():
        menu_sampler, menu_schedule = menu_pair(sampler, "Checkpoint")
        for nudged in [(steps, guidance), (steps + 1, guidance), (steps, guidance + 0.5)]:
            cases.append([nudged[0], menu_sampler, menu_schedule, nudged[1], offered_now(names, SAMPLERS, SCHEDULES)])
    got = in_the_browser([("matchingPreset", case) for case in cases])
    for case, name in zip(cases, got):
        steps, sampler, schedule, guidance, _ = case
        named = sampler + KARRAS if schedule == CHECKPOINT_KARRAS else sampler
        expected = matching_preset(PRESETS, steps, named, guidance) if names else CUSTOM
        assert name == expected, case
    assert CUSTOM in got and (set(got) - {CUSTOM} if names else True)  # (both outcomes exercised)


def test_a_preset_fills_steps_sampler_schedule_and_guidance():
    cases = [[name, 20, "Euler", schedule, 5.0] for name in PRESETS for schedule in ("Checkpoint", CHECKPOINT_KARRAS,
                                                                                      "Karras")]
    cases.append(["no such preset", 20, "Euler", "Karras", 5.0])
    got = in_the_browser([("presetFill", case) for case in cases])
    for case, values in zip(cases, got):
        if case[0] not in PRESETS:
            assert values == case[1:]
            continue
        steps, sampler, guidance = PRESETS[case[0]]
        schedule = "Checkpoint" if case[3] == CHECKPOINT_KARRAS else case[3]
        assert values == [steps, *menu_pair(sampler, schedule), guidance], case


def test_a_history_row_restores_what_it_kept_and_what_a_restored_run_sets():
    """Each field the history keeps from the row (a missing optional one: its default), the fields a
    restored run sets, the rest as the form holds them; a row past the history's end changes nothing."""
    form = [f"form-{f.name}" for f in FIELDS]
    row = {f.name: f"row-{f.name}" for f in FIELDS if HISTORY in f.kept}
    row.update(sampler="DPM++ 2M Karras", schedule="Checkpoint")
    del row["style"]  # (a run kept before the style field existed)
    got, unchanged = in_the_browser([("restoreHistory", [0, [row], *form]), ("restoreHistory", [3, [row], *form])])
    assert unchanged == form
    for i, f in enumerate(FIELDS):
        if HISTORY in f.kept and f.name in row:
            expected = row[f.name]
        elif HISTORY in f.kept:
            expected = f.default if f.optional and f.default is not None else form[i]
        else:
            expected = f.restored if f.restored is not None else form[i]
        if f.name in ("sampler", "schedule"):
            expected = menu_pair("DPM++ 2M Karras", "Checkpoint")[FORM.index(f.name) - FORM.index("sampler")]
        assert got[i] == expected, f.name


def test_the_panels_answers_and_the_examples_are_the_servers():
    """A run not taken says so in the panel the server draws; Stop's panel likewise, unless the run
    had ended as Stop was pressed (its "Done" stays); an example fills the prompt with its text (the
    page script's Stop mark is the browser tests' part)."""
    done, running = run_panel("done", "Done in 3.1 s."), run_panel("running", "Generating · step 3 of 20", 3, 20)
    got = in_the_browser([("stoppedRun", [running]), ("example", [1]), ("randomSeed", []), ("stoppedRun", [done]),
                          ("stoppedRun", [run_panel("queued", "Waiting")])])
    assert got[0] == got[4] == run_panel("stopped", "Stopped.") and got[2] == -1
    assert got[3] == done  # (Stop pressed as the run ended: its end stays said)
    from sdxl_tpu.server.form import EXAMPLES

    assert got[1] == EXAMPLES[1] and NOT_TAKEN in CONFIG["panels"]["notTaken"]
