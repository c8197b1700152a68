"""What a user is told of an error: their own mistakes in their words, anything else logged and
told without internals; and Gradio's event handlers built on that."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..spec.errors import Cancelled, RequestError


log = logging.getLogger("sdxl_tpu.server")


def log_refusal(where: str, error: Exception) -> None:
    """One log line per refused input (never a traceback: a bad client must not flood the log)."""
    log.info("refused input to %s: %s", where, error)


def user_message(error: Exception, where: str) -> str:
    """What the user is told of an error raised by a handler (logged here, once): a RequestError
    is their message; anything else is a bug, logged with its traceback, told without internals."""
    if isinstance(error, RequestError):
        log_refusal(where, error)
        return str(error)
    if isinstance(error, Cancelled):  # the caller has gone (or the server is stopping): nobody to tell
        log.info("%s cancelled: %s", where, error)
        return "The request was cancelled."
    log.error("%s failed", where, exc_info=error)
    return "Something went wrong on the server; it has been logged. Please try again."


def gradio_handler(fn: Callable, where: str, refused: Callable[[str], Any] | None = None) -> Callable:
    """An event handler as Gradio calls it (a function, or a generator that streams updates):
    errors reach the user as `user_message` says, as a gr.Error (an error event for API clients, a
    notice in the page). A generator given `refused` instead ends with `refused(message)` (what
    the page shows of it, e.g. the message in a status line, the other outputs kept) and a notice:
    the page's event does not fail, so a failed one means the server did not take it at all."""
    import gradio as gr

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
                gr.Warning(failure.message)
                yield refused(failure.message)

        return streaming

    @functools.wraps(fn)
    def handler(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(e) from None

    return handler
