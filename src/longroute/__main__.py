"""`python -m longroute` runs the command line."""

from longroute.cli import main

main()
