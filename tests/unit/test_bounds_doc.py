"""docs/reliability.md's table of bounds is tests/bounds.py's: generated, and current."""
from __future__ import annotations

import os

import pytest

from tests import bounds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_reliability_page_shows_the_bounds_the_tests_assert():
    page = open(os.path.join(ROOT, bounds.PAGE), encoding="utf-8").read()
    assert bounds.render(page) == page, \
        "docs/reliability.md's bounds table is stale: python -m tests.bounds --write"


def test_a_changed_bound_makes_the_page_stale(monkeypatch):
    page = open(os.path.join(ROOT, bounds.PAGE), encoding="utf-8").read()
    monkeypatch.setattr(bounds, "ROWS", bounds.ROWS[:1])
    assert bounds.render(page) != page
    with pytest.raises(ValueError, match="lacks the markers"):
        bounds.render("no markers here")


def test_each_asserted_bound_is_its_stated_bound_plus_the_slack():
    assert bounds.DEAD_PEER_ASSERTED - bounds.DEAD_PEER == bounds.SCHED_SLACK
    assert bounds.LINK_CUT_ASSERTED - bounds.LINK_CUT_NPURUN == bounds.SCHED_SLACK
    assert bounds.LINK_CUT_DIAG_OFF_ASSERTED - bounds.LINK_CUT_TRANSPORT == bounds.SCHED_SLACK
    assert bounds.STOPPED_ASSERTED - bounds.STOP_TIMEOUT == bounds.SCHED_SLACK
