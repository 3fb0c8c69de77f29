"""What every entry point does the same way: logging, and the summary of an evaluation run."""

import logging


def setup_logging(tag: str = "") -> None:
    """`tag`: prefixed to every line, e.g. "[p1/2] " in a multi-process run."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def print_results(title: str, summary: dict) -> None:
    """The results table and where everything went (`summary` from hljax.loop.evaluate.run)."""
    if not summary:  # Not process 0: it tabulates for everyone.
        return
    print(f"\n== {title} ==")
    with open(summary["results_md"]) as f:
        print(f.read())
    for key, value in summary.items():
        print(f"{key:>12}: {value}")
