"""The one colour palette of the course.

Every figure in the workbook -- lesson notebooks, trace timelines, HTML
reports, benchmark plots -- draws the same kind of time with the same colour,
so that a learner who has seen one timeline can read all the others:

=====================  =========  ==============================================
kind                   colour     meaning
=====================  =========  ==============================================
``compute``            blue       a rank is doing useful arithmetic
``communication``      orange     a collective or point-to-point is in flight
``exposed``            red        communication that no compute hides
``memcpy``             green      a memory copy or memset (host/device)
``wait``               purple     the compute thread is blocked on a collective
``idle``               light grey nothing at all is running on the rank
``link``               brown      the simulated interconnect itself
``late peer``          yellow     a transfer was modelled done, a peer had not
                                  issued it yet (rank skew, simulated link)
=====================  =========  ==============================================

The colours come from the Okabe-Ito palette, chosen to stay distinguishable
for the common forms of colour blindness.
"""

from __future__ import annotations

COMPUTE = "#0072B2"
COMMUNICATION = "#E69F00"
EXPOSED = "#D55E00"
MEMCPY = "#009E73"
WAIT = "#CC79A7"
IDLE = "#D9D9D9"
LINK = "#8C564B"
LATE_PEER = "#F0E442"
OTHER = "#999999"

#: Colour of each kind of time, keyed by the category names used by
#: :mod:`workbook.trace.classify`.
PALETTE: dict[str, str] = {
    "compute": COMPUTE,
    "communication": COMMUNICATION,
    "exposed": EXPOSED,
    "memcpy": MEMCPY,
    "wait": WAIT,
    "idle": IDLE,
    "link": LINK,
    "late peer": LATE_PEER,
    "other": OTHER,
}


def color(kind: str) -> str:
    """Return the colour for a kind of time (``"compute"``, ``"communication"``,
    ...); unknown kinds get a neutral grey."""
    return PALETTE.get(kind, OTHER)
