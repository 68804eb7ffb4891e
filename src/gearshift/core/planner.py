"""Plan mode: each dim's gears moved toward the padded-work optimum of its decayed histogram.

One round per dim, against the window's decayed histogram. Work is the Dim's `work` (its
`cost` polynomial: by default the size itself); R, the decayed raw work (sum of weight x
work(value)), is the unit of every threshold, so a threshold reads as padding points, and
every placement minimises padded work: elements by default, compute with a quadratic cost.
The largest gear is kept, as in rules mode: no step evicts or replaces it; only the cover
rule moves the top of the set, up (the former largest then becomes an ordinary gear).

1. cover: `add_min_samples` events or more over the largest gear add a largest gear at their
   maximum (aligned), since they ran split or eager;
2. release: a gear below the largest without traffic (window or history) goes once its creation
   protection is over, or at once when it lies below all traffic (it can only serve values
   smaller than any seen);
3. plan: the optimal set of K gears for the decayed weights (`optimal.optimal_sets`) over
   candidates up to the largest gear, so every plan holds it, with the other gears that may
   not move forced in. K starts at the current count and moves by at most `K_STEP`: up while
   one gear more saves >= `plan_gear_gain`, down while one fewer costs < `plan_gear_keep`;
   under memory pressure down by one, never up;
4. move: toward the plan one exact step at a time, best first: add (below K), evict the cheapest
   (above K), or swap a plan gear for a gear off the plan when it saves `plan_move_gain` plus
   `plan_confidence` standard errors; at most `plan_max_moves` additions and as many evictions.

History: steps 2-4 read the window's histogram with the `history` (a longer decayed horizon
of the same events, `plan_history_seconds`) blended in at `plan_history_weight` of the
window's total weight (`blend`); the cover rule reads the window alone. Traffic the window has
let go of, a burst that recurs less often than the window, keeps weight, and the placements
rest on more events.

Priced (`Prices` given: measured costs as data), work is device seconds per chunk (the
measured replay curve, else the Dim's cost read as seconds), and a gear must pay its capture
back (`payback.Payback`): a saving counts as the device seconds it saves over `plan_payback_seconds`
at the window's traffic rate, and an addition (step 3's one more gear, step 4's add or swap)
is made only when that exceeds its capture on every worker of the device (a swap's or a trade's,
also the capture of each evicted gear traffic uses: undoing the move captures it again); the
best move is the one with most net seconds. Step 3 then grows K while that holds (and the
gear saves at least `plan_move_gain`) and lowers it only under memory pressure (a gear held
costs only its bytes), step 2 releases only under pressure (a gear released is captured again
if it is needed), and graphs that would not fit the bytes headroom are not added (a negative
headroom is pressure) but traded: where step 3's plan of K gears does not fit the bytes the
dim may hold (the headroom plus its gears' bytes), trades bring in gears of the best set of at
most K gears that fits (`fitting.bounded_target`) and evict only gears off it; a cover that
moves the largest gear up takes its graph and what the profile's static buffers grow by
(`Prices.buffer_growth`: 0 where not reported) from the headroom at once: left negative, that is
pressure.

Creation protection (`recent_use_protect_seconds`, and any `protected_until`) holds except in
step 2's floor case, and for an initial gear (`DimGears.initial`: there from the start, never
chosen on evidence) only while all traffic (window and history) lies below it, a ramp-up it
may yet serve: the start-up ladder gives way to the plan as soon as traffic shows where gears
pay. An evicted gear is not added back within the protection window (no flapping). Pure: no
clock, I/O, threads or torch. Costs grow with the distinct values (capped at `MAX_CANDIDATES`
gear positions for the DP) and the gears, never with the events.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Prices
from gearshift.core.dims import Dim
from gearshift.core.fitting import HELD_SLACK, bounded_target
from gearshift.core.gears import DimGears
from gearshift.core.moves import Work, additions, evictions, padding_words, swaps
from gearshift.core.optimal import OptimalSets, optimal_sets
from gearshift.core.payback import Payback, net_worth, strict
from gearshift.core.stats import Histogram
from gearshift.core.trades import Step, best_trade

K_STEP = 2
MAX_CANDIDATES = 512


class Candidates(NamedTuple):
    """The DP's inputs: candidate gears (ascending, the largest gear last), their weights
    (the forced gears' made too heavy to leave out) and the forced gears."""

    cand: np.ndarray
    weight: np.ndarray
    forced: np.ndarray


def plan_steps(dim: Dim, state: DimGears, hist: Histogram, pressure: bool, now: float,
         config: PolicyConfig, history: Histogram | None = None,
         prices: Prices | None = None) -> list[Step]:
    """One plan-mode round of one dim against the window's `hist` blended with the `history`
    (a longer horizon of the same events, `blend`): its steps, in order. With `prices`, work
    is device seconds (`Prices.work`) and every addition pays its captures back (`Payback`)."""
    if not hist.values.size:
        return []
    seen = hist  # the window alone decides the cover
    hist = blend(hist, history, config.plan_history_weight)
    v, w = hist.values, hist.weights
    cost = dim.work if prices is None else strict(prices.work(dim), int(v[-1]))
    raw = float((w * cost(v)).sum())
    pay = None if prices is None or raw <= 0 else Payback(prices, seen, cost, raw, now, config)
    if pay is not None and pay.headroom is not None and pay.headroom < 0:
        pressure = True
    window = config.recent_use_protect_seconds
    top = int(v[-1])

    def protected(g: int) -> bool:
        if g in state.initial and g < top:  # a start-up guess that traffic has gone past
            return False
        return (now - state.created.get(g, -math.inf) < window
                or now < state.protected_until.get(g, -math.inf))

    cooling = [g for g, t in state.evicted.items() if now - t < window]

    gears = list(state.gears)
    steps = _cover(dim, gears, seen, pressure, cooling, config)
    if pay is not None and pay.headroom is not None and gears[-1] != state.gears[-1]:
        # a cover's new largest gear takes its graph and the buffers' growth from the headroom
        pay.headroom -= (pay.prices.held_bytes([gears[-1]])
                         + pay.prices.buffer_growth(state.gears[-1], gears[-1]))
        pressure = pressure or pay.headroom < 0
    inside = v <= gears[-1]
    work = Work(v[inside], w[inside], w[inside] ** 2 / hist.counts[inside], cost)
    if pay is None or pressure:  # priced, a gear held costs only its bytes, and a capture
        steps += _release(gears, work, int(v[0]), protected, config)  # if it is needed back
    if not work.values.size:  # all traffic over the largest gear, too little to cover yet
        return steps
    stuck = {g for g in gears if protected(g)} | {gears[-1]}
    sets, inputs = _optimal(dim, gears, work, stuck, cooling, config)
    size, why = _count(gears, sets, raw, len(stuck), pressure, config, pay)
    target = sets.gears(size)
    fit = None
    if pay is not None and pay.headroom is not None and not pressure:
        room = pay.headroom + pay.prices.held_bytes(gears)  # what this dim may hold
        if pay.prices.held_bytes(target) > room:
            fit = bounded_target(gears, size, target, work, *inputs, pay.prices, room,
                                 HELD_SLACK * config.plan_move_gain * raw)
            if fit is not None:
                why += f"; of them, {len(fit)} fit the memory bound"
    assert stuck <= set(target), (stuck, target)
    steps += _moves(gears, size, target, work, raw, why, pressure, config, pay, stuck, fit)
    return steps


def blend(hist: Histogram, history: Histogram | None, weight: float) -> Histogram:
    """`hist` plus `history` scaled to `weight` times its total weight, value by value (counts
    add up); `hist` itself when `history` is None or weighs nothing, or `weight` is 0."""
    if history is None or history.total_weight <= 0 or weight <= 0 or not hist.values.size:
        return hist
    v = np.union1d(hist.values, history.values)
    i, j = np.searchsorted(v, hist.values), np.searchsorted(v, history.values)
    w, c, last = np.zeros(v.size), np.zeros(v.size, np.int64), np.full(v.size, -np.inf)
    w[i], c[i], last[i] = hist.weights, hist.counts, hist.last_seen
    w[j] += weight * hist.total_weight / history.total_weight * history.weights
    c[j] += history.counts
    last[j] = np.maximum(last[j], history.last_seen)
    return Histogram(v, w, c, last)


def _cover(dim: Dim, gears: list[int], hist: Histogram, pressure: bool, cooling: list[int],
           config: PolicyConfig) -> list[Step]:
    """A new largest gear for enough samples over the largest (an addition: not under
    memory pressure, within the cap, not a gear evicted within the protection window)."""
    over = hist.values > gears[-1]
    count = int(hist.counts[over].sum())
    top = dim.aligned(int(hist.values[-1]))
    if (count < config.add_min_samples or top <= gears[-1] or pressure or top in cooling
            or len(gears) >= config.max_gears_per_type):
        return []
    how = "split" if dim.splittable else "eager"
    step = ("add", top, f"cover: {count} samples over the largest gear {gears[-1]} ran {how} "
                        f"(max {int(hist.values[-1])})")
    gears.append(top)
    return [step]


def _release(gears: list[int], work: Work, floor: int, protected: Callable[[int], bool],
             config: PolicyConfig) -> list[Step]:
    """Gears below the largest without traffic in the window (step 2), `floor` being its
    smallest value; `gears` is updated in place."""
    steps: list[Step] = []
    for g in list(gears[:-1]):
        if len(gears) <= config.min_gear_count_per_type:
            return steps
        i = gears.index(g)
        if work.weight(gears[i - 1] if i else 0, g) > 0:
            continue
        if g < floor:
            steps.append(("evict", g, f"unused: below all traffic in the window "
                                      f"(smallest {floor})"))
        elif not protected(g):
            steps.append(("evict", g, "unused: no traffic in the window"))
        else:
            continue
        gears.remove(g)
    return steps


def _optimal(dim: Dim, gears: list[int], work: Work, stuck: set[int], cooling: list[int],
           config: PolicyConfig) -> tuple[OptimalSets, Candidates]:
    """The DP's optimal sets up to `len(gears) + K_STEP` gears over candidate positions: the
    aligned values in the window below the largest gear (at most MAX_CANDIDATES, none cooling
    down) and the gears held. The largest gear is the last candidate, so every plan holds it;
    the other stuck gears are forced in by a weight no saving can outweigh. Also the DP's
    inputs, for a target under the bytes bound (`fitting.bounded_target`)."""
    top = gears[-1]
    cand = np.unique(np.clip(-(-work.values // dim.align) * dim.align, dim.min, dim.max))
    cand = cand[(cand < top) & ~np.isin(cand, cooling)]
    if cand.size > MAX_CANDIDATES:  # keep the top of each of MAX_CANDIDATES runs
        cand = cand[np.arange(1, MAX_CANDIDATES + 1) * cand.size // MAX_CANDIDATES - 1]
    cand = np.union1d(cand, gears).astype(np.int64)  # a plan may keep any gear (at no weight)
    forced = np.array(sorted(stuck - {top}), np.int64)
    weight = np.bincount(np.searchsorted(cand, work.values), work.w, cand.size)
    # Leaving a forced gear out moves its weight up at least one position, which costs at
    # least the least cost step between adjacent candidates per unit (the cost is strictly
    # increasing, a measured curve too, but flat stretches make that step small); no plan
    # saves more than all the weight padded up to the top.
    step = float(np.diff(work.cost(cand)).min(initial=np.inf))
    weight[np.searchsorted(cand, forced)] += 4.0 * (weight.sum() + 1.0) * float(
        work.cost(np.array([top]))[0]) / step
    k = min(max(config.max_gears_per_type, len(stuck)), len(gears) + K_STEP)
    return optimal_sets(cand, k, weight, cost=work.cost), Candidates(cand, weight, forced)


def _count(gears: list[int], sets: OptimalSets, raw: float, stuck: int, pressure: bool,
           config: PolicyConfig, pay: Payback | None = None) -> tuple[int, str]:
    """How many gears the plan holds (step 3), and why; priced, one more gear must also save
    over the payback horizon more than the captures its plan adds."""
    costs = sets.costs
    n = len(gears)
    low = max(stuck, config.min_gear_count_per_type, n - K_STEP)
    size = min(n, costs.size)
    why = f"plan of {size} gears"

    def gain(k: int) -> float:  # what the k-th gear saves, in points of the raw work
        return (costs[k - 2] - costs[k - 1]) / raw

    def captures(k: int) -> float:  # device seconds to capture plan k's gears not held
        return float(pay.capture([g for g in sets.gears(k) if g not in gears]).sum()) if pay \
            else 0.0

    def pays(k: int) -> bool:
        return pay is None or float(pay.seconds(gain(k) * raw)) > captures(k) - captures(k - 1)

    least = config.plan_move_gain if pay else config.plan_gear_gain
    keep = 0.0 if pay else config.plan_gear_keep  # priced, a gear held costs only its bytes
    while (not pressure and size < costs.size and size < n + K_STEP
           and gain(size + 1) >= least and pays(size + 1)):
        size += 1
        why = (f"plan of {size} gears (one more saves {gain(size):.2%} >= "
               f"{least:.2%} of the work"
               + (f", {float(pay.seconds(gain(size) * raw)):.3g} s over "
                  f"{pay.horizon:g} s)" if pay else ")"))
    while size > max(low, 1) and (gain(size) < keep or (pressure and size >= n)):
        why = (f"plan of {size - 1} gears (one fewer costs {gain(size):.2%}"
               + (f" < {keep:.2%} of the work)" if not pressure
                  else " of the work; memory pressure)"))
        size -= 1
    return size, why


def _moves(gears: list[int], size: int, target: tuple[int, ...], work: Work, raw: float,
           why: str, pressure: bool, config: PolicyConfig,
           pay: Payback | None = None, stuck: set[int] | frozenset[int] = frozenset(),
           fit: tuple[int, ...] | None = None) -> list[Step]:
    """Exact steps toward `size` gears, taken from `target` (which may hold fewer when more
    gears save nothing, and always holds the largest gear) (step 4); `gears` is updated in
    place. Priced, the best move is the one that saves most net of its capture, and none is
    made that does not pay it back within the horizon or whose graph does not fit; an
    addition that pays but does not fit is traded (`trades.best_trade`) for a gear not
    `stuck`. Where `fit` is given (the count's plan does not fit the bound:
    `fitting.bounded_target`), a trade brings in a gear of `fit` and evicts only gears off
    it: trades move toward the best set that fits rather than round a plan that cannot."""
    steps: list[Step] = []
    adds = evicts = 0
    fresh: set[int] = set()  # added this round: never traded away again in it

    def trade(g: np.ndarray, a: np.ndarray, swap: bool) -> bool:
        nonlocal adds, evicts
        if pay is None or pay.headroom is None or evicts >= limit:
            return False
        kept = stuck | fresh | {gears[-1]}
        if fit is not None:
            a, kept = np.array([t for t in fit if t not in gears], np.int64), kept | set(fit)
        traded = best_trade(g, a, work, raw, why, least, config, pay, kept, int(swap),
                             "off the set that fits, " if fit is not None else "")
        for _, old, _ in traded[:-1]:
            gears.remove(old)
        if traded:
            steps.extend(traded)
            gears.append(traded[-1][1])
            gears.sort()
            fresh.add(traded[-1][1])
            adds, evicts = adds + 1, evicts + len(traded) - 1
        return bool(traded)
    limit = config.plan_max_moves
    least = config.plan_move_gain * raw
    while True:
        g = np.array(gears, np.int64)
        a = np.array([t for t in target if t not in gears], np.int64)
        e = np.array([i for i, x in enumerate(gears) if x not in target], np.int64)
        if len(gears) > size and evicts < limit and e.size:
            loss, _ = evictions(g, e, work)
            i = int(np.argmin(loss))
            gone = gears.pop(int(e[i]))
            steps.append(("evict", gone, f"{why}: {padding_words(-loss[i], raw)}"))
            if pay:
                pay.give(gone)
            evicts += 1
        elif len(gears) < size and adds < limit and a.size and not pressure:
            gain, _ = additions(g, a, work)
            net = net_worth(gain, a, least, pay)
            j = int(np.argmax(net))
            if net[j] <= 0:
                if not trade(g, a, swap=False):
                    return steps
                continue
            paid = f", {pay.why(float(pay.seconds(gain[j])), int(a[j]))}" if pay else ""
            steps.append(("add", int(a[j]), f"{why}: {padding_words(gain[j], raw)}{paid}"))
            gears.append(int(a[j]))
            gears.sort()
            fresh.add(int(a[j]))
            if pay:
                pay.take(int(a[j]))
            adds += 1
        elif len(gears) == size and adds < limit and evicts < limit and a.size and e.size:
            gain, sd = swaps(g, e, a, work)
            score = gain - config.plan_confidence * sd
            net = net_worth(score, a, least, pay, g[e])
            undo = np.zeros(e.size)
            if pay:  # undoing it: the evicted gear captured again, where traffic uses it
                undo = np.where(evictions(g, e, work)[0] > 0, pay.capture(g[e]), 0.0)
                net = net - undo[:, None]
            i, j = np.unravel_index(int(np.argmax(net)), net.shape)
            if net[i, j] <= 0:
                if not trade(g, a, swap=True):
                    return steps
                continue
            old, new = int(g[e[i]]), int(a[j])
            saved = padding_words(gain[i, j], raw, sd[i, j]) + (
                f", {pay.why(float(pay.seconds(score[i, j])), new)}" if pay else "") + (
                f" and {undo[i]:.3g} s to capture {old} again" if undo[i] > 0 else "")
            if pay:
                pay.give(old)
                pay.take(new)
            steps += [("evict", old, f"{why}: moves to {new}, {saved}"),
                      ("add", new, f"{why}: replaces {old}, {saved}")]
            gears.remove(old)
            gears.append(new)
            gears.sort()
            fresh.add(new)
            adds, evicts = adds + 1, evicts + 1
        else:
            return steps
