"""``postjob run --processes N``: N worker processes under one supervisor that restarts a
crashed child and forwards SIGTERM/SIGINT (each child stops after its current job; a second
signal stops them at once). With a :class:`~._relay.Relay`, the supervisor alone listens for
jobs and wakes one idle child at a time."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from dataclasses import dataclass, field
from types import FrameType

from postjob_sa.worker.wakeup import RELAY_FD_ENV

from ._errors import EXIT_BAD_INPUT
from ._relay import Relay

log = logging.getLogger("postjob_sa.cli")

POLL_INTERVAL = 0.2
#: A child that dies sooner than this after its start waits longer before each restart.
STABLE_AFTER = 10.0
RESTART_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass
class _Slot:
    number: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_crashes: int = 0
    restart_at: float | None = None


@dataclass
class Supervisor:
    argv: list[str]
    env: dict[str, str]
    size: int
    slots: list[_Slot] = field(default_factory=list)
    stopping: bool = False
    failed: bool = False
    relay: Relay | None = None

    def run(self) -> int:
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.slots = [_Slot(n) for n in range(1, self.size + 1)]
            for slot in self.slots:
                self._start(slot)
            while any(s.proc is not None or s.restart_at is not None for s in self.slots):
                self._reap_children()
                self._restart_due()
                if self.relay is None:
                    time.sleep(POLL_INTERVAL)
                else:
                    self.relay.serve(POLL_INTERVAL)
        finally:
            if self.relay is not None:
                self.relay.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
        return EXIT_BAD_INPUT if self.failed else 0

    def _start(self, slot: _Slot) -> None:
        # Own process group: a terminal's Ctrl-C reaches only the supervisor, which forwards
        # it once (a second delivery would make the workers stop mid-job).
        if self.relay is None:
            slot.proc = subprocess.Popen(self.argv, env=self.env, process_group=0)
        else:
            fd = self.relay.add(slot.number)
            slot.proc = subprocess.Popen(self.argv, env={**self.env, RELAY_FD_ENV: str(fd)},
                                         process_group=0, pass_fds=(fd,))
            self.relay.started(slot.number)
        slot.started = time.monotonic()
        slot.restart_at = None
        log.info("worker %d started with pid %d", slot.number, slot.proc.pid)

    def _reap_children(self) -> None:
        for slot in self.slots:
            if slot.proc is None or (code := slot.proc.poll()) is None:
                continue
            pid, slot.proc = slot.proc.pid, None
            if self.relay is not None:
                self.relay.remove(slot.number)
            if code == 0 or self.stopping:
                log.info("worker %d (pid %d) exited with status %d", slot.number, pid, code)
                continue
            if code == EXIT_BAD_INPUT:
                log.error("worker %d (pid %d) refused to run: stopping all workers", slot.number, pid)
                self.failed = True
                self._stop(signal.SIGTERM)
                continue
            lived = time.monotonic() - slot.started
            slot.quick_crashes = slot.quick_crashes + 1 if lived < STABLE_AFTER else 0
            delay = RESTART_DELAYS[min(slot.quick_crashes, len(RESTART_DELAYS) - 1)]
            reason = f"signal {-code}" if code < 0 else f"status {code}"
            log.warning("worker %d (pid %d) crashed (%s): restarting in %.1fs",
                        slot.number, pid, reason, delay)
            slot.restart_at = time.monotonic() + delay

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                if self.stopping:
                    slot.restart_at = None
                else:
                    self._start(slot)

    def _stop(self, signum: int) -> None:
        self.stopping = True
        for slot in self.slots:
            slot.restart_at = None
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signum)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        log.warning("received %s: passing it to the workers", signal.Signals(signum).name)
        self._stop(signum)
