"""FedCRef's stopping rule (paper 000 §4.5).

The run stops when no client is active any more, or when the number of communities and the
number of isolated clusters both change by at most a fraction ``change`` (default 10%) in
``window`` (default 3) consecutive iterations. "Change in an iteration" is measured against the
previous iteration, relative to the previous count (a previous count of 0 counts as 1)::

    calm_t  ⇔  |C_t − C_{t−1}| ≤ change · max(C_{t−1}, 1)  and  the same for I_t

so the earliest stop by stability is at iteration ``window + 1`` (iteration 1 has no
predecessor).

This follows the paper's text (§4.5: "The process concludes either when there are no more
active clients remaining in set A, or when the global stopping condition is satisfied"), not
its Algorithm 1, whose line 5 reads ``while (varying I and G) or |A| > 0``: taken literally
that loop runs until *both* the counts are stable *and* no client is active. The text's rule
stops earlier; the reference code (``check_convergence``) stops on either condition too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_ACTIVE = "no active clients"
STABLE = "communities and isolated counts stable"


@dataclass
class StabilityStop:
    """Tracks the counts per iteration and says when (and why) to stop.

    Parameters
    ----------
    window : consecutive calm iterations required
    change : largest relative change regarded as "unchanged"
    """

    window: int = 3
    change: float = 0.1
    calm: int = 0
    _prev: tuple[int, ...] | None = field(default=None, repr=False)

    def update(self, communities: int, isolated: int, active: int) -> str | None:
        """Record one iteration; return the stop reason, or None to go on."""
        counts = (communities, isolated)
        if self._prev is not None and all(
                abs(c - p) <= self.change * max(p, 1)
                for c, p in zip(counts, self._prev, strict=True)):
            self.calm += 1
        else:
            self.calm = 0
        self._prev = counts
        if active == 0:
            return NO_ACTIVE
        if self.calm >= self.window:
            return STABLE
        return None
