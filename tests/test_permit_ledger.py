"""The node's permit ledger, without Redis: what it dispatches, asks for and gives back."""

from __future__ import annotations

from scrapy import Request

from project.frontier.ledger import Lease, PermitLedger
from project.frontier.queue import StepBatch
from project.frontier.settlements import SettlementQueue


def _lease(ledger: PermitLedger, site: str, score: float, n: int = 1) -> list[Request]:
    requests = []
    for i in range(n):
        request = Request(f"https://{site}/{score}/{i}")
        ledger.add(score, request, Lease(f"m-{site}-{score}-{i}".encode(), site, b"{}"))
        requests.append(request)
    return requests


def test_a_request_is_dispatched_only_with_a_free_permit_of_its_site() -> None:
    ledger = PermitLedger(concurrency=8, prefetch=0)
    _lease(ledger, "a", 1.0, 3)
    assert ledger.pop() is None, "no permit yet"
    ledger.apply([], [("a", 2)], {})
    first, second = ledger.pop(), ledger.pop()
    assert first is not None
    assert second is not None
    assert ledger.pop() is None, "both permits download"
    assert ledger.downloading == 2
    assert ledger.held == 3
    ledger.end_download(ledger.dispatched[first])
    assert ledger.pop() is not None, "the permit that ended starts the waiting request"


def test_the_best_score_goes_first_across_sites() -> None:
    ledger = PermitLedger(concurrency=8, prefetch=0)
    (late,) = _lease(ledger, "a", 5.0)
    (early,) = _lease(ledger, "b", -3.0)
    ledger.apply([], [("a", 1), ("b", 1)], {})
    assert [ledger.pop(), ledger.pop()] == [early, late]


def test_permits_above_the_share_go_back_once_free() -> None:
    ledger = PermitLedger(concurrency=8, prefetch=0)
    ledger.apply([], [("a", 4)], {"a": 2})
    assert ledger.usable("a") == 2
    batch = StepBatch()
    ledger.plan(batch, most=500)
    assert batch.give_back == [("a", 2)]
    # spare permits with no request ask for requests of their site
    assert batch.ahead == [("a", 2, 0, 2, 2)]
    assert batch.slots == 6
    assert batch.want == 8


def test_a_reclaimed_ledger_holds_no_permit_but_keeps_its_downloads() -> None:
    ledger = PermitLedger(concurrency=8, prefetch=0)
    _lease(ledger, "a", 1.0, 2)
    ledger.apply([], [("a", 2)], {})
    running = ledger.pop()
    assert running is not None
    assert ledger.reclaimed() == 2
    assert ledger.pop() is None, "no permit: the second request waits"
    assert ledger.holds("a"), "the running download still counts"
    assert ledger.downloading == 1
    assert ledger.slots() == 8


def test_the_permit_table_is_sent_after_give_backs_and_corrected_to_what_redis_counts() -> None:
    ledger = PermitLedger(concurrency=8, prefetch=0)
    ledger.apply([], [("a", 4), ("b", 1)], {"a": 2})
    assert ledger.table([("a", 2)]) == [("a", 2), ("b", 1)]
    # Redis counts 1 of a after the step's give-back of 2, and none of b
    assert ledger.correct([("a", 1), ("b", 0)], [("a", 2)]) == 2
    ledger.apply([("a", 2)], [], {})
    assert dict(ledger.permits) == {"a": 1}
    assert ledger.correct([("a", 5)], []) == 0, "never more than the node counts itself"
    assert dict(ledger.permits) == {"a": 1}


def test_a_site_done_with_is_forgotten() -> None:
    ledger = PermitLedger(concurrency=8, prefetch=0)
    (request,) = _lease(ledger, "a", 1.0)
    ledger.apply([], [("a", 1)], {"a": 3})
    assert ledger.pop() is request
    ledger.settle(request)
    ledger.apply([("a", 1)], [], {})
    assert "a" not in ledger.ready
    assert "a" not in ledger.shares
    assert not ledger.permits


def test_a_lease_past_its_age_is_let_go_once() -> None:
    ledger = PermitLedger(concurrency=8, prefetch=0)
    (request,) = _lease(ledger, "a", 1.0)
    ledger.apply([], [("a", 1)], {})
    ledger.pop()
    assert ledger.live(now=5.0, max_age=10.0) == ([b"m-a-1.0-0"], [])
    live, too_old = ledger.live(now=20.0, max_age=10.0)
    assert live == []
    assert too_old == [(request, 20.0)]
    assert ledger.live(now=30.0, max_age=10.0) == ([], [])


def test_a_settlement_waits_for_the_requests_buffered_before_it() -> None:
    queue = SettlementQueue()
    queue.add(ack=b"first")  # nothing buffered before it
    queue.buffered = 2  # its page's two links
    queue.add(ack=b"second")
    batch = StepBatch()
    assert queue.collect(batch, sent_after=1) == 1
    assert batch.acks == [b"first"]
    assert queue.waiting(1) == [b"second"], "still held: heartbeated"
    queue.sent_with(1, 1)
    batch = StepBatch()
    assert queue.collect(batch, sent_after=2) == 1
    assert batch.acks == [b"second"]


def test_downloads_left_without_permits_ask_for_them_and_say_so() -> None:
    ledger = PermitLedger(concurrency=8, prefetch=0)
    _lease(ledger, "a", 1.0, 2)
    ledger.apply([], [("a", 2)], {})
    ledger.pop()
    ledger.pop()
    assert ledger.covered("a")
    ledger.reclaimed()  # a stall: the fleet took both back
    assert not ledger.covered("a")
    assert ledger.runs_short()
    batch = StepBatch()
    ledger.plan(batch, most=500)
    assert batch.ahead == [("a", 0, 2, 0, 0)], "two permits asked for the two downloads"
    ledger.apply([], [("a", 2)], {})
    assert ledger.covered("a")
