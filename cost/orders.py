"""Rank orders: the parallel axes from the fastest-varying (innermost) to the slowest, with an
optional torus traversal after ``@`` (``cost.layout`` explains both). Here, below ``cost.framework``,
so that framework profiles can name the orders a framework lays out."""

from __future__ import annotations

ORDERS: tuple[str, ...] = ("tp-cp-dp-pp", "tp-cp-pp-dp", "tp-dp-cp-pp")
DEFAULT_ORDER = "tp-cp-dp-pp"
TRAVERSAL_SEP = "@"


def split_order(order: str) -> tuple[str, str]:
    """``"tp-cp-dp-pp@xzy"`` -> ``("tp-cp-dp-pp", "xzy")``; ``""`` for the default traversal."""
    axes, _, traversal = order.partition(TRAVERSAL_SEP)
    return axes, traversal


def join_order(axes: str, traversal: str) -> str:
    """The order string of a parallel order and a traversal ("" for device-id order)."""
    return f"{axes}{TRAVERSAL_SEP}{traversal}" if traversal else axes
