"""`python -m torpor`: the same command as the `torpor` console script."""

from torpor.cli import main

main()
