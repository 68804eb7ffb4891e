"""The reference design, ported: torch_npu's in-process adaptive gears, as benchmark baseline.

A port of the algorithm of `torch_npu/utils/_adaptive_gears.py` (Ascend/pytorch, branch
v2.7.1): `AdaptiveGearRuntime.record_event` (the request path: one `GearEventSample` per dim
appended, under the sample lock, to its mapped gear's `GearRuntimeState`) and
`GearUpdateWorker.run_once` (the decision round, under the commit lock): `build_stats_snapshot`
(one pass over every sample of every gear: decayed weights, pad and split averages, the raw
samples, the window's pruning), `GearScorer.build_score_breakdown`, `build_eviction_candidates`,
`build_addition_candidates` (`statistics.median` of a candidate's raw samples),
`commit_update` (`GearScorer.compute_replace_loss` for each eviction candidate, the additions
within the cap and the memory budget, the new snapshot). Its data structures and loops are
the reference's, names included, so that a round costs here what it costs there.

Left out, as they are not the algorithm: the NPU (`torch.npu` device and memory reading: no
reading, so never memory pressure), building the shape handling of a new snapshot and the
graph pool's cleanup keys, and the update thread (the caller calls `run_once`).
"""

from __future__ import annotations

import math
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

# AdaptiveGearRuntime.DEFAULT_CONFIG
DEFAULT_CONFIG: dict[str, Any] = {
    "window_seconds": 300.0,
    "update_interval_seconds": 60.0,
    "pad_add_threshold": 0.35,
    "split_add_threshold": 0.20,
    "min_samples_per_gear": 5,
    "add_min_samples": 5,
    "min_gear_count_per_type": 1,
    "max_gears_per_type": 64,
    "recent_use_protect_seconds": 300.0,
    "replace_loss_threshold": 0.60,
    "weight_hit": 0.60,
    "weight_pad": 0.20,
    "weight_split": 0.20,
    "device_memory_usage_threshold_ratio": 0.90,
}


@dataclass
class GearEventSample:
    event_ts: float
    raw_value: int
    pad_ratio: float
    split_ratio: float


@dataclass
class GearRuntimeState:
    gear_id: str
    shape_type: str
    gear_value: int
    samples: list[GearEventSample] = field(default_factory=list)
    cleanup_keys: set[int] = field(default_factory=set)
    created_ts: float = 0.0
    last_hit_ts: float = 0.0


@dataclass
class ScoreBreakdown:
    gear_id: str
    shape_type: str
    gear_value: int
    hit_rate: float
    avg_pad_ratio: float
    avg_split_ratio: float
    score: float


def request_metadata(gears: dict[str, list[int]],
                     raw: dict[str, int]) -> tuple[list, list, list, list]:
    """`record_event`'s inputs for one request of one tensor, as the reference's shape handling
    and `collect_transform_metadata` make them (configs sorted by type): the raw values, the
    mapped gears (the smallest gear >= raw, else the largest: a split), pad and split ratios."""
    raws, mapped, pads, splits = [], [], [], []
    for shape_type in sorted(gears):
        r = raw[shape_type]
        g = next((x for x in gears[shape_type] if x >= r), gears[shape_type][-1])
        raws.append([r])
        mapped.append([g])
        pads.append([max(g - r, 0) / max(g, 1)])
        splits.append([max(r - g, 0) / max(r, 1)])
    return raws, mapped, pads, splits


class ReferenceRuntime:
    """`AdaptiveGearRuntime` and `GearUpdateWorker` of one device: `gears` per shape type."""

    def __init__(self, gears: dict[str, list[int]], config: dict[str, Any] | None = None) -> None:
        self.config = {**DEFAULT_CONFIG, **(config or {})}
        self._sample_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self.active_gears = {t: sorted(set(g)) for t, g in gears.items()}
        self._ordered_types = sorted(self.active_gears)
        self._states: dict[str, GearRuntimeState] = {}
        self._ensure_runtime_states()

    def get_snapshot(self) -> dict[str, list[int]]:
        return {t: list(v) for t, v in self.active_gears.items()}  # clone-on-read

    def record_event(self, raw_gear_values: list, mapped_gear_values: list, pad_ratios: list,
                     split_ratios: list, event_ts: float) -> None:
        if not raw_gear_values or not mapped_gear_values:
            return
        with self._sample_lock:
            for index, shape_type in enumerate(self._ordered_types):
                raw_per_tensor = _value_at(raw_gear_values, index, default=[])
                mapped_per_tensor = _value_at(mapped_gear_values, index, default=[])
                cfg_pad = _value_at(pad_ratios, index, default=[])
                cfg_split = _value_at(split_ratios, index, default=[])
                for tensor_idx, (raw_value, mapped_value) in enumerate(
                        zip(raw_per_tensor, mapped_per_tensor, strict=False)):
                    if raw_value is None or mapped_value is None:
                        continue
                    gear_id = f"{shape_type}:{mapped_value}"
                    state = self._states.get(gear_id)
                    if state is None:
                        state = GearRuntimeState(gear_id, shape_type, mapped_value)
                        self._states[gear_id] = state
                    sample = GearEventSample(
                        event_ts=event_ts,
                        raw_value=raw_value,
                        pad_ratio=float(_value_at(cfg_pad, tensor_idx, default=0.0) or 0.0),
                        split_ratio=float(_value_at(cfg_split, tensor_idx, default=0.0) or 0.0),
                    )
                    state.samples.append(sample)
                    state.last_hit_ts = event_ts

    def build_stats_snapshot(self, now_ts: float) -> dict[str, dict[str, Any]]:
        decay_lambda = math.log(2.0) / max(self.config["window_seconds"] / 2.0, 1e-6)
        window_seconds = self.config["window_seconds"]
        stats_snapshot: dict[str, dict[str, Any]] = {}
        with self._sample_lock:
            for gear_id, state in self._states.items():
                weighted_hits = weighted_pad_sum = weighted_split_sum = 0.0
                raw_samples, kept_samples = [], []
                pad_sample_count = split_sample_count = 0
                for sample in state.samples:
                    age = now_ts - sample.event_ts
                    if age > window_seconds:
                        continue
                    weight = math.exp(-decay_lambda * max(age, 0.0))
                    weighted_hits += weight
                    weighted_pad_sum += sample.pad_ratio * weight
                    weighted_split_sum += sample.split_ratio * weight
                    raw_samples.append(sample.raw_value)
                    if sample.pad_ratio > 0.0:
                        pad_sample_count += 1
                    if sample.split_ratio > 0.0:
                        split_sample_count += 1
                    kept_samples.append(sample)
                state.samples = kept_samples
                stats_snapshot[gear_id] = {
                    "gear_id": gear_id,
                    "shape_type": state.shape_type,
                    "gear_value": state.gear_value,
                    "weighted_hits": weighted_hits,
                    "avg_pad_ratio": weighted_pad_sum / max(weighted_hits, 1e-12),
                    "avg_split_ratio": weighted_split_sum / max(weighted_hits, 1e-12),
                    "sample_count": len(raw_samples),
                    "pad_sample_count": pad_sample_count,
                    "split_sample_count": split_sample_count,
                    "raw_samples": raw_samples,
                    "created_ts": state.created_ts,
                    "last_hit_ts": state.last_hit_ts,
                }
        for shape_type, values in self.get_snapshot().items():
            for gear_value in values:
                gear_id = f"{shape_type}:{gear_value}"
                stats_snapshot.setdefault(gear_id, {
                    "gear_id": gear_id, "shape_type": shape_type, "gear_value": gear_value,
                    "weighted_hits": 0.0, "avg_pad_ratio": 0.0, "avg_split_ratio": 0.0,
                    "sample_count": 0, "pad_sample_count": 0, "split_sample_count": 0,
                    "raw_samples": [], "created_ts": 0.0, "last_hit_ts": 0.0,
                })
        return stats_snapshot

    def build_score_breakdown(self, snapshot: dict[str, list[int]],
                              stats_snapshot: dict[str, dict]) -> dict[str, ScoreBreakdown]:
        totals_by_type: dict[str, float] = {}
        for stat in stats_snapshot.values():
            totals_by_type.setdefault(stat["shape_type"], 0.0)
            totals_by_type[stat["shape_type"]] += stat["weighted_hits"]
        breakdowns: dict[str, ScoreBreakdown] = {}
        for shape_type, gear_values in snapshot.items():
            total_hits = max(totals_by_type.get(shape_type, 0.0), 1e-12)
            for gear_value in gear_values:
                gear_id = f"{shape_type}:{gear_value}"
                stat = stats_snapshot.get(gear_id)
                hit = stat["weighted_hits"] / total_hits if stat else 0.0
                pad = stat["avg_pad_ratio"] if stat else 0.0
                split = stat["avg_split_ratio"] if stat else 0.0
                score = (self.config["weight_hit"] * hit - self.config["weight_pad"] * pad
                         - self.config["weight_split"] * split)
                breakdowns[gear_id] = ScoreBreakdown(gear_id, shape_type, gear_value, hit, pad,
                                                     split, score)
        return breakdowns

    def compute_replace_loss(self, snapshot: dict[str, list[int]],
                             stats_snapshot: dict[str, dict], gear_id: str) -> float:
        stat = stats_snapshot.get(gear_id)
        if stat is None:
            return 0.0
        gear_value = stat["gear_value"]
        alternatives = [c for c in snapshot.get(stat["shape_type"], []) if c != gear_value]
        if not alternatives:
            return float("inf")
        raw_samples = stat.get("raw_samples", [])
        if not raw_samples:
            return 0.0
        best_loss = float("inf")
        for candidate in alternatives:
            total_loss = 0.0
            for raw_value in raw_samples:
                if candidate >= raw_value:
                    total_loss += (candidate - raw_value) / max(candidate, 1)
                else:
                    total_loss += (raw_value - candidate) / max(raw_value, 1)
            best_loss = min(best_loss, total_loss / max(len(raw_samples), 1))
        return best_loss

    def build_eviction_candidates(self, breakdowns: dict[str, ScoreBreakdown],
                                  snapshot: dict[str, list[int]],
                                  stats_snapshot: dict[str, dict], now_ts: float) -> dict[str, str]:
        max_gear_by_type = {t: max(v) for t, v in snapshot.items() if v}
        candidates_by_type: dict[str, list[tuple[float, str]]] = {}
        for gear_id, b in breakdowns.items():
            if b.gear_value == max_gear_by_type.get(b.shape_type):
                continue
            stat = stats_snapshot.get(gear_id, {"created_ts": 0.0, "last_hit_ts": 0.0})
            anchor = max(stat.get("created_ts", 0.0), stat.get("last_hit_ts", 0.0))
            if now_ts - anchor < self.config["recent_use_protect_seconds"]:
                continue
            if len(snapshot.get(b.shape_type, [])) <= self.config["min_gear_count_per_type"]:
                continue
            candidates_by_type.setdefault(b.shape_type, []).append((b.score, gear_id))
        selected = {}
        for shape_type, candidates in candidates_by_type.items():
            candidates.sort(key=lambda item: item[0])
            selected[shape_type] = candidates[0][1]
        return selected

    def build_addition_candidates(self, snapshot: dict[str, list[int]],
                                  stats_snapshot: dict[str, dict]) -> list[tuple]:
        max_gear_by_type = {t: max(v) for t, v in snapshot.items() if v}
        candidates: list[tuple[float, int, str, int]] = []
        for stat in stats_snapshot.values():
            shape_type = stat["shape_type"]
            active = set(snapshot.get(shape_type, []))
            raw_samples = stat.get("raw_samples", [])
            if not raw_samples:
                continue
            if (stat["gear_value"] == max_gear_by_type.get(shape_type)
                    and stat.get("split_sample_count", 0) >= self.config["add_min_samples"]
                    and stat["avg_split_ratio"] >= self.config["split_add_threshold"]):
                g_new = int(statistics.median(raw_samples))
                if g_new not in active:
                    pressure = stat["avg_split_ratio"] - self.config["split_add_threshold"]
                    candidates.append((pressure, stat["sample_count"], shape_type, g_new))
            if (stat.get("pad_sample_count", 0) >= self.config["add_min_samples"]
                    and stat["avg_pad_ratio"] >= self.config["pad_add_threshold"]):
                g_new = int(statistics.median(raw_samples))
                if g_new not in active:
                    pressure = stat["avg_pad_ratio"] - self.config["pad_add_threshold"]
                    candidates.append((pressure, stat["sample_count"], shape_type, g_new))
        candidates.sort(key=lambda x: (x[0], x[1]), reverse=True)
        return candidates

    def run_once(self, now_ts: float) -> tuple[dict[str, list[int]], list[str]] | None:
        """One round: the new gears and the gear ids removed, or None when nothing changed."""
        with self._commit_lock:
            snapshot = self.get_snapshot()
            stats_snapshot = self.build_stats_snapshot(now_ts)
            breakdowns = self.build_score_breakdown(snapshot, stats_snapshot)
            evictions = self.build_eviction_candidates(breakdowns, snapshot, stats_snapshot,
                                                       now_ts)
            additions = self.build_addition_candidates(snapshot, stats_snapshot)
            return self.commit_update(snapshot, stats_snapshot, evictions, additions, now_ts)

    def commit_update(self, snapshot: dict[str, list[int]], stats_snapshot: dict[str, dict],
                      candidate_evictions: dict[str, str], candidate_additions: list[tuple],
                      now_ts: float) -> tuple[dict[str, list[int]], list[str]] | None:
        resource_pressure_high = False  # no device memory reading (module docstring)
        next_active = {t: set(v) for t, v in snapshot.items()}
        removed_gears: list[str] = []
        added = False
        for shape_type, gear_id in candidate_evictions.items():
            gear_value = int(gear_id.split(":", 1)[1])
            loss = self.compute_replace_loss(snapshot, stats_snapshot, gear_id)
            if loss > self.config["replace_loss_threshold"]:
                self.protect_gear_from_eviction(gear_id, now_ts)
                continue
            next_active[shape_type].discard(gear_value)
            removed_gears.append(gear_id)
        budget = None if not resource_pressure_high else len(removed_gears)
        for _, _, shape_type, candidate in candidate_additions:
            if budget is not None and budget <= 0:
                break
            if candidate in next_active.setdefault(shape_type, set()):
                continue
            if len(next_active.get(shape_type, set())) >= self.config["max_gears_per_type"]:
                continue
            next_active[shape_type].add(candidate)
            added = True
            if budget is not None:
                budget -= 1
        if not removed_gears and not added:
            return None
        self.active_gears = {t: sorted(v) for t, v in next_active.items()}
        self._ensure_runtime_states(created_ts=now_ts)
        with self._sample_lock:
            for gear_id in removed_gears:
                self._states.pop(gear_id, None)
        return self.get_snapshot(), removed_gears

    def protect_gear_from_eviction(self, gear_id: str, now_ts: float) -> None:
        with self._sample_lock:
            state = self._states.get(gear_id)
            if state is not None:
                state.last_hit_ts = max(state.last_hit_ts, now_ts)

    def _ensure_runtime_states(self, created_ts: float = 0.0) -> None:
        with self._sample_lock:
            for shape_type, gear_values in self.active_gears.items():
                for gear_value in gear_values:
                    gear_id = f"{shape_type}:{gear_value}"
                    if gear_id not in self._states:
                        self._states[gear_id] = GearRuntimeState(gear_id, shape_type, gear_value,
                                                                 created_ts=created_ts)


def _value_at(values: Any, index: int, default: Any = None) -> Any:
    if isinstance(values, (list, tuple)) and index < len(values):
        return values[index]
    return default
