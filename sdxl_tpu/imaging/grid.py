"""AUTOMATIC1111's image grids with axis labels, in PIL (its modules/images' image_grid and
draw_grid_annotations, as its X/Y/Z plot uses them): images in rows and columns, each column's label
above it and each row's at its left, wrapped to their place and drawn at a size scaled to the cells;
an X/Y/Z plot's grids (one a z value) side by side under their own labels. The font is PIL's own
(ImageFont.load_default at any size, Pillow's FreeType build): nothing to ship.

Where this differs from A1111: the font is at least MIN_FONT_SIZE (A1111's (width + height) // 25 is
5 px on 64x64 cells), a word too wide for its place is broken rather than drawn ever smaller, and a
label is cut at MAX_LABEL_CHARS (a Prompt S/R value can be a whole prompt)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from ..request.errors import RequestError

BACKGROUND = (255, 255, 255)  # A1111's grid_background_color
TEXT = (0, 0, 0)  # grid_text_active_color
INACTIVE = (153, 153, 153)  # grid_text_inactive_color
MIN_FONT_SIZE = 12
MAX_LABEL_CHARS = 200
MAX_GRID_PIXELS = 200_000_000  # A1111's img_max_size_mp, 200 megapixels: the cells' pixels together

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


@dataclass(frozen=True)
class GridAnnotation:
    """One line of a label; an inactive one is greyed and struck through (A1111's prompt matrix)."""
    text: str = ""
    is_active: bool = True


@functools.lru_cache(maxsize=16)
def font(size: int) -> Font:
    """PIL's default font at `size` pixels."""
    return ImageFont.load_default(size=size)


def font_size(width: int, height: int) -> int:
    """The labels' size for cells of `width` x `height`: A1111's, at least MIN_FONT_SIZE."""
    return max(MIN_FONT_SIZE, (width + height) // 25)


def image_grid(images: Sequence[Image.Image], rows: int) -> Image.Image:
    """`images` in `rows` rows, as many columns as that takes, each centred in a cell the size of the
    largest, on the background (A1111's image_grid with its rows given)."""
    if not images:
        raise ValueError("a grid needs at least one image")
    rows = max(1, min(rows, len(images)))
    cols = math.ceil(len(images) / rows)
    w, h = (max(sizes) for sizes in zip(*(im.size for im in images)))
    grid = Image.new("RGB", (cols * w, rows * h), BACKGROUND)
    for i, im in enumerate(images):
        grid.paste(im.convert("RGB"), (i % cols * w + (w - im.width) // 2, i // cols * h + (h - im.height) // 2))
    return grid


def draw_grid_annotations(im: Image.Image, width: int, height: int, hor_texts: Sequence[Sequence[GridAnnotation]],
                          ver_texts: Sequence[Sequence[GridAnnotation]], margin: int = 0) -> Image.Image:
    """`im`, a grid of cells of `width` x `height`, with each column's lines (`hor_texts`) above and
    each row's (`ver_texts`) at the left, `margin` pixels between the cells: A1111's layout (the row
    labels' band is 3/4 of a cell wide, the top band as tall as the tallest label and a line's space
    above and below it; no band where there are no labels)."""
    cols, rows = im.width // width, im.height // height
    if (cols, rows) != (len(hor_texts), len(ver_texts)):
        raise ValueError(f"{len(hor_texts)}x{len(ver_texts)} labels for a grid of {cols}x{rows} cells")
    size = font_size(width, height)
    fnt, spacing = font(size), size // 2
    pad_left = width * 3 // 4 if any(line.text.strip() for lines in ver_texts for line in lines) else 0
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    hor = [_wrapped(measure, lines, fnt, width) for lines in hor_texts]
    ver = [_wrapped(measure, lines, fnt, pad_left) for lines in ver_texts]
    hor_heights, ver_heights = ([_height(lines, spacing) for lines in texts] for texts in (hor, ver))
    pad_top = max(hor_heights) + spacing * 2 if any(hor_heights) else 0
    result = Image.new("RGB", (im.width + pad_left + margin * (cols - 1), im.height + pad_top + margin * (rows - 1)),
                       BACKGROUND)
    for row in range(rows):
        for col in range(cols):
            cell = im.crop((width * col, height * row, width * (col + 1), height * (row + 1)))
            result.paste(cell, (pad_left + (width + margin) * col, pad_top + (height + margin) * row))
    draw = ImageDraw.Draw(result)
    for col, lines in enumerate(hor):
        _draw(draw, pad_left + (width + margin) * col + width / 2, pad_top / 2 - hor_heights[col] / 2, lines, fnt,
              spacing)
    for row, lines in enumerate(ver):
        _draw(draw, pad_left / 2, pad_top + (height + margin) * row + height / 2 - ver_heights[row] / 2, lines, fnt,
              spacing)
    return result


Line = tuple[GridAnnotation, int, int]  # a wrapped line, its width and height


def _wrapped(measure: ImageDraw.ImageDraw, lines: Sequence[GridAnnotation], fnt: Font, allowed: int) -> list[Line]:
    """Each label line wrapped at spaces to `allowed` pixels (A1111's wrap), a longer word broken."""
    out: list[Line] = []
    for line in lines:
        text = line.text if len(line.text) <= MAX_LABEL_CHARS else line.text[:MAX_LABEL_CHARS - 1] + "…"
        wrapped = [""]
        for word in text.split():
            for piece in _pieces(measure, word, fnt, allowed):
                joined = f"{wrapped[-1]} {piece}".strip()
                if not wrapped[-1] or measure.textlength(joined, font=fnt) <= allowed:
                    wrapped[-1] = joined
                else:
                    wrapped.append(piece)
        for part in wrapped:
            left, top, right, bottom = measure.textbbox((0, 0), part, font=fnt) if part else (0, 0, 0, 0)
            out.append((GridAnnotation(part, line.is_active), int(right - left), int(bottom - top)))
    return out


def _pieces(measure: ImageDraw.ImageDraw, word: str, fnt: Font, allowed: int) -> list[str]:
    """`word` in pieces each at most `allowed` pixels wide (at least a character each)."""
    pieces = [""]
    for ch in word:
        if pieces[-1] and measure.textlength(pieces[-1] + ch, font=fnt) > allowed:
            pieces.append("")
        pieces[-1] += ch
    return pieces


def _height(lines: Sequence[Line], spacing: int) -> int:
    return sum(h for _, _, h in lines) + spacing * (len(lines) - 1) if any(h for _, _, h in lines) else 0


def _draw(draw: ImageDraw.ImageDraw, x: float, y: float, lines: Sequence[Line], fnt: Font, spacing: int) -> None:
    """Lines centred on `x`, from `y` down (A1111's draw_texts)."""
    for line, w, h in lines:
        colour = TEXT if line.is_active else INACTIVE
        draw.text((x, y + h / 2), line.text, font=fnt, fill=colour, anchor="mm")
        if not line.is_active:
            draw.line((x - w // 2, y + h // 2, x + w // 2, y + h // 2), fill=INACTIVE, width=4)
        y += h + spacing


def xyz_grids(images: Sequence[Image.Image], x_labels: Sequence[str], y_labels: Sequence[str],
              z_labels: Sequence[str], *, draw_legend: bool = True, margin_size: int = 0,
              include_sub_grids: bool = False) -> list[Image.Image]:
    """An X/Y/Z plot's grids from its cells' images in A1111's order (x fastest, then y, then z; an
    axis of Nothing is one value labelled ""): each z value's grid (the x labels above, the y labels
    at the left, `margin_size` pixels apart), those side by side under the z labels, first; then,
    with `include_sub_grids`, each z value's grid again, as A1111 returns them."""
    nx, ny, nz = len(x_labels), len(y_labels), len(z_labels)
    if not nx * ny * nz or len(images) != nx * ny * nz:
        raise ValueError(f"{len(images)} images for a plot of {nx}x{ny}x{nz} cells")
    pixels = sum(im.width * im.height for im in images)
    if pixels > MAX_GRID_PIXELS:
        raise RequestError(f"The X/Y/Z plot's grid would be {pixels / 1e6:,.0f} megapixels; at most "
                           f"{MAX_GRID_PIXELS // 1_000_000} are made here.")
    labelled = lambda texts: [[GridAnnotation(text)] for text in texts]
    subs = []
    for iz in range(nz):
        cells = images[iz * nx * ny:(iz + 1) * nx * ny]
        grid = image_grid(cells, rows=ny)
        if draw_legend:
            w, h = (max(sizes) for sizes in zip(*(im.size for im in cells)))
            grid = draw_grid_annotations(grid, w, h, labelled(x_labels), labelled(y_labels), margin_size)
        subs.append(grid)
    main = image_grid(subs, rows=1)
    if draw_legend:
        w, h = (max(sizes) for sizes in zip(*(im.size for im in subs)))
        main = draw_grid_annotations(main, w, h, labelled(z_labels), [[GridAnnotation()]])
    return [main, *subs] if include_sub_grids else [main]
