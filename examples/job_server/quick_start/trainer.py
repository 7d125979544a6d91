"""The job server's quick start: a trainer that submits itself, as the seed's ``dist_train`` does.

Run by hand (with ``$TLAUNCH_SERVER`` and ``$TLAUNCH_TOKEN`` set), it packs this
folder, uploads it and submits itself as the job ``quick-start`` on 2 trainers,
then exits; run by the job (basic mode: ``--rank R --world_size N`` come after
its own arguments), it trains::

    python trainer.py --steps 5
    tlaunch job logs -f quick-start

The same package through the CLI: ``tlaunch job submit . --name quick-start
--num-trainer 2 -- python trainer.py --steps 5``.
"""

import argparse
import os
import sys
import time

from tlaunch.jobs import submit_self


def train(steps: int, rank: int, world: int) -> None:
    loss = 1.0
    for step in range(steps):
        loss *= 0.5 + 0.1 * rank / max(world, 1)
        print(f"rank {rank}/{world} step {step} loss {loss:.4f}", flush=True)
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    # basic mode adds these after the job's own arguments (RANK and WORLD_SIZE say the same)
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
    parser.add_argument("--world_size", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    args = parser.parse_args()
    job = submit_self("quick-start", num_trainer=2)
    if job is not None:  # run by hand: submitted; the job runs this file again, and trains
        name = job["name"]
        print(f"submitted job {name}: {job['state']}; follow it with `tlaunch job logs -f {name}`")
        sys.exit()
    train(args.steps, args.rank, args.world_size)


if __name__ == "__main__":
    main()
