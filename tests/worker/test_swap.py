"""The swap thread's loop: a tick that left nothing to do waits IDLE_INTERVALS intervals."""

from __future__ import annotations

from gearshift.worker.swap import IDLE_INTERVALS, SwapThread


class Waits:
    """Stands in for the thread's wake event: records each wait, stops the loop after `n`."""

    def __init__(self, swap: SwapThread, n: int) -> None:
        self.swap, self.n, self.timeouts = swap, n, []

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        if len(self.timeouts) == self.n:
            self.swap._stop.set()
        return False

    def clear(self) -> None:
        pass

    def set(self) -> None:
        pass


def test_an_idle_tick_waits_longer_and_a_busy_or_failing_one_the_interval() -> None:
    results = iter([True, False, None, "boom", False])
    failed: list[Exception] = []

    def tick() -> bool | None:
        result = next(results)
        if result == "boom":
            raise RuntimeError(result)
        return result  # type: ignore[return-value]

    swap = SwapThread(tick, lambda: 0.05, failed.append, background=False)
    swap._wake = waits = Waits(swap, 5)  # type: ignore[assignment]
    swap._run()
    idle = 0.05 * IDLE_INTERVALS
    assert waits.timeouts == [0.05, idle, 0.05, 0.05, idle]
    assert [str(e) for e in failed] == ["boom"]
