"""`ModelConfig`: the architecture of a Qwen3 or Qwen3.5 checkpoint, read from its HF `config.json`.

Qwen3.5 comes in two config layouts: `qwen3_5` (Qwen3_5ForConditionalGeneration, the released
checkpoints: the text model's keys nested under `text_config`, a vision tower beside it) and
`qwen3_5_text` (Qwen3_5ForCausalLM, flat). Both describe the same text model; `model_type` keeps
which one was read so export writes the same layout back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Literal

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_5", "qwen3_5_text")
QWEN3_5_TYPES = ("qwen3_5", "qwen3_5_text")
LAYER_TYPES = ("full_attention", "linear_attention")
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
    # Fraction of head_dim that is rotated (Qwen3.5: 0.25); the rest passes through.
    partial_rotary_factor: float = 1.0


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
    # Attention over many query tokens (training, scoring, prefill) through the CPU kernel of
    # hljax/kernels/cpu_attention.py (fp32, one device); decode steps are the engine's business.
    attention_kernel: bool = False
    # Qwen3.5 (hybrid): per-layer "full_attention" | "linear_attention"; () means all full attention.
    layer_types: tuple[str, ...] = ()
    linear_conv_kernel_dim: int = 4  # Gated DeltaNet causal depthwise conv width.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    # Tokens per chunk of the chunked Gated DeltaNet form (training, prefill); ours, not HF's. Any
    # value gives the same result up to rounding; 64 is what FLA's kernels use.
    linear_chunk_size: int = 64
    # The source config.json, verbatim, so export writes back what it read (not part of identity).
    hf_config_json: str | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    # Where it was read from, so export can copy tokenizer files along.
    source_dir: str | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    # Prefix of the text model's keys in the source safetensors ("model." or "model.language_model.").
    hf_prefix: str = dataclasses.field(default="model.", compare=False, hash=False, repr=False)

    def __post_init__(self):
        if self.model_type in QWEN3_5_TYPES:
            self._check_qwen3_5()
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.rope.type not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(f"rope type {self.rope.type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")

    def _check_qwen3_5(self):
        if len(self.layer_types) != self.num_layers:
            raise ConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ConfigError(f"layer_types={bad!r} is not supported (supported: {LAYER_TYPES})")
        if self.linear_num_value_heads % max(self.linear_num_key_heads, 1) or self.linear_num_key_heads < 1:
            raise ConfigError(f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                              f"linear_num_key_heads={self.linear_num_key_heads}")
        if self.linear_chunk_size < 1 or self.linear_conv_kernel_dim < 1:
            raise ConfigError("linear_chunk_size and linear_conv_kernel_dim must be positive")

    @property
    def is_hybrid(self) -> bool:
        """Qwen3.5: Gated DeltaNet + gated full attention, zero-centred RMSNorm, partial RoPE."""
        return self.model_type in QWEN3_5_TYPES

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope.partial_rotary_factor)

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
    def tiny_deep(cls, vocab_size: int, **overrides) -> ModelConfig:
        """The embedded default with 4 layers instead of 2 (issue 33: a proposer that copies spans of a
        long prompt more exactly); about 1.3x its cost per token."""
        return cls.tiny(vocab_size, **{"num_layers": 4, **overrides})

    @classmethod
    def tiny_hd128(cls, vocab_size: int, **overrides) -> ModelConfig:
        """The embedded default with sglang-jax's head size (its attention needs a multiple of 128): the
        proposer of the sglang-jax tests."""
        return cls.tiny(vocab_size, **{**dict(num_heads=2, num_kv_heads=1, head_dim=128), **overrides})

    @classmethod
    def tiny_qwen3_5(cls, vocab_size: int, **overrides) -> ModelConfig:
        """The embedded default's size in the hybrid architecture: one Gated DeltaNet layer, then one
        gated full-attention layer."""
        args = dict(
            model_type="qwen3_5_text", layer_types=("linear_attention", "full_attention"), head_dim=64,
            rope=RopeConfig(theta=10000.0, partial_rotary_factor=0.25), linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        )
        return cls.tiny(vocab_size, **{**args, **overrides})

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

    @classmethod
    def qwen3_5_4b(cls, **overrides) -> ModelConfig:
        """Qwen3.5-4B's text model as public copies of its config.json give it (text_config of a
        Qwen3_5ForConditionalGeneration); check against the real file when you have it."""
        args = dict(
            vocab_size=248320, hidden_size=2560, intermediate_size=9216, num_layers=32, num_heads=16,
            num_kv_heads=4, head_dim=256, rope=RopeConfig(theta=1e7, partial_rotary_factor=0.25),
            tie_word_embeddings=True, max_position_embeddings=262144, eos_token_ids=(248044,),
            model_type="qwen3_5_text", layer_types=("linear_attention",) * 3 + ("full_attention",),
            linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        )
        args.update(overrides)
        if "layer_types" not in overrides:  # every 4th layer full attention, for any depth
            args["layer_types"] = tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                        for i in range(args["num_layers"]))
        return cls(**args)

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
        if model_type in QWEN3_5_TYPES:
            return _qwen3_5_from_hf(cls, hf, source, overrides)
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
        if self.is_hybrid:
            return _qwen3_5_to_hf(self, dtype)
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


def _rope_from_hf(hf: dict, source: str, partial_ok: bool = False) -> RopeConfig:
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
    if partial not in (None, 1.0) and not partial_ok:
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
        partial_rotary_factor=float(partial if partial is not None else 1.0),
    )


# Qwen3_5TextConfig's defaults, used where a config.json leaves a key out (as transformers does).
_QWEN3_5_DEFAULTS = dict(
    linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
    linear_num_value_heads=32, head_dim=256, max_position_embeddings=32768, partial_rotary_factor=0.25,
)
_LINEAR_KEYS = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                "linear_num_value_heads")


def _qwen3_5_from_hf(cls, hf: dict, source: str, overrides: dict) -> ModelConfig:
    """Qwen3.5's text model from either layout. The multimodal RoPE sections (`mrope_section`) are
    ignored: for text tokens the temporal, height and width positions are equal, so M-RoPE reduces to
    plain RoPE over the rotated dims. Image and video inputs are not supported (text model only)."""
    model_type = hf["model_type"]
    text = hf
    if model_type == "qwen3_5":
        text = hf.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError(f"{source}: model_type='qwen3_5' needs a 'text_config' object")
    where = "text_config." if text is not hf else ""

    def bad(key, value, why):
        raise ConfigError(f"{source}: {where}{key}={value!r} is not supported: {why}")

    if text.get("hidden_act", "silu") != "silu":
        bad("hidden_act", text["hidden_act"], "Qwen3.5 uses 'silu'")
    if text.get("attention_bias", False):
        bad("attention_bias", True, "biased projections are not implemented for qwen3_5")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not isinstance(text.get(key), int):
            raise ConfigError(f"{source}: required integer key {where}{key!r} is missing or not an int")
    layers = text["num_hidden_layers"]
    layer_types = text.get("layer_types")
    if layer_types is None:  # transformers' rule: every `full_attention_interval`-th layer is full attention.
        interval = text.get("full_attention_interval", 4)
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    bad_types = sorted(set(layer_types) - set(LAYER_TYPES))
    if bad_types:
        bad("layer_types", bad_types, f"supported layer types are {LAYER_TYPES}")
    rope_src = dict(text)
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    params.pop("mrope_section", None)
    params.pop("mrope_interleaved", None)
    params.setdefault("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    rope_src["rope_parameters"] = params
    try:
        rope = _rope_from_hf(rope_src, source, partial_ok=True)
    except ConfigError as e:
        raise ConfigError(f"{e} (in {where or 'the top level'})") from None
    tie = text.get("tie_word_embeddings", False)
    if text is not hf and "tie_word_embeddings" in hf:
        # Qwen3_5ForConditionalGeneration ties by the top-level flag, Qwen3_5ForCausalLM by text_config's.
        if "tie_word_embeddings" in text and text["tie_word_embeddings"] != hf["tie_word_embeddings"]:
            bad("tie_word_embeddings", text["tie_word_embeddings"],
                f"it disagrees with the top-level tie_word_embeddings={hf['tie_word_embeddings']!r}")
        tie = hf["tie_word_embeddings"]
    heads = text["num_attention_heads"]
    eos = text.get("eos_token_id", hf.get("eos_token_id"))
    eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
    kwargs = dict(
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"],
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or _QWEN3_5_DEFAULTS["head_dim"],
        rope=rope,
        rms_norm_eps=text.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(tie),
        max_position_embeddings=text.get("max_position_embeddings", _QWEN3_5_DEFAULTS["max_position_embeddings"]),
        bos_token_id=text.get("bos_token_id", hf.get("bos_token_id")),
        eos_token_ids=eos,
        pad_token_id=text.get("pad_token_id", hf.get("pad_token_id")),
        model_type=model_type,
        layer_types=tuple(layer_types),
        hf_config_json=json.dumps(hf),
        **{k: text.get(k, _QWEN3_5_DEFAULTS[k]) for k in _LINEAR_KEYS},
    )
    kwargs.update(overrides)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _qwen3_5_to_hf(cfg: ModelConfig, dtype: str | None) -> dict:
    """config.json in the layout read (nested `text_config` for qwen3_5, flat for qwen3_5_text)."""
    hf = json.loads(cfg.hf_config_json) if cfg.hf_config_json else {}
    nested = cfg.model_type == "qwen3_5"
    text = hf.setdefault("text_config", {}) if nested else hf
    eos = list(cfg.eos_token_ids)
    rope = {"rope_type": cfg.rope.type, "rope_theta": cfg.rope.theta,
            "partial_rotary_factor": cfg.rope.partial_rotary_factor}
    ours = {
        "model_type": "qwen3_5_text",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": False,
        "max_position_embeddings": cfg.max_position_embeddings,
        "layer_types": list(cfg.layer_types),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": cfg.pad_token_id,
        **{k: getattr(cfg, k) for k in _LINEAR_KEYS},
    }
    for key, value in ours.items():
        text.setdefault(key, value)
    if "rope_parameters" not in text and "rope_theta" not in text:
        text["rope_parameters"] = rope
    if nested:
        hf.setdefault("model_type", "qwen3_5")
        hf.setdefault("architectures", ["Qwen3_5ForConditionalGeneration"])
        hf.setdefault("tie_word_embeddings", cfg.tie_word_embeddings)
    else:
        hf["model_type"] = "qwen3_5_text"
        hf.setdefault("architectures", ["Qwen3_5ForCausalLM"])
    if dtype is not None:
        for d in (hf, text):
            d.pop("torch_dtype", None)
        hf["dtype"] = dtype
        if "dtype" in text:
            text["dtype"] = dtype
    return hf
