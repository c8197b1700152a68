"""tests/helpers/axe.py finds what axe-core should find: known violations on tiny pages are reported by
rule id and impact, exclusions and the impact filter hold, a clean page gives none, and a missing
axe-core fails with the command that installs it."""

import pytest
from served_app import chromium

import axe

CLEAN = """<!doctype html><html lang="en"><head><title>Clean</title></head><body><main>
<h1>Clean page</h1><p>Readable text.</p>
<img id="dot" alt="A red dot" src="data:image/gif;base64,R0lGODlhAQABAIAAAP8AAP///yH5BAAAAAAALAAAAAABAAEAAAICRAEAOw==">
<button type="button">Generate</button>
</main></body></html>"""

# The clean page with three known faults: an image without alt text (image-alt, critical), a button
# with no text (button-name, critical) and light grey on white (color-contrast, serious).
BROKEN = CLEAN.replace(' alt="A red dot"', "").replace(
    '<button type="button">Generate</button>',
    '<button id="empty" type="button"></button><p id="faint" style="color:#ddd;background:#fff">Faint text</p>')


@pytest.fixture(scope="module")
def page():
    with chromium() as browser:
        context = browser.new_context()
        yield context.new_page()
        context.close()


def ids(violations):
    return {v["id"]: v["impact"] for v in violations}


def test_known_violations_are_reported(page):
    page.set_content(BROKEN)
    found = axe.axe_violations(page)
    assert ids(found) == {"image-alt": "critical", "button-name": "critical", "color-contrast": "serious"}, (
        axe.describe(found))
    by_id = {v["id"]: v for v in found}
    assert [n["target"] for n in by_id["image-alt"]["nodes"]] == ["#dot"]
    assert [n["target"] for n in by_id["color-contrast"]["nodes"]] == ["#faint"]
    assert by_id["color-contrast"]["nodes"][0]["failureSummary"].startswith("Fix any of the following")
    message = axe.describe(found)
    assert "image-alt (critical)" in message and "#empty" in message and "color-contrast (serious)" in message


def test_exclusions_and_impacts_filter(page):
    page.set_content(BROKEN)
    assert ids(axe.axe_violations(page, exclude=("#dot", "#faint"))) == {"button-name": "critical"}
    assert ids(axe.axe_violations(page, impacts=("critical",))) == {"image-alt": "critical",
                                                                     "button-name": "critical"}
    assert ids(axe.axe_violations(page, impacts="serious")) == {"color-contrast": "serious"}
    with pytest.raises(AssertionError, match="unknown axe impacts"):
        axe.axe_violations(page, impacts=("severe",))


def test_a_clean_page_has_none(page):
    page.set_content(CLEAN)
    found = axe.axe_violations(page)
    assert found == [], axe.describe(found)
    assert axe.describe(found) == "no axe violations"


def test_missing_axe_core_fails_with_the_install_command(page, monkeypatch, tmp_path):
    monkeypatch.setattr(axe, "AXE_JS", tmp_path / "axe.min.js")
    page.set_content(CLEAN)
    with pytest.raises(pytest.fail.Exception, match="README's test command.*npm ci --prefix tests"):
        axe.axe_violations(page)
