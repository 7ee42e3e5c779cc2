"""Errors that reach a user as one line and an exit code, never as a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input the user can fix. ``str(exc)`` names what to change."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(UserError):
    """A configuration value is invalid; the message names the key and the fix."""
