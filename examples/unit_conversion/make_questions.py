"""Writes questions.jsonl, the example's 300 unit conversions (already in the repo; rerun to change them).

    python examples/unit_conversion/make_questions.py
"""

import json
import os
import random

# (from, to, factor): value_to = value_from * factor.
UNITS = [
    ("miles", "kilometres", 1.609344), ("kilometres", "miles", 1 / 1.609344), ("feet", "metres", 0.3048),
    ("inches", "centimetres", 2.54), ("pounds", "kilograms", 0.45359237), ("kilograms", "pounds", 1 / 0.45359237),
    ("ounces", "grams", 28.349523125), ("gallons (US)", "litres", 3.785411784), ("litres", "gallons (US)", 1 / 3.785411784),
    ("yards", "metres", 0.9144), ("acres", "square metres", 4046.8564224), ("nautical miles", "kilometres", 1.852),
]


def main(n: int = 300, seed: int = 0) -> None:
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        src, dst, factor = rng.choice(UNITS)
        value = round(rng.uniform(0.5, 500), rng.choice((0, 1, 2)))
        question = f"Convert {value:g} {src} to {dst}. Reply with the number only."
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": round(value * factor, 4)})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "questions.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {len(rows)} questions to {path}")


if __name__ == "__main__":
    main()
