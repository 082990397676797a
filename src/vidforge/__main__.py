"""`python -m vidforge`: the same command line as `vidforge` (what `--nproc` starts its workers with)."""

from vidforge.cli.app import main

main()
