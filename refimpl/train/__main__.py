"""``python -m refimpl.train NAME [--out DIR] [--steps N]``: train one model of the zoo."""
import argparse
import importlib
import os

from ..models.hf import MODELS_DIR
from . import TRAINERS


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.train", description="Train a model of the zoo on this CPU.")
    p.add_argument("name", choices=sorted(TRAINERS))
    p.add_argument("--out", default=None, help="output folder (default: models/NAME)")
    p.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    args = p.parse_args(argv)
    mod_name, fn_name = TRAINERS[args.name].split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    kw = {} if args.steps is None else {"steps": args.steps}
    fn(args.out or os.path.join(MODELS_DIR, args.name), **kw)


if __name__ == "__main__":
    main()
