"""The one schema of a training run. Experiment configs start from `get_config()` and override
fields; the config is locked, so a misspelt key is an error that names it (`--config.los.beta=...`).
Field meanings are documented on the typed configs they become (hljax/rl/run_config.py)."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "sft+grpo"  # sft | grpo | sft+grpo
    c.run_dir = "runs/default"
    c.seed = 0

    c.model = dict(path="", preset="tiny", dtype="float32", param_dtype="float32", remat=False)
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.distributed = dict(initialize=False, coordinator="", num_processes=0, process_id=-1, heartbeat_timeout_s=100,
                         init_timeout_s=300, shutdown_timeout_s=300)

    c.optim = dict(learning_rate=1e-6, warmup_steps=0, decay_steps=1000, final_lr_ratio=0.1, b1=0.9, b2=0.999,
                   eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)
    c.sft_optim = dict(learning_rate=1e-5, warmup_steps=10, decay_steps=1000, final_lr_ratio=0.1, b1=0.9, b2=0.95,
                       eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)
    c.loss = dict(eps_low=0.2, eps_high=0.28, beta=0.0, kl_estimator="k3", aggregation="token_mean",
                  max_tokens=0, std_scaling="group", std_ddof=0, adv_eps=1e-4, logprob_chunk=256)

    c.sft = dict(data="data/sft_tiny.jsonl", steps=0, batch_size=8, micro_batches=1, max_len=1024,
                 eval_rows=8, eval_max_new_tokens=128, eval_temperature=0.7)
    c.grpo = dict(steps=0, prompts_per_step=2, group_size=4, micro_batches=1, mu=1, max_len=2048,
                  max_new_tokens=256, temperature=1.0, top_p=1.0, top_k=-1, scoring_questions=4,
                  scoring_windows=8, state_rounds=4)

    # Revision states GRPO trains on: seed (single-step), offline (phases, pool refreshed by the current
    # proposer), online (live revision chains); see hljax/loop/states.py.
    c.states = dict(mode="seed", refresh_every=50, rounds=2, proposals=4, scoring_questions=8,
                    max_new_tokens=1024, temperature=1.0, keep_seeds=True, max_depth=4)
    c.rollout = dict(backend="embedded_server", url="", sync_dir="", max_batch=16, max_seq_len=4096)
    c.solver = dict(backend="embedded", path="", url="", max_batch=16, max_seq_len=4096, prompt_mode="chat",
                    enable_thinking=False, max_new_tokens=256, temperature=0.0, top_p=1.0, top_k=-1,
                    max_calls=4, max_tokens=2048)
    c.tasks = dict(suite="reasoning_gym", role="rl", families=(), qa_files=(), qa_aliases="", feedback=4,
                   scoring=64, eval=64, pool_size=5000, formats=())
    c.sandbox = dict(isolation="bwrap", workers=2, slots_per_worker=4, timeout_s=20.0, memory_bytes=1 << 30)
    c.reward = dict(score_weight=1.0, valid_bonus=0.1, ran_bonus=0.1, invalid_reward=0.0)
    c.prompt = dict(report_max_chars=6000)

    c.checkpoint = dict(every=50, keep=3, async_save=True)
    c.log = dict(tensorboard=True, plots=True)
    c.export = dict(at_end=True, dtype="", after_sft=False)
    return c
