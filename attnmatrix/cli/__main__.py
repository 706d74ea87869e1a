"""`python -m attnmatrix.cli`: the same command line as `attnmatrix`."""

from attnmatrix.cli import main

main()
