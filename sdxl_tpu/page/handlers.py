"""Gradio's event handlers, as the page wires them: errors reach the user as errors.py says, and
the form's fields (request/fields.py) are a handler's parameters, in the order the page sends them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import gradio as gr

from ..request.fields import FIELDS, FORM
from ..server.errors import user_message
from ..server.form import form_values


def form_handler(run: Callable, *extra: str, returns: str = "") -> Callable:
    """A Gradio handler whose parameters are the form's fields (request/fields.py, in the order the page
    and /generate send them; the optional ones may be left out), then `extra` (e.g. the history),
    then Gradio's progress tracker; `run(values, *extra, progress)` gets the fields by name. Its
    docstring is `run`'s, the fields' meanings (Field.about) and `returns` ("Returns: ...")."""
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(f.name, keyword, default=None if f.optional else inspect.Parameter.empty)
              for f in FIELDS]
    params += [inspect.Parameter(name, keyword, default=None) for name in extra]
    params.append(inspect.Parameter("progress", keyword, default=gr.Progress()))
    split = lambda args: (form_values(args[:len(FORM)]), *args[len(FORM):])

    def streaming(*args):
        yield from run(*split(args))

    def returning(*args):
        return run(*split(args))

    handler = streaming if inspect.isgeneratorfunction(run) else returning
    handler.__signature__ = inspect.Signature(params)
    handler.__name__ = handler.__qualname__ = run.__name__
    # (Gradio's API page reads the description and each argument's line from the docstring)
    handler.__doc__ = ((run.__doc__ or "").strip() + "\n\nArgs:\n" +
                       "\n".join(f"    {f.name}: {f.about}" for f in FIELDS) + "\n\n" + returns).strip()
    return handler


def gradio_handler(fn: Callable, where: str, refused: Callable[[str], Any] | None = None) -> Callable:
    """An event handler as Gradio calls it (a function, or a generator that streams updates):
    errors reach the user as `user_message` says, as a gr.Error (an error event for API clients, a
    notice in the page). A generator given `refused` instead ends with `refused(message)` (what
    the page shows of it, e.g. the message in its run panel, the other outputs kept), said once:
    the page's event does not fail, so a failed one means the server did not take it at all."""
    def error(e: Exception) -> gr.Error:
        return e if isinstance(e, gr.Error) else gr.Error(user_message(e, where), print_exception=False)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def streaming(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as e:
                failure = error(e)
                if refused is None:
                    raise failure from None
                yield refused(failure.message)

        return streaming

    @functools.wraps(fn)
    def handler(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(e) from None

    return handler
