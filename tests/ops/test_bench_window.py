"""`zbk bench`'s window (zbk.cli.bench.Window): at most its size in flight, the sender woken
when a slot frees, and a wait for the whole window that returns once the last one finished."""

from __future__ import annotations

import asyncio

from zbk.cli.bench import Window


def test_the_window_keeps_at_most_its_size_in_flight_and_waits_for_the_last() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        w = Window(3)
        in_flight = peak = finished = 0

        def done() -> None:
            nonlocal in_flight, finished
            in_flight -= 1
            finished += 1
            w.release()

        for i in range(40):
            if w.free <= 0:
                await w.wait()
            assert w.free > 0
            w.free -= 1
            in_flight += 1
            peak = max(peak, in_flight)
            loop.call_later(0.001 * (i % 4), done)  # they finish out of order
        await w.wait(3)
        assert (in_flight, finished, peak, w.free) == (0, 40, 3, 3)
        w.lat.append(0.5)
        assert list(w.lat) == [0.5]

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_window_with_nothing_in_flight_does_not_wait() -> None:
    async def main() -> None:
        w = Window(2)
        await w.wait()
        await w.wait(2)
        assert w.free == 2

    asyncio.run(asyncio.wait_for(main(), 10))
