"""Errors fusec raises. All derive from :class:`FusecError`, so ``except fusec.FusecError``
catches them."""

from __future__ import annotations


class FusecError(Exception):
    """Base class of every error fusec raises on purpose."""


class TraceError(FusecError, TypeError):
    """A function could not be traced (for example Python control flow on a traced value)."""


class TracerBoolConversionError(TraceError):
    """``if``/``while``/``bool()``/``float()``/``int()`` on a traced value."""


class ShapeError(FusecError, ValueError):
    """Operand shapes do not fit the operation."""


class DTypeError(FusecError, TypeError):
    """A dtype fusec does not support, or one an operation does not accept."""


class StaticArgumentError(FusecError, ValueError):
    """A static argument is unhashable or names a parameter that does not exist."""


class DeviceLimitError(FusecError, ValueError):
    """A buffer or a launch exceeds what the device allows."""


class SignatureError(FusecError, TypeError):
    """A compiled function was called with arguments of another signature."""


class IndexingError(FusecError, IndexError):
    """An index does not fit the array: a static integer out of bounds, or too many indices."""


class CarryError(TraceError):
    """A loop body changed its carry's structure, shape or dtype, or the branches of a
    ``cond``/``switch`` disagree (fusec.lax control flow)."""
