"""``python -m refimpl.export NAME --to DIR``: one of our trained drafters in the layout vLLM loads."""
import argparse
import json

from . import EXPORTERS, export


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.export",
                                description="Write a trained drafter in the layout a serving engine (vLLM) loads.")
    p.add_argument("name", choices=sorted(EXPORTERS))
    p.add_argument("--to", required=True, help="output folder")
    args = p.parse_args(argv)
    info = export(args.name, args.to)
    print(json.dumps(info, indent=1))
    print("vLLM: LLM(model=<target folder>, speculative_config=" + json.dumps(info["speculative_config"]) + ")")


if __name__ == "__main__":
    main()
