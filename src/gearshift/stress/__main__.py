"""`python -m gearshift.stress ROLE SPEC`: one process of a stress run (see roles.py)."""

import json
import sys

from gearshift.stress.roles import ROLES

ROLES[sys.argv[1]](**json.loads(sys.argv[2]))
