"""`ModelConfig`: the architecture of a Qwen3 checkpoint, read from its HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Literal

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("qwen3",)
RopeType = Literal["default", "linear", "yarn", "llama3"]
SUPPORTED_ROPE_TYPES = ("default", "linear", "yarn", "llama3")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class ConfigError(ValueError):
    """A config.json value hljax cannot honour; the message names the file and key."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """RoPE frequencies, HF `rope_parameters` fields (scaling fields used by the named type only)."""

    theta: float = 10000.0
    type: RopeType = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    # yarn
    attention_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Dense Qwen3 decoder. `dtype` is the compute dtype, `param_dtype` the storage dtype."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: RopeConfig = RopeConfig()
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    model_type: str = "qwen3"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False  # Recompute each layer's activations in the backward pass.
    # The source config.json, verbatim, so export writes back what it read (not part of identity).
    hf_config_json: str | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    # Where it was read from, so export can copy tokenizer files along.
    source_dir: str | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.rope.type not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(f"rope type {self.rope.type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")

    @classmethod
    def tiny(cls, vocab_size: int, **overrides) -> ModelConfig:
        """The embedded default: trains on 2 CPU cores in minutes."""
        args = dict(
            vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=32, rope=RopeConfig(theta=10000.0), tie_word_embeddings=True,
            max_position_embeddings=4096,
        )
        return cls(**{**args, **overrides})

    @classmethod
    def qwen3_0p6b(cls, **overrides) -> ModelConfig:
        """Qwen3-0.6B's shape (HF Qwen/Qwen3-0.6B config.json)."""
        args = dict(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
            num_kv_heads=8, head_dim=128, rope=RopeConfig(theta=1e6), tie_word_embeddings=True,
            max_position_embeddings=40960, bos_token_id=151643, eos_token_ids=(151645,),
        )
        return cls(**{**args, **overrides})

    @classmethod
    def qwen3_4b(cls, **overrides) -> ModelConfig:
        """Qwen3-4B's shape: Qwen3-0.6B's vocabulary, RoPE and head layout, wider and deeper."""
        size = dict(hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32)
        return cls.qwen3_0p6b(**{**size, **overrides})

    @property
    def num_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_pretrained(cls, path: str, **overrides) -> ModelConfig:
        """Read `path/config.json` (or a config.json path)."""
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file}: no config.json in the checkpoint folder")
        with open(file) as f:
            try:
                hf = json.load(f)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{file}: not valid JSON ({e})") from None
        overrides.setdefault("source_dir", os.path.dirname(os.path.abspath(file)))
        return cls.from_hf_dict(hf, source=file, **overrides)

    @classmethod
    def from_hf_dict(cls, hf: dict, *, source: str = "config.json", **overrides) -> ModelConfig:
        """Validate an HF config dict; any value we do not implement raises naming `source` and key."""

        def bad(key, value, why):
            raise ConfigError(f"{source}: {key}={value!r} is not supported: {why}")

        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            bad("model_type", model_type, f"supported model types are {SUPPORTED_MODEL_TYPES}")
        if hf.get("hidden_act", "silu") != "silu":
            bad("hidden_act", hf["hidden_act"], "Qwen3 uses 'silu'")
        if hf.get("use_sliding_window", False):
            bad("use_sliding_window", True, "sliding-window attention is not implemented")
        layer_types = hf.get("layer_types")
        if layer_types and any(t != "full_attention" for t in layer_types):
            bad("layer_types", layer_types, "only 'full_attention' layers are implemented for qwen3")
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            if not isinstance(hf.get(key), int):
                raise ConfigError(f"{source}: required integer key {key!r} is missing or not an int")

        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        kwargs = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rope=_rope_from_hf(hf, source),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos,
            pad_token_id=hf.get("pad_token_id"),
            model_type=model_type,
            hf_config_json=json.dumps(hf),
        )
        kwargs.update(overrides)
        try:
            return cls(**kwargs)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    def to_hf_dict(self, dtype: str | None = None) -> dict:
        """An HF config.json dict; the source's own keys are kept when it came from one."""
        hf = json.loads(self.hf_config_json) if self.hf_config_json else {}
        rope = {"rope_type": self.rope.type, "rope_theta": self.rope.theta}
        if self.rope.type != "default":
            rope["factor"] = self.rope.factor
        if self.rope.original_max_position_embeddings is not None:
            rope["original_max_position_embeddings"] = self.rope.original_max_position_embeddings
        if self.rope.type == "llama3":
            rope.update(low_freq_factor=self.rope.low_freq_factor, high_freq_factor=self.rope.high_freq_factor)
        eos = list(self.eos_token_ids)
        ours = {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": self.pad_token_id,
        }
        for key, value in ours.items():
            hf.setdefault(key, value)
        if "rope_parameters" not in hf and "rope_theta" not in hf:
            hf["rope_parameters"] = rope
        if dtype is not None:
            hf["dtype"] = dtype
            hf.pop("torch_dtype", None)
        return hf


def _rope_from_hf(hf: dict, source: str) -> RopeConfig:
    """Both the transformers-5 `rope_parameters` and the older `rope_theta` + `rope_scaling` forms."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ConfigError(f"{source}: per-layer-type rope_parameters are not supported for qwen3")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"{source}: rope_type={rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES}); "
            "'dynamic' and 'longrope' depend on the sequence length at run time"
        )
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        raise ConfigError(f"{source}: partial_rotary_factor={partial!r} is not supported for qwen3 (must be 1.0)")
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    original = params.get("original_max_position_embeddings")
    if rope_type in ("yarn", "llama3") and original is None:
        original = hf.get("max_position_embeddings")  # transformers' default for these types
    factor = params.get("factor")
    if rope_type == "yarn" and factor is None:
        factor = hf["max_position_embeddings"] / original
    return RopeConfig(
        theta=float(theta),
        type=rope_type,
        factor=float(factor if factor is not None else 1.0),
        original_max_position_embeddings=original,
        attention_factor=params.get("attention_factor"),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
    )
