"""Write a randomly initialised Qwen3 as an HF folder (weights, config, bundled tokenizer).

    python -m launch.init_model --preset tiny --out runs/tiny-qwen3

An existing --out is refused; --overwrite replaces an earlier launch.init_model folder there, and
nothing else (hljax/checkpoint/owner.py).
"""

from hljax.checkpoint import owner
from hljax.checkpoint.presets import PRESETS, init_model
from launch.common import ArgumentParser, start_up

WRITER = "launch.init_model"


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier launch.init_model --out")
    args = parser.parse_args()
    with start_up(args.verbose):  # A taken --out is one line, before the model is built.
        owner.check_replaceable(args.out, WRITER, args.overwrite)
    print(f"wrote {init_model(args.preset, args.out, args.seed, writer=WRITER, replace=args.overwrite)}")


if __name__ == "__main__":
    main()
