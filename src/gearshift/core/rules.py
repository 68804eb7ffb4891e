"""Rules mode: the per-gear statistics and the rules of the original policy, one by one.

Per dim, against the gears at the start of the round: at most one eviction (zero-use first,
then the lowest score, blocked and protected when the replacement loss is too high), then
additions at the median of the raw samples behind too much padding or splitting, limited by
the per-dim cap and, under memory pressure, by the round's evictions (docs/policy.md).
`gear_stats` is also what status views show per gear.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim, Gears
from gearshift.core.gears import DimGears, GearChange
from gearshift.core.stats import Histogram


@dataclass(frozen=True)
class GearStat:
    """One gear's window statistics against a gear set.

    A pad sample maps to the gear without split; a split sample exceeds the largest gear and
    counts on it. Averages share one denominator (all of the gear's samples).
    Medians are unweighted (each event in the window once); a candidate is its median rounded
    up and aligned by the dim. `replace_loss` is None for the largest gear (never evicted).
    """

    gear: int
    hit_rate: float
    avg_pad: float
    avg_split: float
    pad_sample_count: int
    split_sample_count: int
    pad_median: float | None
    split_median: float | None
    pad_candidate: int | None
    split_candidate: int | None
    last_hit: float | None
    replace_loss: float | None
    score: float

    @property
    def sample_count(self) -> int:
        return self.pad_sample_count + self.split_sample_count


def gear_stats(gears: Gears, hist: Histogram, dim: Dim,
               config: PolicyConfig | None = None) -> tuple[GearStat, ...]:
    """Per-gear statistics of `hist` against `gears` (sorted), scored with `config`'s weights.

    Cost grows with the distinct values and the gears, never with the number of events.
    Splittable and non-splittable dims count the same way; `dim` aligns the
    addition candidates.
    """
    config = config or PolicyConfig()
    g = np.asarray(gears, np.int64)
    n = len(g)
    v, w, c = hist.values, hist.weights, hist.counts
    block = np.searchsorted(g, v)  # gear index of a pad sample; n marks a split sample
    split = block == n
    gear_of = np.minimum(block, n - 1)
    pad = np.where(split, 0.0, (g[gear_of] - v) / g[gear_of])
    spl = np.where(split, (v - g[-1]) / v, 0.0)
    weight = np.bincount(gear_of, w, n)
    safe = np.where(weight > 0, weight, 1.0)
    avg_pad = np.bincount(gear_of, w * pad, n) / safe
    avg_split = np.bincount(gear_of, w * spl, n) / safe
    total = weight.sum()
    hit = weight / total if total > 0 else np.zeros(n)
    score = config.w_h * hit - config.w_p * avg_pad - config.w_sp * avg_split
    counts = np.bincount(block, c, n + 1).astype(np.int64)  # pad samples per gear, then split
    medians = _block_medians(v, c, block, n + 1)
    last = np.full(n, -np.inf)
    np.maximum.at(last, gear_of, hist.last_seen)
    # Without gear i (< n-1), its samples pad up to gear i+1, the best remaining gear.
    nxt = g[np.minimum(block + 1, n - 1)]
    loss = np.bincount(block, np.where(block < n - 1, w * (nxt - v) / nxt, 0.0), n + 1)[:n] / safe
    return tuple(
        GearStat(gear=int(g[i]), hit_rate=float(hit[i]), avg_pad=float(avg_pad[i]),
                 avg_split=float(avg_split[i]), pad_sample_count=int(counts[i]),
                 split_sample_count=int(counts[n]) if i == n - 1 else 0,
                 pad_median=_opt(medians[i]), split_median=_opt(medians[n]) if i == n - 1 else None,
                 pad_candidate=_aligned(dim, medians[i]),
                 split_candidate=_aligned(dim, medians[n]) if i == n - 1 else None,
                 last_hit=_opt(last[i]), replace_loss=float(loss[i]) if i < n - 1 else None,
                 score=float(score[i]))
        for i in range(n))


def _block_medians(v: np.ndarray, c: np.ndarray, block: np.ndarray, blocks: int) -> np.ndarray:
    """Median of the samples of each block (v sorted, so blocks are contiguous): the mean of
    the two middle samples when their number is even, as `statistics.median`; NaN if empty."""
    if not len(v):
        return np.full(blocks, np.nan)
    cum = np.concatenate(([0], np.cumsum(c)))
    ids = np.arange(blocks)
    start = cum[np.searchsorted(block, ids, "left")]
    size = cum[np.searchsorted(block, ids, "right")] - start
    lo = np.minimum(np.searchsorted(cum, start + (size - 1) // 2, "right") - 1, len(v) - 1)
    hi = np.minimum(np.searchsorted(cum, start + size // 2, "right") - 1, len(v) - 1)
    return np.where(size > 0, (v[lo] + v[hi]) / 2, np.nan)


def _opt(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _aligned(dim: Dim, median: float) -> int | None:
    return dim.aligned(math.ceil(median)) if math.isfinite(median) else None


def rules_round(name: str, dim: Dim, state: DimGears, hist: Histogram, pressure: bool,
                note: str, now: float, config: PolicyConfig) -> list[GearChange]:
    """Rules mode on one dim: one eviction, then additions within the memory budget."""
    table = gear_stats(state.gears, hist, dim, config)
    out = _eviction(name, state, table, now, config)
    evicted = [c.gear for c in out if c.action == "evict"]
    budget = len(evicted) if pressure else math.inf
    count = len(state.gears) - len(evicted)
    return out + _additions(name, state.gears, count, table, budget,
                            note and f"; replaces an eviction under {note[2:]}", config)


def _eviction(name: str, state: DimGears, table: tuple[GearStat, ...], now: float,
              config: PolicyConfig) -> list[GearChange]:
    """At most one eviction: filters, then zero-use first, then the lowest score; a
    replacement loss over the threshold blocks it and extends the gear's protection."""
    if len(state.gears) <= config.min_gear_count_per_type:
        return []
    candidates = [s for s in table[:-1] if not _protected(s, state, now, config)]
    if not candidates:
        return []
    # Zero-use first, then the lowest score; ties: the larger gear (frees more memory).
    s = min(candidates, key=lambda s: (s.sample_count > 0, s.score, -s.gear))
    assert s.replace_loss is not None  # the largest gear is never a candidate
    if s.replace_loss > config.replace_loss_threshold:
        until = now + config.recent_use_protect_seconds
        return [GearChange(name, s.gear, "protect", (
            f"eviction blocked: replacement loss {s.replace_loss:.2f} > "
            f"{config.replace_loss_threshold} (score {s.score:.3f}); protected until {until:g}"))]
    why = ("no use in the window" if s.sample_count == 0 else
           f"lowest score {s.score:.3f} (hit {s.hit_rate:.3f}, pad {s.avg_pad:.2f}, "
           f"split {s.avg_split:.2f}, {s.sample_count} samples)")
    return [GearChange(name, s.gear, "evict", f"{why}; replacement loss {s.replace_loss:.2f} "
                       f"<= {config.replace_loss_threshold}")]


def _protected(s: GearStat, state: DimGears, now: float, config: PolicyConfig) -> bool:
    """Recent use or creation (`now − max(created, last hit) < recent_use_protect_seconds`),
    or a protection set by the replacement-loss rule."""
    hit = s.last_hit if s.last_hit is not None else -math.inf
    used = max(state.created.get(s.gear, -math.inf), hit)
    return (now - used < config.recent_use_protect_seconds
            or now < state.protected_until.get(s.gear, -math.inf))


def _additions(name: str, gears: Gears, count: int, table: tuple[GearStat, ...],
               budget: float, note: str, config: PolicyConfig) -> list[GearChange]:
    """Pad- and split-driven candidates, in pressure order, without exact duplicates,
    within the per-dim cap (`count` gears are left after evictions) and the budget."""
    found = []  # (pressure, samples, candidate, reason)
    for s in table:
        if s.pad_sample_count >= config.add_min_samples and s.avg_pad >= config.pad_add_threshold:
            found.append(_candidate(s, "pad", s.avg_pad, config.pad_add_threshold,
                                    s.pad_sample_count, s.pad_median, s.pad_candidate))
        if (s.split_sample_count >= config.add_min_samples
                and s.avg_split >= config.split_add_threshold):
            found.append(_candidate(s, "split", s.avg_split, config.split_add_threshold,
                                    s.split_sample_count, s.split_median, s.split_candidate))
    found.sort(key=lambda f: (-f[0], -f[1], f[2]))
    taken: set[int] = set(gears)
    out: list[GearChange] = []
    for _, _, gear, reason in found:
        if gear in taken:
            continue
        if len(out) >= budget or count + len(out) >= config.max_gears_per_type:
            break
        taken.add(gear)
        out.append(GearChange(name, gear, "add", reason + note))
    return out


def _candidate(s: GearStat, kind: str, avg: float, threshold: float, samples: int,
               median: float | None, gear: int | None) -> tuple[float, int, int, str]:
    assert median is not None and gear is not None  # samples >= add_min_samples >= 1
    where = "largest gear" if kind == "split" else "gear"
    reason = (f"{kind}-driven from {where} {s.gear}: avg_{kind} {avg:.2f} >= {threshold} over "
              f"{samples} {kind} samples, median {median:g}")
    return avg - threshold, samples, gear, reason if gear == median else f"{reason} -> {gear}"
