"""Dynamic prompts as sd-dynamic-prompts (A1111's extension) and Fooocus write them, in plain Python:
variants `{a|b|c}`, several at once `{2$$a|b|c}`, `{1-3$$a|b|c}`, with their own separator
`{2$$ and $$a|b|c}`, weighted `{0.5::a|2::b}`; wildcards `__name__` (the lines of the text file of
that name in a folder the server is given; `__dir/*__` every file below dir), nested in each other. Each image
draws its own prompt from its seed (reproducible), or every combination is listed (combinatorial).
`\\{`, `\\|`, `\\}` and `\\_` are the characters themselves.

Templates come from anyone: nesting, draws, combinations, wildcard files and the prompt made are
bounded, and a wildcard is a name looked up among the folder's files, never a path."""

from __future__ import annotations

import itertools
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..request.errors import RequestError
from ..request.fields import MAX_PROMPT_CHARS  # (a prompt made from a template: as one typed)

MAX_DEPTH = 12  # nested variants and wildcards within wildcards, together
MAX_PICKS = 100  # options drawn by one {N$$...}
MAX_COMBINATIONS = 10_000  # prompts listed in combinatorial mode
MAX_WILDCARD_BYTES = 1 << 20  # one wildcard file
NAME = re.compile(r"[A-Za-z0-9_\-]+(?:/[A-Za-z0-9_\-]+)*(?:/\*)?|\*")
# What reads as a path between __ and __ (../x, /etc/x, ./x, a\\b, C:x): refused, never looked up or left as text.
PATH_LIKE = re.compile(r"[^\s_]\S*(?:/|\\|:)\S*|\.\S*|\S*\.\.\S*")
COUNT = re.compile(r"\s*(\d*)\s*(-?)\s*(\d*)\s*$")
WEIGHT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*::")


@dataclass(frozen=True)
class Variants:
    options: tuple[tuple[float, tuple], ...]  # (weight, parts)
    fewest: int = 1
    most: int = 1
    separator: str = ", "


@dataclass(frozen=True)
class Wildcard:
    name: str


def parse(template: str) -> tuple:
    """The template's parts: text (str), Variants and Wildcard, in order; a RequestError naming
    what is wrong (an unclosed brace, a bad count, too deep)."""
    return _parse(template, 0, 0, closing=False)[0]


def _parse(text: str, at: int, depth: int, *, closing: bool) -> tuple[tuple, int]:
    """Parts from `at` up to an unescaped | or } when `closing` (inside braces), else to the end."""
    _within_depth(depth)
    parts, plain = [], []
    while at < len(text):
        c = text[at]
        if c == "\\" and at + 1 < len(text):
            plain.append(text[at + 1])
            at += 2
        elif c in "|}" and closing:
            break
        elif c == "{":
            if plain:
                parts.append("".join(plain))
                plain = []
            variants, at = _variants(text, at + 1, depth + 1)
            parts.append(variants)
        elif text.startswith("__", at) and (end := text.find("__", at + 2)) > at + 2 and PATH_LIKE.fullmatch(
                text, at + 2, end) and not NAME.fullmatch(text, at + 2, end):
            raise RequestError(f"The template names __{text[at + 2:end][:60]}__: a wildcard is named by its file's "
                               "name in the server's folder (letters, digits, _ and -, a subfolder with /), never "
                               "by a path.")
        elif text.startswith("__", at) and (end := text.find("__", at + 2)) > at + 2 and NAME.fullmatch(
                text, at + 2, end):
            if plain:
                parts.append("".join(plain))
                plain = []
            parts.append(Wildcard(text[at + 2:end]))
            at = end + 2
        else:
            plain.append(c)
            at += 1
    if plain:
        parts.append("".join(plain))
    return tuple(parts), at


def _variants(text: str, at: int, depth: int) -> tuple[Variants, int]:
    """The variants after a `{`, and where their `}` ends."""
    fewest = most = 1
    separator = ", "
    if (dollars := _before_options(text, at)) >= 0:  # {N$$...} or {N$$sep$$...}
        fewest, most = _count(text[at:dollars])
        at = dollars + 2
        if (dollars := _before_options(text, at)) >= 0:
            separator, at = text[at:dollars], dollars + 2
    options = []
    while True:
        weight = 1.0
        if m := WEIGHT.match(text, at):
            weight = float(m.group(1))
            at = m.end()
        parts, at = _parse(text, at, depth, closing=True)
        options.append((weight, parts))
        if at >= len(text):
            raise RequestError("The template has a { without its closing }: write \\{ for the character itself.")
        if text[at] == "}":
            return Variants(tuple(options), fewest, most, separator), at + 1
        at += 1  # past the |


def _before_options(text: str, at: int) -> int:
    """Where a `$$` starts, when it comes before any |, { or } from `at` (else -1)."""
    while at < len(text):
        if text[at] == "\\":
            at += 2
        elif text.startswith("$$", at):
            return at
        elif text[at] in "|{}":
            return -1
        else:
            at += 1
    return -1


def _count(text: str) -> tuple[int, int]:
    """`N`, `N-M`, `-M` or `N-` before $$: the fewest and most options drawn."""
    m = COUNT.match(text)
    if not m or not (m.group(1) or m.group(3)):
        raise RequestError(f"The template's {{{text}$$...}} asks for a count that is not a number or a range like 1-3.")
    fewest = int(m.group(1)) if m.group(1) else 1
    most = (int(m.group(3)) if m.group(3) else MAX_PICKS) if m.group(2) else fewest
    if fewest > most:
        raise RequestError(f"The template's {{{text}$$...}} asks for at least {fewest} but at most {most} options.")
    if most > MAX_PICKS and (m.group(3) or not m.group(2)):
        raise RequestError(f"The template's {{{text}$$...}} asks for more than {MAX_PICKS} options at once.")
    return fewest, min(most, MAX_PICKS)


class Wildcards:
    """The wildcard files of one folder (each .txt file's path below it, less .txt, is its name):
    one option a line, blank lines and # comments left out. Read when first used; names are
    looked up among the files found, so no name reaches outside the folder."""

    def __init__(self, folder: str | os.PathLike | None):
        self.folder = Path(folder).resolve() if folder else None
        self._names: list[str] | None = None
        self._lines: dict[str, tuple[str, ...]] = {}

    def names(self) -> list[str]:
        if self._names is None:
            found = [] if self.folder is None or not self.folder.is_dir() else [
                p.relative_to(self.folder).with_suffix("").as_posix() for p in sorted(self.folder.rglob("*.txt"))
                if p.is_file() and p.resolve().is_relative_to(self.folder)]
            self._names = [n for n in found if NAME.fullmatch(n)]
        return self._names

    def options(self, name: str) -> tuple[str, ...]:
        """Every line of the files `name` means (`dir/*`: every file below dir; `*`: all)."""
        if name.endswith("*"):
            prefix = name[:-1]
            chosen = [n for n in self.names() if n.startswith(prefix)]
        else:
            chosen = [name] if name in self.names() else []
        if not chosen:
            known = (", ".join(f"__{n}__" for n in self.names()[:20])
                     or "none (no wildcards folder was given)")
            raise RequestError(f"The template names the wildcard __{name}__, which is not in the wildcards folder; "
                               f"its wildcards: {known}. Write \\_\\_ for the characters themselves.")
        lines = tuple(line for n in chosen for line in self._read(n))
        if not lines:
            raise RequestError(f"The wildcard __{name}__ has no lines to choose from.")
        return lines

    def _read(self, name: str) -> tuple[str, ...]:
        if name not in self._lines and self.folder is not None:  # (a name from names(): a file inside it)
            try:
                with open(self.folder / f"{name}.txt", "rb") as f:
                    data = f.read(MAX_WILDCARD_BYTES + 1)
            except OSError as e:
                raise RequestError(f"The wildcard __{name}__ could not be read ({e.strerror}).") from None
            if len(data) > MAX_WILDCARD_BYTES:
                raise RequestError(f"The wildcard __{name}__ is over {MAX_WILDCARD_BYTES >> 20} MB.")
            lines = (line.strip() for line in data.decode("utf-8", "replace").splitlines())
            self._lines[name] = tuple(line for line in lines if line and not line.startswith("#"))
        return self._lines.get(name, ())


def draw(template: str, seed: int, wildcards: Wildcards) -> str:
    """The prompt an image with this seed gets: each variant drawn at random (weighted), each
    wildcard a random line of its file, from a generator seeded with the image's seed."""
    return _draw(parse(template), random.Random(seed), wildcards, 0)


def _draw(parts: tuple, rng: random.Random, wildcards: Wildcards, depth: int) -> str:
    _within_depth(depth)
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, Wildcard):
            out.append(_draw(parse(rng.choice(wildcards.options(part.name))), rng, wildcards, depth + 1))
        else:
            k = min(rng.randint(part.fewest, part.most), len(part.options))
            picked = _weighted_sample(part.options, k, rng)
            out.append(part.separator.join(_draw(p, rng, wildcards, depth + 1) for p in picked))
    return _checked("".join(out))  # (each part checked already: at most MAX_PICKS times the bound)


def _weighted_sample(options: tuple, k: int, rng: random.Random) -> list[tuple]:
    """k distinct options' parts, each drawn in proportion to its weight among those left."""
    left, picked = list(options), []
    for _ in range(k):
        total = sum(w for w, _ in left)
        if total <= 0:
            break
        x, acc = rng.random() * total, 0.0
        for i, (w, parts) in enumerate(left):
            acc += w
            if x < acc or i == len(left) - 1:
                picked.append(parts)
                del left[i]
                break
    return picked


def combinations(template: str, wildcards: Wildcards, limit: int = MAX_COMBINATIONS) -> list[str]:
    """Every prompt the template makes (combinatorial mode), in order, at most `limit` of them
    (a RequestError when there would be more)."""
    return _listed(_every(parse(template), wildcards, 0), limit)


def first_combinations(template: str, wildcards: Wildcards, n: int) -> list[str]:
    """The template's first `n` combinations (all of them where it makes fewer), in order."""
    return list(itertools.islice(_every(parse(template), wildcards, 0), n))


def _every(parts: tuple, wildcards: Wildcards, depth: int):
    _within_depth(depth)
    if not parts:
        yield ""
        return
    first, rest = parts[0], parts[1:]
    for head in _choices(first, wildcards, depth):
        for tail in _every(rest, wildcards, depth):
            yield _checked(head + tail)


def _choices(part, wildcards: Wildcards, depth: int):
    if isinstance(part, str):
        yield part
    elif isinstance(part, Wildcard):
        for line in wildcards.options(part.name):
            yield from _every(parse(line), wildcards, depth + 1)
    else:
        n = len(part.options)  # (asked for more than there are: all of them, as a draw takes)
        for k in range(min(part.fewest, n), min(part.most, n) + 1):
            for group in itertools.combinations(part.options, k):
                for texts in itertools.product(*(_listed(_every(p, wildcards, depth + 1)) for _, p in group)):
                    yield part.separator.join(texts)


def _listed(prompts, limit: int = MAX_COMBINATIONS) -> list[str]:
    """The prompts, listed: at most `limit` (the whole template's, or one option's to combine)."""
    listed = list(itertools.islice(prompts, limit + 1))
    if len(listed) > limit:
        raise RequestError(f"The template makes more than {limit} prompts; "
                           "use fewer variants or draw at random.")
    return listed


def _within_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise RequestError(f"The template's variants and wildcards are nested more than {MAX_DEPTH} deep.")


def _checked(prompt: str) -> str:
    if len(prompt) > MAX_PROMPT_CHARS:
        raise RequestError(f"A prompt made from the template is over {MAX_PROMPT_CHARS} characters.")
    return prompt


def checked_template(template: str, wildcards: Wildcards | None) -> None:
    """A RequestError for what some image's draw would fail on: the template's syntax, and every
    wildcard it can reach (each named once, its lines parsed), so a typo is refused before a run;
    without `wildcards` (they are another server's) the syntax alone."""
    seen: set[str] = set()

    def visit(parts: tuple, depth: int) -> None:
        _within_depth(depth)
        for part in parts:
            if isinstance(part, Wildcard) and wildcards is not None and part.name not in seen:
                seen.add(part.name)
                for line in wildcards.options(part.name):
                    visit(parse(line), depth + 1)
            elif isinstance(part, Variants):
                for _, option in part.options:
                    visit(option, depth + 1)

    visit(parse(template), 0)


def is_dynamic(prompt: str) -> bool:
    """Whether a prompt holds variants or wildcards (anything `draw` would change)."""
    return any(not isinstance(p, str) for p in parse(prompt)) if ("{" in prompt or "__" in prompt) else False


__all__ = ["Wildcards", "checked_template", "combinations", "draw", "first_combinations", "is_dynamic", "parse"]
