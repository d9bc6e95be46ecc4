"""A decoding service: one engine loop, on a thread of its own, that takes requests from any thread.

    service = DecodingService(decoder, max_concurrent=4)   # decoder: a SpeculativeDecoder
    ticket = service.submit(prompt_ids, references=[original], max_new_tokens=512, stop_strings=["```"])
    for tokens in ticket.tokens(): ...                     # or ticket.result(): (new tokens, DecodingStats)
    ticket.cancel()                                        # leaves the batch at the next step
    service.close()

Every request is checked on the caller's thread (``submit`` raises the ValueError
``SpeculativeDecoder.generate`` would) and then joins the running batch at the next step
(continuous batching, refdec.engine.engine.Engine), with its own settings: sampling and seed,
stops, eos, length, references. Only the loop's thread touches the engine, the backend and the
requests: ``cancel`` marks a ticket, and the loop finishes the request between two steps; the
engine's batch then releases its cache entries. Output is what ``decoder.generate`` gives the
same prompt alone: the rows of a batch do not see each other (refdec.engine.scheduler).

Bounded memory: a finished request leaves nothing behind in the service (its ticket holds its
tokens and stats for whoever holds the ticket); the engine's running totals are counters.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from refdec.engine.defaults import MAX_CONCURRENT, MAX_WAITING
from refdec.engine.engine import Engine
from refdec.engine.requests import Request
from refdec.engine.results import DecodingStats
from refdec.engine.settings import DecodeSettings
from refdec.tokens import check_int

__all__ = ["DecodingService", "ServiceBusy", "ServiceClosed", "Ticket", "TicketEvent"]

CANCELLED = "cancelled"  # the stop reason of a request its ticket cancelled


class ServiceBusy(RuntimeError):
    """Every decoding slot is taken and the waiting queue is full: try again later."""


DECODER_INDEX = object()  # DecodingService.submit's default index: the decoder's own


class ServiceClosed(RuntimeError):
    """The service was closed (or its loop failed) before the request finished."""


@dataclass
class TicketEvent:
    """What a ticket receives, in order: ``tokens`` (a run of new token ids) any number of times,
    then exactly one ``done`` (``stats`` filled, ``stats.stop_reason`` why) or ``error``
    (``error``: the exception; the request was dropped)."""

    kind: str  # "tokens" | "done" | "error"
    tokens: list[int] = field(default_factory=list)
    stats: DecodingStats | None = None
    error: BaseException | None = None


class Ticket:
    """A submitted request. Its events arrive on the loop's thread: to ``on_event`` when one was
    given (it must not block: hand them on, e.g. with ``loop.call_soon_threadsafe``), else to a
    queue that :meth:`tokens` and :meth:`result` read."""

    def __init__(self, service: "DecodingService", on_event=None) -> None:
        self._service = service
        self._on_event = on_event
        self._events: queue.SimpleQueue | None = None if on_event is not None else queue.SimpleQueue()
        self.request: Request | None = None
        self.cancelled = False
        self.finished = threading.Event()
        self.new_tokens: list[int] = []
        self.stats: DecodingStats | None = None
        self.error: BaseException | None = None

    def cancel(self) -> None:
        """Stops the request at the next step (a waiting one never starts); its ``done`` event
        comes with ``stop_reason == "cancelled"``. Nothing happens to a finished request."""
        if not self.finished.is_set():
            self.cancelled = True
            if self.request is not None:
                self.request.cancel_requested = True  # a llama.cpp prefill under way stops part-way
            self._service._wake()

    def tokens(self, timeout: float | None = None):
        """Yields each run of new tokens (list of int) as it is decoded; ends when the request is
        done, raising its error if it failed (no ``on_event`` tickets only)."""
        if self._events is None:
            raise RuntimeError("this ticket hands its events to on_event")
        while True:
            event = self._events.get(timeout=timeout)
            if event.kind == "tokens":
                yield event.tokens
            elif event.kind == "error":
                raise event.error
            else:
                return

    def result(self, timeout: float | None = None) -> tuple[list[int], DecodingStats]:
        """Waits for the end: (the new tokens, the request's DecodingStats); raises its error."""
        if not self.finished.wait(timeout):
            raise TimeoutError(f"the request did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.new_tokens, self.stats

    # -- the loop's side

    def _send(self, event: TicketEvent) -> None:
        if event.kind == "tokens":
            self.new_tokens.extend(event.tokens)
        elif event.kind == "done":
            self.stats = event.stats
        else:
            self.error = event.error
        if event.kind != "tokens":
            self.finished.set()
        if self._on_event is not None:
            self._on_event(event)
        else:
            self._events.put(event)


class DecodingService:
    """Serves ``decoder`` (a :class:`~refdec.engine.decoder.SpeculativeDecoder`) to many threads.

    ``max_concurrent`` (int >= 1): rows decoding together; ``max_waiting`` (int >= 0): requests
    queued behind them before :meth:`submit` raises :class:`ServiceBusy`. The loop starts at once;
    an ``"auto"`` budget's cost curve is measured (or read) here, before the first request.
    """

    def __init__(self, decoder, *, max_concurrent: int = MAX_CONCURRENT, max_waiting: int = MAX_WAITING) -> None:
        max_concurrent = check_int("max_concurrent", max_concurrent, 1)
        max_waiting = check_int("max_waiting", max_waiting, 0)
        self.decoder = decoder
        self.max_concurrent = max_concurrent
        self.max_waiting = max_waiting
        self.cost_curve = decoder.backend.auto_cost_curve()
        self.steps = 0  # engine steps made (a cancelled request's decode is seen to stop by it)
        self.failures = 0  # engine steps that raised (each failed the requests of its batch)
        self.cancelled = 0  # requests stopped by their ticket's cancel
        self._lock = threading.RLock()  # on_done may run inside submit (a request done at once)
        self._wakeup = threading.Condition(self._lock)
        self._incoming: list[Ticket] = []
        self._live: set[Ticket] = set()  # submitted, not yet finished: the loop's own
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="refdec-engine", daemon=True)
        self._thread.start()

    # -- any thread

    def submit(self, prompt, settings: DecodeSettings | None = None, *, on_event=None, references=None, tenant=None,
               index=DECODER_INDEX, **keywords) -> Ticket:
        """Queues one prompt (token ids: a list of int or int64 [L]) decoded with ``settings`` (a
        :class:`~refdec.engine.settings.DecodeSettings`; or ``generate``'s keywords for its fields,
        which override its fields where both are given); returns its :class:`Ticket`. ``tenant`` (any
        hashable): whose past outputs it drafts from and joins, when the decoder has a memory
        (refdec.drafting.memory). ``index``: the corpus it drafts from (a refdec.CorpusIndex,
        ShardedIndex or None; default: the decoder's). Raises ValueError for a bad argument,
        :class:`ServiceBusy` when the queue is full and :class:`ServiceClosed` after :meth:`close`."""
        decoder = self.decoder
        args = decoder.check_call(prompt, DecodeSettings.of(settings, **keywords),
                                  index=decoder.index if index is DECODER_INDEX else index, references=references)
        ticket = Ticket(self, on_event)

        def on_tokens(_row: int, tokens: list[int]) -> None:
            ticket._send(TicketEvent("tokens", tokens=list(tokens)))

        def on_done(_row: int, _new_tokens: list[int], stats: DecodingStats) -> None:
            with self._lock:
                self._live.discard(ticket)
            ticket._send(TicketEvent("done", stats=stats))

        with self._lock:
            self._check_room()  # before building: a full queue answers at once
        # built outside the lock (the first "auto" request measures the cost curve): the loop runs on
        (ticket.request,), _ = decoder.build_requests(args, own_budgets=True, on_tokens=on_tokens, on_done=on_done,
                                                      tenant=tenant)
        with self._lock:
            self._check_room()
            if not ticket.request.done:  # max_new_tokens=0 is done already
                self._incoming.append(ticket)
                self._wakeup.notify()
        return ticket

    def _check_room(self) -> None:
        """Raises ServiceClosed after close() and ServiceBusy when the queue is full (under the lock)."""
        if self._closing:
            raise ServiceClosed("the decoding service is closed")
        if len(self._live) + len(self._incoming) >= self.max_concurrent + self.max_waiting:
            raise ServiceBusy(f"{self.max_concurrent} requests decode and {self.max_waiting} wait: the queue "
                              f"is full")

    @property
    def tokenizer(self):
        """The decoder's tokenizer: what the requests' token ids mean."""
        return self.decoder.tokenizer

    @property
    def eos_token_ids(self) -> set[int]:
        """The model's end-of-sequence token ids (its generation config's; empty when it has none)."""
        eos = self.decoder.backend.generation_config.eos_token_id
        return set() if eos is None else {int(eos)} if isinstance(eos, int) else {int(t) for t in eos}

    @property
    def index(self):
        """The corpus index a request drafts from unless it names another (the decoder's; None: none)."""
        return self.decoder.index

    @property
    def pending(self) -> int:
        """Requests submitted and not finished (decoding or waiting)."""
        with self._lock:
            return len(self._live) + len(self._incoming)

    def close(self, timeout: float | None = 30.0) -> None:
        """Stops the loop after its current step; unfinished requests fail with ServiceClosed."""
        with self._lock:
            self._closing = True
            self._wakeup.notify()
        self._thread.join(timeout)

    def __enter__(self) -> "DecodingService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wake(self) -> None:
        with self._lock:
            self._wakeup.notify()

    # -- the loop's thread

    def _new_engine(self) -> Engine:
        decoder = self.decoder
        return Engine(decoder.backend, capacity=self.max_concurrent, prefill_chunk=decoder.prefill_chunk,
                      max_depth=decoder.max_depth, joint_budget=decoder.joint_batch_budget)

    def _loop(self) -> None:
        engine = self._new_engine()
        try:
            while True:
                with self._lock:
                    while not (self._closing or self._incoming or engine
                               or any(ticket.cancelled for ticket in self._live)):
                        self._wakeup.wait()
                    if self._closing:
                        return
                    incoming, self._incoming = self._incoming, []
                    self._live.update(incoming)
                engine.add([ticket.request for ticket in incoming])
                for ticket in [t for t in self._live if t.cancelled and not t.request.done]:
                    ticket.request.finish(CANCELLED)  # on_done: it leaves _live; the batch drops it next step
                    self.cancelled += 1
                if not engine:
                    continue
                try:
                    engine.step()
                    self.steps += 1
                except Exception as error:  # the batch's state is unknown: fail its rows, start afresh
                    self.failures += 1
                    waiting = [request for request in engine.scheduler.pending if not request.done]
                    self._fail(error, keep=waiting)
                    engine.close()
                    engine = self._new_engine()
                    engine.add(waiting)  # the requests that had not started wait on in the new engine
        finally:
            engine.close()
            self._fail(ServiceClosed("the decoding service closed before the request finished"))

    def _fail(self, error: BaseException, keep: list[Request] | None = None) -> None:
        """Fails, with ``error``, the engine's unfinished requests but those in ``keep``; every
        unfinished request, those not yet taken in too, when ``keep`` is None (closing)."""
        kept = {id(request) for request in keep or ()}
        with self._lock:
            failed = [ticket for ticket in self._live if id(ticket.request) not in kept]
            self._live.difference_update(failed)
            if keep is None:
                failed += self._incoming
                self._incoming = []
        for ticket in failed:
            if not ticket.finished.is_set():
                ticket._send(TicketEvent("error", error=error))
