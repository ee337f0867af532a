"""``python -m refimpl.train NAME [--out DIR] [--steps N] [--device DEV]``: train one model of the zoo."""
import argparse
import importlib
import inspect
import os

from ..models.hf import MODELS_DIR
from . import TRAINERS


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.train", description="Train a model of the zoo (on the CPU "
                                "unless --device names another device for a trainer that takes one).")
    p.add_argument("name", choices=sorted(TRAINERS))
    p.add_argument("--out", default=None, help="output folder (default: models/NAME)")
    p.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (only trainers that take a device: "
                   "eagle3-smollm2-135m; its default is a GPU when there is one)")
    args = p.parse_args(argv)
    mod_name, fn_name = TRAINERS[args.name].split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    kw = {} if args.steps is None else {"steps": args.steps}
    if args.device is not None:
        if "device" not in inspect.signature(fn).parameters:
            p.error(f"--device: {args.name} trains on the CPU only")
        kw["device"] = args.device
    fn(args.out or os.path.join(MODELS_DIR, args.name), **kw)


if __name__ == "__main__":
    main()
