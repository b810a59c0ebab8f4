from steerc.cli import entry

entry()
