"""`python -m tests.faults.soak --kills N --threads M --seed S`: the long fault soak.

Runs `tests.faults.harness.run_soak` with its own broker (in `--broker-dir`, default
`.torpor/faults-broker`) and prints the summary; exits 0 when every check passed, 1 not.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from tests.faults.harness import SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak", description=__doc__)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--threads", type=int, default=12)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--broker-dir", type=Path, default=Path(".torpor") / "faults-broker")
    parser.add_argument("--root", type=Path, default=None, help="logs and stores (default: a temp dir)")
    parser.add_argument("--no-zombie", action="store_true")
    parser.add_argument("--no-broker-restart", action="store_true")
    parser.add_argument("--librdkafka-debug", default=None, metavar="CONTEXTS",
                        help="librdkafka debug contexts for the processors and the connector, "
                             "e.g. cgrp,eos (their logs grow large)")
    args = parser.parse_args(argv)
    if args.kills < 0 or args.threads < 1:
        parser.error("--kills must be >= 0 and --threads >= 1")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    root = args.root or Path(tempfile.mkdtemp(prefix="torpor-soak-"))
    print(f"logs and stores in {root}", flush=True)
    report = run_soak(SoakConfig(kills=args.kills, threads=args.threads, seed=seed, root=root,
                                 broker_dir=args.broker_dir, zombie=not args.no_zombie,
                                 broker_restart=not args.no_broker_restart,
                                 librdkafka_debug=args.librdkafka_debug),
                      say=lambda line: print(line, flush=True))
    print(report.summary(), flush=True)
    return 0 if not report.problems else 1


if __name__ == "__main__":
    sys.exit(main())
