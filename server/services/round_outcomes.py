"""The two ways an alignment round ends without a bug: raised by server/services/alignment.py, handled by
server/services/rounds.py. They live apart from both so that alignment (which imports torch) need not import
the round queue at run time, and the queue imports alignment only when a round runs."""

from __future__ import annotations


class RoundCancelled(RuntimeError):
    pass


class NotEnoughRows(ValueError):
    """An expected outcome (too few stored rows), not a bug: logged without a traceback."""
