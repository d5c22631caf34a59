"""`python -m testbed.node.fleet HOST UP DOWN`: a fleet host's container runs this (node.fleet.host)."""
import sys

from testbed.node.fleet.host import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
