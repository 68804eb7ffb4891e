"""`python -m gearshift.tools.stress ROLE SPEC`: one process of a stress run (see roles.py)."""

import json
import sys

from gearshift.tools.stress.roles import ROLES

ROLES[sys.argv[1]](**json.loads(sys.argv[2]))
