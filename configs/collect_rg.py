"""Teacher SFT data for Reasoning Gym (the paper: a 35B teacher's revisions of the seed harness on the
21 SFT families, kept when they beat the seed on the scoring set and pass the quality filters).
The defaults of `CollectConfig` are this collection, so this file names only its outputs; field
meanings are on the typed configs in hljax/data/collect_config.py (CollectConfig, TeacherSpec) and
hljax/harness/filters.py (FilterConfig).

    # The teacher: any OpenAI-compatible endpoint (SGLang, vLLM, ...), e.g.
    python -m sglang.launch_server --model-path /models/TEACHER --port 30001
    # The solver (the paper: Qwen3.5-4B):
    python -m sglang.launch_server --model-path /models/Qwen3.5-4B --port 30000
    python -m launch.collect --config configs/collect_rg.py \
        --config.teacher.url=http://localhost:30001 --config.teacher.model=TEACHER \
        --config.solver.url=http://localhost:30000 --config.solver.path=/models/Qwen3.5-4B

Then `python -m launch.train --config configs/rg_sft.py --config.sft.data=data/rg_teacher.jsonl`.
"""

import ml_collections

from hljax.config import config_tree
from hljax.data.collect_config import CollectConfig


def get_config() -> ml_collections.ConfigDict:
    c = config_tree(CollectConfig)
    c.out = "data/rg_teacher.jsonl"
    c.run_dir = "runs/collect_rg"
    return c
