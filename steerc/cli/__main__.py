"""python -m steerc.cli: the steerc command line."""

from steerc.cli import entry

entry()
