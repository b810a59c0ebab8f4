"""Progress of a long command on standard error, on a terminal and in a log alike.

A command that works for minutes should never be silent. On a terminal,
:class:`Progress` redraws one bar (``[####......] 12/40 items (8 s)``). Where
standard error is not a terminal (a log, CI, a pipe), redrawing would fill
the log with carriage returns, so it writes a plain line instead, at most
every :data:`EVERY` seconds, with the count and the time so far, and a final
line at the end::

    scoring: 120/400 items (5 s)
    scoring: 250/400 items (10 s)
    scored 400 items in 15.2 s

A step that is one long call (loading a tokenizer) gets no count from
inside, so :meth:`Progress.ticking` runs a heartbeat beside it that writes
the same lines while the call runs. The clock is injected, so tests drive
the reporter with a fake one.

>>> import io
>>> now = [0.0]
>>> out = io.StringIO()
>>> p = Progress(4, stream=out, clock=lambda: now[0], tty=False)
>>> p.step(1); now[0] = 6.0; p.step(1); now[0] = 7.0; p.step(1); p.finish()
>>> print(out.getvalue(), end="")
scoring: 2/4 items (6 s)
scored 3 items in 7.0 s
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

EVERY = 5.0  # seconds between two lines in a log
WIDTH = 30  # the bar's characters on a terminal


class Progress:
    """Counts ``total`` things (``what``: "items", "steps") done by a command; see the module. ``clock``: seconds
    from any start (default ``time.monotonic``); ``tty``: whether ``stream`` (default standard error) is a
    terminal, asked of the stream by default.

    ``doing`` names the work while it runs, ``done`` in the final line (``scoring``, ``scored``); :meth:`stage`
    says what the current step is. ``quiet_if_quick``: a command that ends within ``every`` seconds writes
    nothing at all (the bar of a terminal is erased at the end), for work that is usually quick."""

    def __init__(self, total: int, what: str = "items", *, doing: str = "scoring", done: str = "scored",
                 stream=None, clock=None, every: float = EVERY, tty: bool | None = None,
                 quiet_if_quick: bool = False):
        self.total, self.what, self.doing, self.done_word = max(int(total), 0), what, doing, done
        self.stream = sys.stderr if stream is None else stream
        self.clock = time.monotonic if clock is None else clock  # looked up now: a test may stand in for it
        self.every, self.quiet_if_quick = every, quiet_if_quick
        self.tty = _isatty(self.stream) if tty is None else tty
        self.count = 0
        self.label = ""
        self.start = self.last = self.clock()
        self.shown = False  # a line (or the bar) has been written
        self.open_bar = False  # on a terminal: the bar is drawn and its line not ended
        self.finished = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ counting

    def __call__(self, n: int = 1) -> None:
        """``progress(n)``: what ``steerc.eval.evaluate`` calls after each ``n`` things."""
        self.step(n)

    def step(self, n: int = 1) -> None:
        """``n`` more things are done."""
        with self._lock:
            self.count += n
            self._report(self.clock())

    def stage(self, label: str) -> None:
        """The step now under way is ``label`` (shown beside the count)."""
        with self._lock:
            self.label = label
            if self.tty:
                self._report(self.clock())

    def tick(self) -> None:
        """Report the time so far if a line is due (the heartbeat's call: nothing was counted)."""
        with self._lock:
            self._report(self.clock())

    def finish(self) -> None:
        """The work is over: the final line in a log; on a terminal, the bar's line ended (or erased with
        ``quiet_if_quick``). Only once."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
            if self.tty:
                if self.open_bar:
                    self.stream.write("\r\x1b[K" if self.quiet_if_quick else "\n")
            elif self.shown or not self.quiet_if_quick:
                elapsed = self.clock() - self.start
                self.stream.write(f"{self.done_word} {self.count} {self.what} in {elapsed:.1f} s\n")
            self._flush()

    @contextlib.contextmanager
    def ticking(self, interval: float = 1.0):
        """``with progress.ticking(): long_call()``: a heartbeat thread calls :meth:`tick` every ``interval``
        seconds of real time while the block runs, so a long call without steps still reports (in a log, a
        line at most every ``every`` seconds of the injected clock)."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(interval):
                self.tick()

        thread = threading.Thread(target=beat, name="steerc-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    # ------------------------------------------------------------------ writing

    def _report(self, now: float) -> None:
        elapsed = now - self.start
        if self.finished or (self.quiet_if_quick and elapsed < self.every):
            return
        if self.tty:
            self._draw(elapsed)
        elif now - self.last >= self.every and self.count < self.total:
            label = f", {self.label}" if self.label else ""
            self.stream.write(f"{self.doing}: {self.count}/{self.total} {self.what}{label} ({elapsed:.0f} s)\n")
            self.last = now
            self.shown = True
            self._flush()

    def _draw(self, elapsed: float) -> None:
        """The bar, redrawn in place; its line ends once every thing is done."""
        filled = WIDTH * min(self.count, self.total) // max(self.total, 1)
        label = f" {self.label}" if self.label and self.count < self.total else ""
        self.stream.write(f"\r[{'#' * filled}{'.' * (WIDTH - filled)}] {self.count}/{self.total} {self.what}"
                          f"{label} ({elapsed:.0f} s)\x1b[K")
        self.open_bar = self.count < self.total or self.quiet_if_quick
        if not self.open_bar:
            self.stream.write("\n")
        self.shown = True
        self._flush()

    def _flush(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.stream.flush()


def progress(total: int, **kw) -> Progress:
    """A :class:`Progress` of ``total`` items scored (what ``steerc eval`` and ``steerc tune`` show)."""
    return Progress(total, **kw)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
