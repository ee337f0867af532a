"""``python -m refimpl.export NAME --to DIR``: one of our trained drafters (a zoo name, or the folder of one trained
for your own model) in the layout vLLM loads."""
import argparse
import json

from . import EXPORTERS, export


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.export",
                                description="Write a trained drafter in the layout a serving engine (vLLM) loads.")
    p.add_argument("name", help=f"a drafter of the zoo ({', '.join(sorted(EXPORTERS))}) or the folder of one trained "
                   "for your own model (python -m refimpl.train KIND --target PATH)")
    p.add_argument("--to", required=True, help="output folder")
    args = p.parse_args(argv)
    try:
        info = export(args.name, args.to)
    except ValueError as e:
        p.error(str(e))
    print(json.dumps(info, indent=1))
    print("vLLM: LLM(model=<target folder>, speculative_config=" + json.dumps(info["speculative_config"]) + ")")


if __name__ == "__main__":
    main()
