"""A benchmark's command line, and its table run once per Keras flavour, each in its own process.

The flavour is fixed when TensorFlow is imported (TF_USE_LEGACY_KERAS), so
comparing Keras 3 with tf-keras takes one process each.
"""

import argparse
import os
import subprocess
import sys

FLAVOUR_SETTING = {"keras3": "0", "tf-keras": "1"}


def main(description, table, rounds, steps, round_help, steps_help):
    """Parse --rounds, --steps and --flavours, then run table(rounds, steps) here or once per flavour."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=rounds, help=f"{round_help} (default {rounds})")
    parser.add_argument("--steps", type=int, default=steps, help=f"{steps_help} (default {steps})")
    parser.add_argument("--flavours", nargs="+", choices=tuple(FLAVOUR_SETTING),
                        help="run each Keras flavour in its own process (default: the current one)")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be >= 1")
    if not args.flavours:
        table(args.rounds, args.steps)
        return
    for flavour in args.flavours:
        environment = dict(os.environ, TF_USE_LEGACY_KERAS=FLAVOUR_SETTING[flavour])
        subprocess.run([sys.executable, sys.argv[0], "--rounds", str(args.rounds), "--steps", str(args.steps)],
                       env=environment, check=True)
