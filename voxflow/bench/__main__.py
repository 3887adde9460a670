"""`python -m voxflow.bench ...` = `voxflow bench ...`."""
import sys

from .cli import main

sys.exit(main())
