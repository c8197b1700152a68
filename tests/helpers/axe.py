"""axe-core, the accessibility checker, run on a Playwright page: `axe_violations(page)` returns the
rules a page breaks at the given impacts, `describe(...)` words them for an assertion message.

axe-core comes from npm (tests/package.json, locked in tests/package-lock.json); README's test
command installs it into tests/node_modules with `npm ci --prefix tests`."""

from __future__ import annotations

from pathlib import Path

import pytest

AXE_JS = Path(__file__).resolve().parents[1] / "node_modules" / "axe-core" / "axe.min.js"
IMPACTS = ("minor", "moderate", "serious", "critical")  # axe's own scale, least to most
TEXT_LIMIT = 300  # characters kept of a node's failureSummary and html

# axe.run over the document (or the document less `exclude`, CSS selectors), violations only.
RUN_JS = """async (exclude) => {
  const context = exclude.length ? {exclude: exclude} : document;
  const results = await axe.run(context, {resultTypes: ["violations"]});
  return results.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
    nodes: v.nodes.map(n => ({target: n.target, html: n.html, failureSummary: n.failureSummary}))}));
}"""


def _short(text: str | None, limit: int = TEXT_LIMIT) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _target(target) -> str:
    """axe's node target: a list of selectors (nested lists through iframes and shadow roots)."""
    if isinstance(target, list):
        return " >> ".join(_target(t) for t in target)
    return str(target)


def inject(page) -> None:
    """Loads axe-core into `page` (once per document). Fails, not skips, when it is not installed."""
    if not AXE_JS.is_file():
        pytest.fail(f"axe-core is not installed ({AXE_JS} is missing): run README's test command, "
                    "which installs it with `npm ci --prefix tests --no-audit --no-fund --silent`", pytrace=False)
    if page.evaluate("typeof window.axe") == "undefined":
        page.add_script_tag(path=str(AXE_JS))
    if page.evaluate("typeof window.axe?.run") != "function":
        pytest.fail("axe-core did not load into the page (a Content-Security-Policy that refuses inline "
                    "scripts? open the page in a context with bypass_csp=True)", pytrace=False)


def axe_violations(page, impacts=("serious", "critical"), exclude=()) -> list[dict]:
    """The axe-core rules the page's current document breaks, of the given `impacts`, leaving out
    the elements matched by the CSS selectors in `exclude`. Each is a dict: id, impact, help,
    helpUrl and nodes, each node a dict of target (its selector), html and failureSummary (both
    shortened to TEXT_LIMIT characters)."""
    impacts = (impacts,) if isinstance(impacts, str) else tuple(impacts)
    unknown = set(impacts) - set(IMPACTS)
    assert not unknown, f"unknown axe impacts {sorted(unknown)}; axe's are {IMPACTS}"
    exclude = [exclude] if isinstance(exclude, str) else list(exclude)
    inject(page)
    found = page.evaluate(RUN_JS, exclude)
    return [{"id": v["id"], "impact": v["impact"], "help": v["help"], "helpUrl": v["helpUrl"],
             "nodes": [{"target": _target(n["target"]), "html": _short(n["html"]),
                        "failureSummary": _short(n["failureSummary"])} for n in v["nodes"]]}
            for v in found if v["impact"] in impacts]


def describe(violations: list[dict], nodes_each: int = 5) -> str:
    """The violations as lines for an assertion message: rule, impact, help, then up to `nodes_each`
    elements per rule with what axe says to fix."""
    if not violations:
        return "no axe violations"
    lines = [f"{len(violations)} axe violation(s):"]
    for v in violations:
        lines.append(f"- {v['id']} ({v['impact']}): {v['help']} [{len(v['nodes'])} element(s)] {v['helpUrl']}")
        for n in v["nodes"][:nodes_each]:
            lines.append(f"    {n['target']}: {n['failureSummary']}")
        if len(v["nodes"]) > nodes_each:
            lines.append(f"    ... and {len(v['nodes']) - nodes_each} more")
    return "\n".join(lines)
