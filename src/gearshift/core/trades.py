"""Plan mode's trades under the bytes bound: an addition that pays back its capture but does
not fit the headroom, made by evicting the gears that earn least per byte (`best_trade`).
Pure: arrays and prices in, steps out.
"""

from __future__ import annotations

import math

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.moves import Work, additions, evictions, padded, padding_words
from gearshift.core.payback import Payback

Step = tuple[str, int, str]  # (action "add" | "evict", gear, reason): a plan-mode step


def best_trade(g: np.ndarray, a: np.ndarray, work: Work, raw: float, why: str, least: float,
           config: PolicyConfig, pay: Payback, kept: set[int], fewest: int = 0,
           off: str = "") -> list[Step]:
    """Under the bytes bound, an addition that pays back its capture but does not fit the
    headroom evicts, one at a time until it fits and at least `fewest` of them (1 where the
    plan holds as many gears as it should: a trade then keeps the count, as a swap does), the
    gear that earns least per byte (the padded work its eviction adds over the bytes it frees;
    never one `kept`), as many as it takes: a trade is all or nothing, and a cap would keep a
    large graph out for good where it needs more small ones gone (a round makes no further
    trade once its evictions reach `plan_max_moves`). A trade is scored as a swap is: its
    exact saving (the padded work of the gears before less after) less `plan_confidence`
    standard errors (the addition's and the evictions' variances summed); the best is made
    when that is at least `least` and pays back the capture and that of every evicted gear
    traffic uses (undoing the trade captures it again). Its steps (the evictions, then the
    addition), or none; `off` prefixes why the evicted gears were chosen."""
    gain, gain_var = additions(g, a, work)
    worth = (gain >= least) & (pay.seconds(gain) > pay.capture(a))
    best: tuple[float, int, list[int], float, list[int]] | None = None
    for j in np.flatnonzero(worth):
        new, held, out, used = int(a[j]), g.tolist(), [], []
        room, need, var = pay.headroom, pay.prices.held_bytes([new]), float(gain_var[j])
        while room < need or len(out) < fewest:
            h = np.array(held, np.int64)
            e = np.array([i for i, x in enumerate(held[:-1]) if x not in kept], np.int64)
            if not e.size:
                break
            loss, loss_var = evictions(h, e, work)
            freed = pay.prices.gear_bytes(h[e])
            i = int(np.argmin(loss / np.maximum(freed, 1.0)))
            if loss[i] > 0:
                used.append(held[int(e[i])])
            out.append(held.pop(int(e[i])))
            room, var = room + float(freed[i]), var + float(loss_var[i])
        if room < need or len(out) < fewest:
            continue
        saving = padded(g, work) - padded(np.array(sorted([*held, new]), np.int64), work)
        score = saving - config.plan_confidence * math.sqrt(var)
        net = float(pay.seconds(score)) - float(pay.capture([new, *used]).sum())
        if score >= least and net > 0 and (best is None or net > best[0]):
            best = (net, new, out, saving, used)
    if best is None:
        return []
    _, new, out, saving, used = best
    saved = f"{padding_words(saving, raw)}, {pay.why(float(pay.seconds(saving)), new)}" + (
        f" and {float(pay.capture(used).sum()):.3g} s to capture {', '.join(map(str, used))} "
        "again" if used else "")
    for old in out:
        pay.give(old)
    pay.take(new)
    gone = ", ".join(map(str, out))
    return [*(("evict", old, f"{why}: traded for {new} ({off}earns least per byte; over the "
                             f"memory bound), {saved}") for old in out),
            ("add", new, f"{why}: in for {gone} (over the memory bound), {saved}")]
