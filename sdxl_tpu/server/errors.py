"""What a user is told of an error: their own mistakes in their words, anything else logged and
told without internals; and how a server logs."""

from __future__ import annotations

import logging

from ..request.errors import Cancelled, RequestError


log = logging.getLogger("sdxl_tpu.server")


def configure_logging() -> None:
    """A server's log: this project's records from INFO, others' from WARNING, each library record
    on one line (the MCP library logs a malformed message with its whole validation error, some
    thirty lines: a bad client must not flood the log; tracebacks of errors are kept)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("sdxl_tpu").setLevel(logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_first_line)


def _first_line(record: logging.LogRecord) -> bool:
    if not record.name.startswith("sdxl_tpu"):
        message = record.getMessage()
        if "\n" in message:
            record.msg, record.args = message.split("\n", 1)[0] + " [...]", None
    return True


def log_refusal(where: str, error: Exception | str) -> None:
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
