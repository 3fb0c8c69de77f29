"""Reasoning Gym SFT of the proposer on teacher revisions (the paper's
Qwen3.5-4B; any HF Qwen3 or Qwen3.5 folder works). Data: the teacher collector's JSONL over the 21 SFT families.
Thinking mode is off (model.enable_thinking): rows are rendered with the template's empty think block,
as GRPO's prompts are (configs/rg_grpo.py). SFT runs no solver, so the setup's solver block
(configs/setups.py) does not apply here; the rows' prompts were built under it at collection.

    python -m launch.train --config configs/rg_sft.py --config.model.path=/models/Qwen3.5-4B \
        --config.sft.data=data/rg_teacher.jsonl
"""

from configs import base


def get_config():
    c = base.get_config()
    c.mode = "sft"
    c.run_dir = "runs/rg_sft"
    c.model.path = ""  # Required: an HF Qwen3 or Qwen3.5 folder (e.g. Qwen/Qwen3.5-4B downloaded by you).
    c.model.preset = ""
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = True
    c.model.enable_thinking = False
    c.mesh.fsdp = -1
    c.sft.data = "data/rg_teacher.jsonl"
    c.sft.steps = 500
    c.sft.batch_size = 32
    c.sft.micro_batches = 4
    c.sft.max_len = 8192
    c.sft_optim.learning_rate = 1e-5
    c.sft_optim.warmup_steps = 20
    c.sft_optim.decay_steps = 480
    c.checkpoint.every = 100
    c.export.dtype = "bfloat16"
    return c
