"""The run-config key schema: :class:`Key` (one key: type, default, allowed values) and
:class:`ConfigError`. The keys themselves are declared in :mod:`fedclust.config` (common keys)
and next to each method (``KEYS``); this module imports none of them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedclust.errors import BadInputError

Scalar = bool | int | float | str


class ConfigError(BadInputError, ValueError):
    """A run-config value is invalid; the message says which, why, and how to fix it."""

    data_free = True


class UnknownArgumentError(ConfigError, TypeError):
    """An unknown keyword argument to a fedclust function or class: a ``TypeError`` as Python's
    own, and a :class:`ConfigError` (the launchers print it as bad input); the message names the
    close matches."""


class MissingExtraError(ConfigError, ImportError):
    """A method needs a package of an optional extra that is not installed here; the message
    is the ``pip install`` line to type."""


def refuse_unknown(owner: str, unknown: Sequence[str], allowed: Sequence[str],
                   notes: dict[str, str] | None = None) -> None:
    """Raise :class:`UnknownArgumentError` for the keyword arguments ``unknown`` of ``owner``
    (e.g. ``"ExactFCM.start()"``), each with its closest match in ``allowed`` or a note
    (``notes``: why a known name of another API is not one here)."""
    if not unknown:
        return
    import difflib

    notes = notes or {}
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, list(allowed), n=1)
        hints.append(f"{name!r}" + (f" ({notes[name]})" if name in notes else
                                    f" (did you mean {close[0]!r}?)" if close else ""))
    raise UnknownArgumentError(f"{owner} got unknown keyword argument(s) {', '.join(hints)}. "
                               f"Allowed: {', '.join(allowed)}")


@dataclass(frozen=True)
class Key:
    """One run-config key.

    Parameters
    ----------
    name : str
        Dotted key as used in ``--run-config`` (``"fcm.m"``).
    type : type
        One of ``bool, int, float, str``; values are cast to it.
    default : scalar
        Default written to ``pyproject.toml``.
    help : str
        One-line description (README and error messages).
    low, high : float, optional
        Inclusive bounds unless ``low_open``/``high_open``.
    choices : sequence of str, optional
        Allowed values for string keys.
    check : callable, optional
        Extra check ``value -> str | None`` returning an error text.
    allowed_text : str, optional
        What the allowed values are, in words, when the type and bounds do not say it (a
        key that takes ``"auto"`` or a number).
    """

    name: str
    type: type
    default: Scalar
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: Sequence[str] | None = None
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)
    allowed_text: str | None = None

    def allowed(self) -> str:
        """Human-readable description of the allowed values."""
        if self.allowed_text is not None:
            return self.allowed_text
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.low is None and self.high is None:
            return f"a {self.type.__name__}"
        lo = "-inf" if self.low is None else repr(self.low)
        hi = "inf" if self.high is None else repr(self.high)
        left = "(" if self.low_open or self.low is None else "["
        right = ")" if self.high_open or self.high is None else "]"
        return f"a {self.type.__name__} in {left}{lo}, {hi}{right}"

    def parse(self, raw: Any) -> Scalar:
        """Cast and range-check ``raw``; raise :class:`ConfigError` on failure."""
        value = _cast(self, raw)
        problem = None
        if self.choices is not None and value not in self.choices:
            problem = "not an allowed value"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                problem = "not a finite number"
            elif self.low is not None and (
                    value < self.low or (self.low_open and value == self.low)):
                problem = "below the allowed range"
            elif self.high is not None and (
                value > self.high or (self.high_open and value == self.high)
            ):
                problem = "above the allowed range"
        if problem is None and self.check is not None:
            problem = self.check(value)
        if problem is not None:
            raise ConfigError(_message(self, raw, problem))
        return value


def _message(key: Key, raw: Any, problem: str) -> str:
    return (
        f"run config '{key.name}' = {raw!r} is invalid ({problem}). "
        f"Allowed: {key.allowed()} — {key.help}. "
        f"Fix: pass e.g. --run-config '{key.name}={_toml(key.default)}' "
        f"or the Hydra override {_hydra_override(key)}."
    )


def _hydra_override(key: Key) -> str:
    """The ``fedclust-sweep`` form of ``key``: run-config keys live under ``app.``; the method
    is chosen with its config group."""
    if key.name == "method":
        return f"method={key.default}"
    value = key.default if isinstance(key.default, str) else _toml(key.default)
    return f"app.{key.name}={value}" if value != "" else f"app.{key.name}=''"


def _toml(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _cast(key: Key, raw: Any) -> Scalar:
    try:
        if key.type is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0"):
                return raw.lower() in ("true", "1")
            if isinstance(raw, int) and raw in (0, 1):
                return bool(raw)
            raise ValueError
        if key.type is int:
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(raw)
        if key.type is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if raw is None or not isinstance(raw, (str, int, float)):   # lists, tables, null
            raise ValueError
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(_message(key, raw, f"not a {key.type.__name__}")) from None


# ----------------------------------------------------------------------------------------------


def require(cond: bool, key: str, value: Any, allowed: str, fix: str) -> None:
    """Raise a :class:`ConfigError` for a cross-key rule when ``cond`` is false."""
    if not cond:
        raise ConfigError(f"run config '{key}' = {value!r} is invalid. Allowed: {allowed}. "
                          f"Fix: {fix}.")
