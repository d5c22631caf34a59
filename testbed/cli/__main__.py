"""`python -m testbed.cli`: the same as the `edgebed` command."""

from testbed.cli import main

main()
