"""`gearshift status`'s text: 80 columns by default, the details behind -v, a stopped
controller by its last pid."""

from __future__ import annotations

from typing import Any

from gearshift.controller.view import render

GEARS = [8, 16, 48, 96, 160, 256, 384, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4096,
         5120, 6144, 7168, 8192]
REASON = ("plan of 20 gears (one more saves 4.10% >= 3.50% of the work): padding down 4.10 pts, "
          "saves 7.7 s over 1800 s for 5 s of capture")


def _view(pid: int = 4242, alive: bool = True, doc_pid: int = 4242) -> dict[str, Any]:
    n = len(GEARS)
    costs = {"measurements": n, "gears": GEARS, "graph_bytes": {"a": 1 << 20, "b": 1 << 17},
             **{k: [1e-3 * (i + 1) for i in range(n)]
                for k in ("replay_seconds", "replay_fit", "capture_seconds", "capture_fit")}}
    dim = {"name": "SEQLEN", "gears": GEARS, "hit_rate": [1 / n] * n, "avg_pad": [0.125] * n,
           "padding": 0.125, "samples": 12345, "history_samples": 67890,
           "cost": [2e-4, 2.35e-6, 1.15e-9], "costs": costs}
    doc = {"pid": doc_pid, "embedded": False,
           "events": {"consumed": 123456789, "folded": 123456789, "measured": 40,
                      "unknown": 0, "invalid": 0, "reclaimed_workers": 3, "errors": 0},
           "rounds": {"count": 1234, "last_seconds": 0.0042},
           "workers": [{"slot": 0, "generation": 1, "consumed": 99999, "dropped": 0,
                        "profiles": [[i, f"profile-{i}"] for i in range(8)]}],
           "devices": [{"device": 0, "version": 17, "memory_usage": 0.5,
                        "graph_bytes": {"held": 1.5 * (1 << 30), "bound": 2.0 * (1 << 30)},
                        "lag": {"last_seconds": 0.002},
                        "profiles": [{"name": "prefill", "dims": [dim],
                                      "changes": [["SEQLEN", 2560, "add", REASON]]}]}]}
    return {"namespace": "default",
            "controller": {"pid": pid, "last_pid": pid or doc_pid, "alive": alive,
                           "heartbeat_age_seconds": 0.5},
            "slots": [{"slot": 0, "generation": 1, "pid": 777, "device": 0, "state": "active",
                       "alive": True, "applied_version": 17, "dropped": 0}],
            "versions": {"0": 17}, "status": doc}


def test_status_fits_80_columns_and_keeps_the_details_for_verbose() -> None:
    short, long = render(_view()), render(_view(), verbose=True)
    for text in (short, long):
        assert max(len(line) for line in text.splitlines()) <= 80, text
        assert "8192" in text and "4.10 pts" in text and "saves 7.7 s" in text
    [row] = [line for line in short.splitlines() if line.startswith("   0 ")]
    assert row.endswith("profile-0, +7 more") and "profile-7" in long  # all of them in -v
    assert " hit " not in short and "replay fit" not in short
    hits = [line for line in long.splitlines() if line.startswith("    hit")]
    assert len(hits) == 2  # 20 gears in blocks that fit
    assert "replay fit" in long and "capture fit" in long


def test_a_stopped_controller_shows_its_last_pid_not_pid_0() -> None:
    head = render(_view(pid=0, alive=False, doc_pid=4242)).splitlines()[0]
    assert "NOT RUNNING (last pid 4242)" in head and "pid 0" not in head
    assert "controller pid 4242 running" in render(_view()).splitlines()[0]


def test_a_device_shows_its_graph_bytes_against_its_bound() -> None:
    text = render(_view())
    assert "graphs 1.5 GiB (bound 2 GiB)" in text
    view = _view()
    view["status"]["devices"][0]["graph_bytes"] = {"held": 3 << 20, "bound": None}
    assert "graphs 3 MiB (no bound)" in render(view)  # an older document: no buffers
    view["status"]["devices"][0]["graph_bytes"] = {"held": 3 << 20, "bound": 4 << 20,
                                                   "buffers": 1 << 20}
    assert "graphs 3 MiB with buffers 1 MiB (bound 4 MiB)" in render(view).replace("\xa0", " ")
    view["status"]["devices"][0]["graph_bytes"] = {"held": 0.0, "bound": None}
    assert "graphs" not in render(view)  # nothing priced yet


def test_a_device_shows_its_memory_where_the_document_has_a_sane_one() -> None:
    view = _view()
    assert "memory 50%, graphs" in render(view)  # an older document: no memory_bytes
    view["status"]["devices"][0]["memory_bytes"] = 80 * (1 << 30)
    assert "memory 50% of 80 GiB, graphs" in render(view).replace("\xa0", " ")
    for bad in (True, -1, "80 GiB", float("nan"), 2**51, 1e300):  # over MAX_BYTES: refused
        view["status"]["devices"][0]["memory_bytes"] = bad
        assert "memory 50%, graphs" in render(view)


def test_status_lists_each_group_its_ranks_the_missing_one_its_recorder_and_usable_count(
) -> None:
    view = _view()
    view["status"]["groups"] = [
        {"group": "tp", "profile": "decode", "size": 2, "missing": [1], "recorder": 0,
         "ranks": [[0, 3, 900, 0, True], [1, 4, 901, 1, False]], "usable": 3},
        {"group": "tp2", "profile": "prefill", "size": 4, "missing": [], "recorder": 0,
         "ranks": [[r, r, 800 + r, r, True] for r in range(4)], "usable": 5,
         "lacking": [[3, [[64], [48]]]]},  # a capture that failed on rank 3
        {"group": "bad", "ranks": "not a list"},  # from shared memory: left out
    ]
    text = render(view)
    assert ("group 'tp' (profile decode): 2 ranks, present 0; MISSING rank 1 (decided no "
            "more); recorder rank 0; 3 usable") in " ".join(text.split())
    assert ("group 'tp2' (profile prefill): 4 ranks, present 0, 1, 2, 3; recorder rank 0; "
            "5 usable; rank 3 lacks 64, 48") in " ".join(text.split())
    assert "'bad'" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
