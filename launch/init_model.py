"""Write a randomly initialised Qwen3 as an HF folder (weights, config, bundled tokenizer).

    python -m launch.init_model --preset tiny --out runs/tiny-qwen3
"""

import argparse

from hljax.checkpoint.presets import PRESETS, init_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"wrote {init_model(args.preset, args.out, args.seed)}")


if __name__ == "__main__":
    main()
