"""HF safetensors checkpoints <-> our NNX Qwen3 and Qwen3.5.

One declarative table maps each HF key to an NNX path and a pair of inverse transforms. Loading
places every array directly with its target sharding (each device reads only its own slice of a
memory-mapped file); export gathers, transforms back and writes sharded safetensors + index.json.
Both directions check loudly: unused HF keys, missing parameters and shape mismatches are errors
that name the file and key.

Qwen3.5 checkpoints as released (Qwen3_5ForConditionalGeneration) hold the text model under
`model.language_model.`, a vision tower under `model.visual.` and possibly multi-token-prediction
weights under `mtp.`; Qwen3_5ForCausalLM saves the text model under `model.`. Either prefix loads.
We use only the text model: the other tensors are skipped on load (logged) and copied unchanged
from the source folder on export, so an exported checkpoint keeps its vision tower.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
import shutil
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from hljax import sharding as shd
from hljax.checkpoint import owner
from hljax.checkpoint.safetensors_io import open_tensors, save_file
from hljax.models import registry
from hljax.models.config import DTYPES, ModelConfig

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Files next to the weights that a serving engine needs unchanged.
AUX_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)

Transform = Callable[[np.ndarray, ModelConfig], np.ndarray]


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model; the message names the file and key."""


@dataclasses.dataclass(frozen=True)
class Rule:
    hf: str  # HF key; "{i}" stands for the layer index.
    ours: str  # Dotted NNX path; "{i}" likewise.
    to_ours: Transform
    to_hf: Transform


def _same(w, c):
    return w


def _transpose(w, c):
    return w.T


def _heads_in(attr: str) -> tuple[Transform, Transform]:
    """HF [n*H, D] <-> ours [D, n, H] for q/k/v projections (n = heads or kv heads)."""

    def to_ours(w, c):
        return w.reshape(getattr(c, attr), c.head_dim, c.hidden_size).transpose(2, 0, 1)

    def to_hf(w, c):
        return w.transpose(1, 2, 0).reshape(getattr(c, attr) * c.head_dim, c.hidden_size)

    return to_ours, to_hf


def _bias_in(attr: str) -> tuple[Transform, Transform]:
    """HF [n*H] <-> ours [n, H]."""
    return (lambda w, c: w.reshape(getattr(c, attr), c.head_dim)), (lambda w, c: w.reshape(-1))


def _o_to_ours(w, c):  # HF [D, N*H] -> ours [N, H, D]
    return w.reshape(c.hidden_size, c.num_heads, c.head_dim).transpose(1, 2, 0)


def _o_to_hf(w, c):
    return w.transpose(2, 0, 1).reshape(c.hidden_size, c.num_heads * c.head_dim)


_L = "model.layers.{i}."
QWEN3_RULES: tuple[Rule, ...] = (
    Rule("model.embed_tokens.weight", "embed", _same, _same),
    Rule(_L + "input_layernorm.weight", "layers.{i}.input_norm.scale", _same, _same),
    Rule(_L + "self_attn.q_proj.weight", "layers.{i}.attn.q_proj", *_heads_in("num_heads")),
    Rule(_L + "self_attn.k_proj.weight", "layers.{i}.attn.k_proj", *_heads_in("num_kv_heads")),
    Rule(_L + "self_attn.v_proj.weight", "layers.{i}.attn.v_proj", *_heads_in("num_kv_heads")),
    Rule(_L + "self_attn.o_proj.weight", "layers.{i}.attn.o_proj", _o_to_ours, _o_to_hf),
    Rule(_L + "self_attn.q_proj.bias", "layers.{i}.attn.q_bias", *_bias_in("num_heads")),
    Rule(_L + "self_attn.k_proj.bias", "layers.{i}.attn.k_bias", *_bias_in("num_kv_heads")),
    Rule(_L + "self_attn.v_proj.bias", "layers.{i}.attn.v_bias", *_bias_in("num_kv_heads")),
    Rule(_L + "self_attn.o_proj.bias", "layers.{i}.attn.o_bias", _same, _same),
    Rule(_L + "self_attn.q_norm.weight", "layers.{i}.attn.q_norm.scale", _same, _same),
    Rule(_L + "self_attn.k_norm.weight", "layers.{i}.attn.k_norm.scale", _same, _same),
    Rule(_L + "post_attention_layernorm.weight", "layers.{i}.post_attn_norm.scale", _same, _same),
    Rule(_L + "mlp.gate_proj.weight", "layers.{i}.mlp.gate_proj", _transpose, _transpose),
    Rule(_L + "mlp.up_proj.weight", "layers.{i}.mlp.up_proj", _transpose, _transpose),
    Rule(_L + "mlp.down_proj.weight", "layers.{i}.mlp.down_proj", _transpose, _transpose),
    Rule("model.norm.weight", "final_norm.scale", _same, _same),
    Rule("lm_head.weight", "lm_head", _transpose, _transpose),
)


def _qg_to_ours(w, c):  # HF [N*2H, D], rows [q_h | gate_h] per head -> ours [D, N, 2H]
    return w.reshape(c.num_heads, 2 * c.head_dim, c.hidden_size).transpose(2, 0, 1)


def _qg_to_hf(w, c):
    return w.transpose(1, 2, 0).reshape(c.num_heads * 2 * c.head_dim, c.hidden_size)


def _z_to_ours(w, c):  # HF [Hv*Dv, D] -> ours [D, Hv, Dv]
    return w.reshape(c.linear_num_value_heads, c.linear_value_head_dim, c.hidden_size).transpose(2, 0, 1)


def _z_to_hf(w, c):
    return w.transpose(1, 2, 0).reshape(-1, c.hidden_size)


def _out_to_ours(w, c):  # HF [D, Hv*Dv] -> ours [Hv, Dv, D]
    return w.reshape(c.hidden_size, c.linear_num_value_heads, c.linear_value_head_dim).transpose(1, 2, 0)


def _out_to_hf(w, c):
    return w.transpose(2, 0, 1).reshape(c.hidden_size, -1)


def _conv_to_ours(w, c):  # HF depthwise Conv1d [C, 1, W] -> ours [W, C]
    return w[:, 0, :].T


def _conv_to_hf(w, c):
    return w.T[:, None, :]


_A = _L + "self_attn."
_G = _L + "linear_attn."
_MLP_RULES = tuple(r for r in QWEN3_RULES if ".mlp." in r.hf)
# HF keys are written with the "model." prefix; a checkpoint's own prefix replaces it (see `plan`).
QWEN3_5_RULES: tuple[Rule, ...] = (
    Rule("model.embed_tokens.weight", "embed", _same, _same),
    Rule(_L + "input_layernorm.weight", "layers.{i}.input_norm.scale", _same, _same),
    Rule(_L + "post_attention_layernorm.weight", "layers.{i}.post_attn_norm.scale", _same, _same),
    Rule(_A + "q_proj.weight", "layers.{i}.attn.q_proj", _qg_to_ours, _qg_to_hf),
    Rule(_A + "k_proj.weight", "layers.{i}.attn.k_proj", *_heads_in("num_kv_heads")),
    Rule(_A + "v_proj.weight", "layers.{i}.attn.v_proj", *_heads_in("num_kv_heads")),
    Rule(_A + "o_proj.weight", "layers.{i}.attn.o_proj", _o_to_ours, _o_to_hf),
    Rule(_A + "q_norm.weight", "layers.{i}.attn.q_norm.scale", _same, _same),
    Rule(_A + "k_norm.weight", "layers.{i}.attn.k_norm.scale", _same, _same),
    Rule(_G + "in_proj_qkv.weight", "layers.{i}.linear_attn.in_proj_qkv", _transpose, _transpose),
    Rule(_G + "in_proj_z.weight", "layers.{i}.linear_attn.in_proj_z", _z_to_ours, _z_to_hf),
    Rule(_G + "in_proj_b.weight", "layers.{i}.linear_attn.in_proj_b", _transpose, _transpose),
    Rule(_G + "in_proj_a.weight", "layers.{i}.linear_attn.in_proj_a", _transpose, _transpose),
    Rule(_G + "conv1d.weight", "layers.{i}.linear_attn.conv", _conv_to_ours, _conv_to_hf),
    Rule(_G + "dt_bias", "layers.{i}.linear_attn.dt_bias", _same, _same),
    Rule(_G + "A_log", "layers.{i}.linear_attn.A_log", _same, _same),
    Rule(_G + "norm.weight", "layers.{i}.linear_attn.norm.scale", _same, _same),
    Rule(_G + "out_proj.weight", "layers.{i}.linear_attn.out_proj", _out_to_ours, _out_to_hf),
    *_MLP_RULES,
    Rule("model.norm.weight", "final_norm.scale", _same, _same),
    Rule("lm_head.weight", "lm_head", _transpose, _transpose),
)
# Tensors of a Qwen3.5 checkpoint outside the text model: skipped on load, carried over on export.
PRESERVED_PREFIXES = ("model.visual.", "mtp.")


def _template_regex(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


_OURS_PATTERNS = {
    False: [(_template_regex(r.ours), r) for r in QWEN3_RULES],
    True: [(_template_regex(r.ours), r) for r in QWEN3_5_RULES],
}


def plan(state: nnx.State, cfg: ModelConfig) -> dict[str, tuple[str, Rule]]:
    """NNX path -> (HF key, rule) for every parameter of `state`; an unmapped parameter is an error."""
    out = {}
    for path, _ in nnx.to_flat_state(state):
        dotted = ".".join(str(p) for p in path)
        for pattern, rule in _OURS_PATTERNS[cfg.is_hybrid]:
            m = pattern.match(dotted)
            if m:
                key = rule.hf.format(i=m.group("i")) if "{i}" in rule.hf else rule.hf
                if key.startswith("model."):
                    key = cfg.hf_prefix + key[len("model."):]
                out[dotted] = (key, rule)
                break
        else:
            raise CheckpointError(f"parameter {dotted!r} has no HF mapping rule")
    return out


def _text_prefix(keys, cfg: ModelConfig) -> str:
    """Qwen3.5: where the text model's keys live in this checkpoint (Qwen3: always "model.")."""
    if cfg.is_hybrid and any(k.startswith("model.language_model.") for k in keys):
        return "model.language_model."
    return "model."


def preserved_keys(files: dict[str, str]) -> list[str]:
    """Keys of a checkpoint's tensors outside the text model (vision tower, MTP head)."""
    return sorted(k for k in files if k.startswith(PRESERVED_PREFIXES))


def _weight_files(path: str) -> dict[str, str]:
    """HF key -> safetensors file, from index.json or the single file; missing shards are errors."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object")
        for key, file in weight_map.items():
            if not os.path.exists(os.path.join(path, file)):
                raise CheckpointError(f"{index}: shard {file!r} (holding key {key!r}) does not exist in {path}")
        return {k: os.path.join(path, f) for k, f in weight_map.items()}
    single = os.path.join(path, SINGLE_FILE)
    if os.path.exists(single):
        return {k: single for k in open_tensors(single)}
    raise CheckpointError(f"{path}: neither {INDEX_FILE} nor {SINGLE_FILE} found")


def load_hf(
    path: str,
    mesh: jax.sharding.Mesh | None = None,
    *,
    dtype=jnp.float32,
    param_dtype=None,
    progress: bool = False,
    **config_overrides,
) -> registry.Model:
    """Load an HF Qwen3 or Qwen3.5 folder into a model whose parameters are sharded on `mesh`.

    `dtype` is the compute dtype; `param_dtype` (default: `dtype`) the storage dtype. `progress`: a
    bar over the tensors; off by default, since a training run reloads weights at every GRPO step
    (the embedded server's /update_weights_from_disk) and those bars would fill its console.
    """
    mesh = mesh or shd.single_device_mesh()
    param_dtype = param_dtype or dtype
    cfg = ModelConfig.from_pretrained(path, dtype=dtype, param_dtype=param_dtype, **config_overrides)
    files = _weight_files(path)
    cfg = dataclasses.replace(cfg, hf_prefix=_text_prefix(files, cfg))
    tensors: dict[str, dict[str, np.ndarray]] = {}

    def source(key: str) -> np.ndarray:
        file = files[key]
        if file not in tensors:
            tensors[file] = open_tensors(file)
        if key not in tensors[file]:
            raise CheckpointError(f"{file}: index.json places key {key!r} here but the file lacks it")
        return tensors[file][key]

    with shd.use_mesh(mesh):
        abstract = nnx.eval_shape(lambda: registry.model_class(cfg)(cfg, rngs=nnx.Rngs(0)))
    graphdef, abs_state = nnx.split(abstract)
    shardings = dict(nnx.to_flat_state(shd.param_shardings(abs_state, mesh)))
    mapping = plan(abs_state, cfg)
    leaves = {}
    for path_tuple, var in tqdm(nnx.to_flat_state(abs_state), desc="load safetensors", leave=False, disable=not progress):
        dotted = ".".join(str(p) for p in path_tuple)
        key, rule = mapping[dotted]
        if key not in files:
            raise CheckpointError(f"{path}: no tensor {key!r} in the checkpoint (needed for {dotted})")
        src = source(key)
        view = rule.to_ours(_reshape_checked(src, key, files[key], rule, var.shape, cfg), cfg)
        sharding = shardings[path_tuple].get_value()
        arr = jax.make_array_from_callback(
            var.shape, sharding, lambda idx, view=view: np.asarray(view[idx]).astype(param_dtype)
        )
        leaves[path_tuple] = var.replace(arr)

    used = {key for key, _ in mapping.values()}
    unused = sorted(set(files) - used)
    if cfg.tie_word_embeddings and "lm_head.weight" in unused:
        log.info("%s: ignoring lm_head.weight, tie_word_embeddings=True uses the embedding", path)
        unused.remove("lm_head.weight")
    if cfg.is_hybrid and (extra := preserved_keys(unused)):
        groups = sorted({k.split(".")[0] + ("." + k.split(".")[1] if k.startswith("model.") else "") for k in extra})
        log.info("%s: skipping %d tensors outside the text model (%s); export copies them back unchanged",
                 path, len(extra), ", ".join(groups))
        unused = [k for k in unused if k not in set(extra)]
    if unused:
        raise CheckpointError(
            f"{path}: {len(unused)} tensors are not used by the model, e.g. {unused[:3]} in {files[unused[0]]}"
        )
    state = nnx.from_flat_state(leaves)
    return nnx.merge(graphdef, state)


def _reshape_checked(src, key, file, rule: Rule, our_shape, cfg) -> np.ndarray:
    expected = jax.eval_shape(lambda w: rule.to_hf(w, cfg), jax.ShapeDtypeStruct(our_shape, jnp.float32)).shape
    if tuple(src.shape) != tuple(expected):
        raise CheckpointError(
            f"{file}: key {key!r} has shape {tuple(src.shape)}, but config.json implies {tuple(expected)}"
        )
    return src


def save_hf(
    model: registry.Model,
    out_dir: str,
    *,
    dtype: str | None = None,
    source_dir: str | None = None,
    max_shard_bytes: int = 5 * 1024**3,
    writer: str = "save_hf",
    replace: bool = False,
) -> str:
    """Write an HF folder that `transformers` and SGLang load unchanged; returns `out_dir`.

    dtype: "float32" | "bfloat16" | "float16"; default the source config's dtype, else the
    parameters'. The folder is built beside `out_dir` and swapped in whole, so a reader never sees a
    half-written or stale mix of shards. A Qwen3.5 model's tensors outside the text model (vision
    tower, MTP) are copied from `source_dir` (default: the folder it was loaded from).

    writer: who writes (the folder's owner.MARKER names it). An existing `out_dir` is an error
    (owner.OutputExists) unless `replace` and it is an earlier output of the same writer.
    """
    owner.check_replaceable(out_dir, writer, replace, flag="replace=True")  # Before any work.
    cfg = model.cfg
    source_hf = cfg.to_hf_dict()
    dtype = dtype or source_hf.get("dtype") or source_hf.get("torch_dtype") or jnp.dtype(cfg.param_dtype).name
    if dtype not in DTYPES:
        raise ValueError(f"export dtype {dtype!r} is not one of {sorted(DTYPES)}")
    np_dtype = np.dtype(DTYPES[dtype])

    state = nnx.state(model, nnx.Param)
    mapping = plan(state, cfg)
    by_path = dict(nnx.to_flat_state(state))
    tensors = {}
    for path_tuple, var in by_path.items():
        key, rule = mapping[".".join(str(p) for p in path_tuple)]
        value = var.get_value()
        if not value.is_fully_addressable:
            value = multihost_utils.process_allgather(value, tiled=True)
        tensors[key] = np.ascontiguousarray(rule.to_hf(np.asarray(jax.device_get(value)), cfg).astype(np_dtype))
    source_dir = source_dir or cfg.source_dir
    if cfg.is_hybrid:
        tensors.update(_preserved_tensors(cfg, source_dir, np_dtype))
    tensors = dict(sorted(tensors.items(), key=lambda kv: _hf_order(kv[0])))

    tmp = _fresh_dir(out_dir, "tmp")
    try:
        _write_folder(tmp, tensors, cfg, dtype, source_dir, max_shard_bytes)
        owner.mark(tmp, writer)
        _swap_in(tmp, out_dir, writer, replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # Ours, half-written.
        raise
    return out_dir


def _fresh_dir(out_dir: str, kind: str) -> str:
    """A new empty folder beside `out_dir` (mkdir fails on an existing one: it can be nobody else's)."""
    base = os.path.abspath(out_dir.rstrip(os.sep))
    os.makedirs(os.path.dirname(base), exist_ok=True)
    path = f"{base}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"
    os.mkdir(path)  # Not tempfile.mkdtemp: its mode 0700 would keep other users' servers out.
    return path


def _swap_in(tmp: str, out_dir: str, writer: str, replace: bool) -> None:
    """Move the finished folder `tmp` to `out_dir`. An earlier output there is checked again (it may
    have appeared while the weights were written), swapped out whole, then deleted."""
    owner.check_replaceable(out_dir, writer, replace, flag="replace=True")
    if not os.path.lexists(out_dir):
        os.replace(tmp, out_dir)
        return
    old = _fresh_dir(out_dir, "old")
    os.replace(out_dir, old)  # Onto the empty folder just made: rename(2) allows it.
    os.replace(tmp, out_dir)
    shutil.rmtree(old)


def _write_folder(tmp: str, tensors: dict[str, np.ndarray], cfg: ModelConfig, dtype: str, source_dir: str | None,
                  max_shard_bytes: int) -> None:
    """The HF folder's files: weight shards (+ index), config, tokenizer and generation config."""
    shards = _split(tensors, max_shard_bytes)
    weight_map = {}
    for n, shard in enumerate(shards, 1):
        name = SINGLE_FILE if len(shards) == 1 else f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(tmp, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    if len(shards) > 1:
        total = sum(t.nbytes for t in tensors.values())
        _write_json(os.path.join(tmp, INDEX_FILE), {"metadata": {"total_size": total}, "weight_map": weight_map})
    _write_json(os.path.join(tmp, "config.json"), cfg.to_hf_dict(dtype=dtype))

    for name in AUX_FILES:
        if source_dir and os.path.exists(os.path.join(source_dir, name)):
            shutil.copy2(os.path.join(source_dir, name), os.path.join(tmp, name))
    if not os.path.exists(os.path.join(tmp, "generation_config.json")):
        eos = list(cfg.eos_token_ids)
        gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else (eos or None)}
        _write_json(os.path.join(tmp, "generation_config.json"), gen)


def _preserved_tensors(cfg: ModelConfig, source_dir: str | None, np_dtype) -> dict[str, np.ndarray]:
    """The source checkpoint's vision / MTP tensors (cast like the rest); an error if the config
    declares a vision tower whose weights cannot be found, as the export would not load."""
    files = {}
    if source_dir and any(os.path.exists(os.path.join(source_dir, f)) for f in (INDEX_FILE, SINGLE_FILE)):
        files = _weight_files(source_dir)
    keys = preserved_keys(files)
    if "vision_config" in cfg.to_hf_dict() and not any(k.startswith("model.visual.") for k in keys):
        raise CheckpointError(
            f"config.json declares a vision_config but no vision tower weights (model.visual.*) were found in "
            f"source_dir={source_dir!r}; pass save_hf(source_dir=...) the checkpoint the model was loaded from")
    out, opened = {}, {}
    for key in keys:
        if files[key] not in opened:
            opened[files[key]] = open_tensors(files[key])
        arr = np.asarray(opened[files[key]][key])
        out[key] = np.ascontiguousarray(arr.astype(np_dtype) if arr.dtype.kind == "f" else arr)
    return out


def _hf_order(key: str) -> tuple:
    m = re.match(r"model\.(?:language_model\.)?layers\.(\d+)\.(.*)", key)
    if m:
        return (1, int(m.group(1)), m.group(2))
    return (0 if "embed_tokens" in key else 2, 0, key)


def _split(tensors: dict[str, np.ndarray], max_bytes: int) -> list[dict[str, np.ndarray]]:
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key, arr in tensors.items():
        if shards[-1] and size + arr.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = arr
        size += arr.nbytes
    return shards


def _write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
