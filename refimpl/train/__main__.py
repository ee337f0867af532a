"""``python -m refimpl.train NAME [--out DIR] [--steps N] [--device DEV] [--init DIR]``: train one model of the zoo;
``python -m refimpl.train {eagle3,dflash,pard} --target PATH [--out DIR] [--init DIR]``: a drafter for your own model
(:mod:`refimpl.train.own`)."""
import argparse
import importlib
import inspect
import os

from ..models.hf import MODELS_DIR
from . import TRAINERS
from .own import OWN_KINDS, RECIPES


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.train", description="Train a model of the zoo, or a drafter "
                                "(eagle3, dflash, pard) for your own model with --target (on the CPU unless --device "
                                "names another device).")
    p.add_argument("name", choices=sorted(TRAINERS) + list(OWN_KINDS),
                   help="a zoo model, or a drafter kind to train for --target")
    p.add_argument("--target", default=None, help="with a drafter kind: the model to draft for (a folder with a "
                   "Hugging Face causal LM, a cached id, a zoo name)")
    p.add_argument("--out", default=None, help="output folder (default: models/NAME; a drafter for --target: "
                   "models/<kind>-<target name>, where the front door finds it)")
    p.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (zoo trainers that take a device: "
                   "eagle3-smollm2-135m; the default is a GPU when there is one)")
    p.add_argument("--prompts", default=None, help="with --target: a file of prompts, one per line (or .jsonl "
                   "with a 'prompt' field); default: the course's pool")
    p.add_argument("--recipe", choices=sorted(RECIPES), default=None,
                   help="with --target: the budget and shapes (default: gpu on a CUDA device, else cpu)")
    p.add_argument("--answers", type=int, default=None, help="with --target: how many prompts the target answers")
    p.add_argument("--seconds", type=float, default=None, help="with --target: the training's time budget")
    p.add_argument("--taps", default=None, help="with --target (eagle3, dflash): the target layers the drafter "
                   "reads, comma-separated (e.g. 2,15,27; default: upstream's spread)")
    p.add_argument("--init", default=None, help="a saved drafter's folder to go on training from, with a fresh "
                   "schedule over this run's budget (a drafter for --target; zoo trainers that take one: "
                   "dflash-smollm2-135m)")
    args = p.parse_args(argv)
    if args.name in OWN_KINDS:
        if args.target is None:
            p.error(f"{args.name}: --target PATH is required (the model to train a drafter for)")
        from .own import train

        extra = {k: v for k, v in (("steps", args.steps), ("answers", args.answers), ("seconds", args.seconds))
                 if v is not None}
        if args.taps is not None:
            try:
                extra["taps"] = tuple(int(t) for t in args.taps.split(","))
            except ValueError:
                p.error(f"--taps: comma-separated layer ids, got {args.taps!r}")
        train(args.name, args.target, out=args.out, prompts=args.prompts, device=args.device, recipe=args.recipe,
              init=args.init, **extra)
        return
    for flag in ("target", "prompts", "recipe", "answers", "seconds", "taps"):
        if getattr(args, flag) is not None:
            p.error(f"--{flag}: only with a drafter kind ({', '.join(OWN_KINDS)}) for your own model")
    mod_name, fn_name = TRAINERS[args.name].split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    kw = {} if args.steps is None else {"steps": args.steps}
    if args.device is not None:
        if "device" not in inspect.signature(fn).parameters:
            p.error(f"--device: {args.name} trains on the CPU only")
        kw["device"] = args.device
    if args.init is not None:
        if "init" not in inspect.signature(fn).parameters:
            p.error(f"--init: {args.name} always trains from scratch")
        kw["init"] = args.init
    fn(args.out or os.path.join(MODELS_DIR, args.name), **kw)


if __name__ == "__main__":
    main()
