"""`gearshift stress`: many workers route flat out through the real client while the controller
decides on short intervals and snapshot readers verify every snapshot they accept; with chaos,
workers and the controller are SIGKILLed at random and restarted (DESIGN.md §6).

| module | what |
| --- | --- |
| `harness.py` | `run(StressConfig)`: starts, watches, kills and restarts the processes, counts |
| `roles.py` | the processes: worker, snapshot reader, controller (`-m gearshift.tools.stress`) |
| `journal.py` | the controller's publication journal, and what makes a snapshot torn |
| `report.py` | `StressReport`: the figures (`KEYS`), their accounting, the invariants |
| `cli.py` | the `gearshift stress` command |

Accounting, exact whatever instant a SIGKILL lands on:

- sent: every worker incarnation has a counter file: `started` is stored before each route()
  call, `finished` after it, so a kill leaves at most one call in flight. A ring's `head`
  (events put) and `dropped` (events that found it full) are written only by the producer,
  each in the one store that commits the event; the call in flight recorded its event iff
  head + dropped == started. sent is `started` then, else `finished`: a route() that records
  no event, or two, shows up as lost != 0.
- consumed: the ring's `tail`, written only by the controller, in the one store that commits a
  drain. It is in shared memory, so it counts across controller restarts, and a controller
  killed mid-drain has not moved it (its successor takes the same records, once). The harness
  maps each incarnation's ring when the worker reports ready and keeps the mapping after the
  controller has drained and unlinked it, until the counters are final (worker dead, ring
  empty).
- dropped: the ring's `dropped`. lost = sent - consumed - dropped: events a worker recorded that
  no controller took out of its ring. What a SIGKILLed controller had taken but not yet saved
  (its statistics since its last state save) dies with it by design: not a lost event. Events
  a controller took but could not attribute (`unknown` and `invalid` in its status document)
  are in the report's details.

Torn snapshots: the controller journals every device publication (device, version, time,
payload) before its publishing store. A reader takes what `SnapshotRegion.read()` returns and
counts it torn unless it is for that device, its version never goes down, and its payload
equals a journaled payload of that version. Workers must route only on journaled versions.

Stall: the wall time of a route() call that blocked (a voluntary context switch: a lock, a
sleep, I/O) or kept its CPU (its thread was off the CPU for at most `roles.LOST_CPU_NS`, 50 us,
of the call: wall minus CPU time). A call that lost its CPU without blocking was interrupted
by other processes or by the hypervisor, and is only counted: on an oversubscribed machine a
thread is preempted for milliseconds anywhere, and on a VM the vCPU itself stops (measured on
2-core development VMs: 15-50 ms with no context switch in the guest, of which even the
thread's CPU clock absorbs up to a few ms), so neither that call's wall time nor its CPU time
is route's. What route() itself does slowly (adopt a snapshot, set off a collection, wait)
happens hundreds of times a run, in calls that keep their CPU too. The wall-clock maximum of
all calls is in the details.

Propagation: from the journal time of a publication to the first route() planned on it, per
worker incarnation (the version it found at connect excluded).
"""

from gearshift.tools.stress.harness import StressConfig, run
from gearshift.tools.stress.report import KEYS, StressReport

__all__ = ["KEYS", "StressConfig", "StressReport", "run"]
