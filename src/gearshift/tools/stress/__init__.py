"""`gearshift stress`: many workers route flat out through the real client while the controller
decides on short intervals and snapshot readers verify every snapshot they accept; with chaos,
workers and the controller are SIGKILLed at random and restarted.

| module | what |
| --- | --- |
| `harness.py` | `run(StressConfig)`: starts, watches, kills and restarts the processes |
| `roles.py` | the processes: worker, snapshot reader, controller (`-m gearshift.tools.stress`) |
| `journal.py` | the controller's publication journal, and what makes a snapshot torn |
| `tally.py` | the run's books (incarnations, kills, downtime) and the counting at the end |
| `report.py` | `StressReport`: the figures (`KEYS`), their accounting, the invariants |
| `faults.py` | deployment faults run for real: a full /dev/shm, a worker forked after connect |
| `lockfaults.py` | the namespace lock's faults: a holder stopped, then killed, holding it |
| `cli.py` | the `gearshift stress` command |

A run must accept no torn snapshot, lose no event (lost = sent - consumed - dropped), leak no
segment, route on no unpublished version and stall no route() call over 1 ms: a call stalls for
its wall time when it blocked or kept its CPU; one that lost its CPU without blocking (other
processes, the hypervisor) is only counted. The accounting, exact whatever instant a SIGKILL
lands on, and the reasons: docs/tools.md.
"""

from gearshift.tools.stress.harness import StressConfig, run
from gearshift.tools.stress.report import KEYS, StressReport

__all__ = ["KEYS", "StressConfig", "StressReport", "run"]
