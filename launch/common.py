"""What every entry point does the same way: logging, start-up errors, the summary of an evaluation run.

Start-up errors (a missing or broken config file, a misspelt key, a malformed value, a failed
preflight check) print one line, `launch.<name>: error: <problem>: <fix>`, to stderr and exit 2;
`--verbose` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import logging
import os
import sys
from typing import Callable, Mapping, NoReturn

from hljax.preflight import PreflightError, one_line

EXIT_START_UP = 2  # A bad input found at start-up (as argparse and usage errors).


def setup_logging(tag: str = "") -> None:
    """`tag`: prefixed to every line, e.g. "[p1/2] " in a multi-process run."""
    # force: absl's app.run has put its own handler (another line format) on the root logger already.
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s", force=True)
    # Library chatter (checkpoint paths, compilation-cache notes, every HTTP request) stays out of the
    # console; their warnings still show.
    for noisy in ("absl", "jax", "jaxlib", "orbax", "etils", "httpx", "httpcore", "urllib3", "matplotlib",
                  "PIL", "filelock", "transformers", "tensorboardX", "reasoning_gym"):
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


def print_banner(lines: Mapping[str, str]) -> None:
    """What a run is about to do, before anything slow: one `name: value` line each."""
    width = max(map(len, lines), default=0)
    print(f"== {program()} ==")
    for key, value in lines.items():
        print(f"{key:>{width}}: {value}")
    sys.stdout.flush()


def config_source(flag: str = "config") -> str:
    """The config file and the overrides on the command line, as given."""
    from absl import flags
    from ml_collections import config_flags

    overrides = [a for a in sys.argv[1:] if a.lstrip("-").startswith(f"{flag}.")]
    return " ".join([config_flags.get_config_filename(flags.FLAGS[flag]), *overrides])


def devices() -> str:
    """"8 x cpu", "1 x gpu (NVIDIA H200)": the JAX devices this process sees."""
    import jax

    first = jax.local_devices()[0]
    kind = f" ({first.device_kind})" if first.device_kind != first.platform else ""
    where = f" on {jax.process_count()} processes" if jax.process_count() > 1 else ""
    return f"{len(jax.devices())} x {first.platform}{kind}{where}"


def sandbox(config) -> str:
    """Which sandbox runs harness code: the bwrap binary and its version, or rlimits only."""
    from sandbox.isolation import SandboxUnavailable, bwrap_path, bwrap_version

    if config.isolation != "bwrap":
        return f"{config.isolation} (not a sandbox for root)"
    try:
        path = bwrap_path(config.bwrap)
    except SandboxUnavailable as e:
        return str(e)
    return f"bwrap {path} ({bwrap_version(path)})" if path else "no bwrap found"


def solver(spec) -> str:
    """A SolverSpec in a few words."""
    if spec.simulated:
        from hljax.tasks.simulated_solver import LABEL

        return LABEL
    if spec.backend == "sglang":
        return f"SGLang server {spec.url} ({spec.path})"
    if spec.backend == "sglang_jax":
        return f"sglang-jax started on {spec.path or 'the initial proposer weights'}"
    return f"embedded JAX engine on {spec.path or 'the initial proposer weights'}"


def existing(outputs: Mapping[str, str]) -> dict[str, str]:
    """The entries of `outputs` (name -> path) whose path exists ("" = not written)."""
    return {k: p for k, p in outputs.items() if p and os.path.exists(p)}


def print_summary(title: str, values: Mapping[str, object], outputs: Mapping[str, str], table: str = "") -> None:
    """The end of a run: `table`, `values` (scores, labels), then each output that exists, one a line."""
    print(f"\n== {title} ==")
    if table:
        print(table + "\n")
    lines = {**values, **existing(outputs)}
    width = max(map(len, lines), default=0)
    for key, value in lines.items():
        print(f"{key:>{width}}: {value}")


# ----- stop signals -----


@contextlib.contextmanager
def exit_on_stop(tag: str = ""):
    """A run stopped by a signal at a safe point (hljax.signals.Stopped) ends with one line and exit
    130 (SIGINT) or 143 (SIGTERM; schedulers requeue, and the rerun resumes); a second Ctrl-C too."""
    from hljax.signals import Stopped

    try:
        yield
    except Stopped as e:
        print(f"\n== stopped == {tag}{e}", flush=True)
        _exit_now(e.exit_code)
    except KeyboardInterrupt:
        print(f"\n== interrupted == {tag}a second Ctrl-C: quit without saving what was under way", flush=True)
        _exit_now(130)


def _exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown. What the run wrote is closed by now (the `with` blocks
    and `finally`s ran); a daemon thread still inside XLA (an embedded server compiling its first
    step when a signal ended the wait for it) would abort a normal exit ("FATAL: exception not
    rethrown", exit 134) instead of giving `code`."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextlib.contextmanager
def stop_on_signals(what: str):
    """SIGTERM and SIGINT stop the run at its next safe point (`what` happens then), as `exit_on_stop`."""
    from hljax.signals import StopSignals

    with exit_on_stop(), StopSignals(what):
        yield


# ----- start-up errors -----


def program() -> str:
    """"launch.train" for `python -m launch.train`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name if spec else os.path.basename(sys.argv[0])


def fail(message: str) -> NoReturn:
    """One line on stderr, exit 2."""
    print(f"{program()}: error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_START_UP)


def describe(error: BaseException) -> str:
    """The one-line message of a start-up error."""
    if isinstance(error, (PreflightError, ValueError, OSError)):
        return str(error) or type(error).__name__
    if isinstance(error, (KeyError, AttributeError)) and error.args:  # ml_collections: a misspelt key.
        return str(error.args[0])
    return f"{type(error).__name__}: {error} (--verbose shows the traceback)"


@contextlib.contextmanager
def start_up(verbose: bool):
    """Around config parsing and preflight checks: any failure becomes one line and exit 2, unless
    `verbose` (then the traceback, as usual)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - nothing long-running happens inside; --verbose shows it all.
        if verbose:
            raise
        fail(describe(e))


def define_verbose_flag() -> None:
    """absl launchers: --verbose (tracebacks for start-up errors)."""
    from absl import flags

    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, "Show tracebacks for start-up errors (config, preflight checks).")


def verbose() -> bool:
    from absl import flags

    return bool(flags.FLAGS["verbose"].value) if "verbose" in flags.FLAGS else False


def run_absl(main: Callable, config_flag: str = "config") -> None:
    """`absl.app.run(main)`, with flag and config-file errors as one line (see the module docstring)."""
    from absl import app

    app.run(main, flags_parser=lambda argv: _parse_flags(argv, config_flag))


_HELP = ("--help", "-help", "-h", "--helpshort", "-helpshort", "--helpfull", "-helpfull", "-?")


def _parse_flags(argv: list[str], config_flag: str) -> list[str]:
    from absl import app, flags

    asked = [a for a in argv[1:] if a in _HELP]
    if asked:  # absl's own help flags exit 1; asking for help is not an error.
        app.usage(shorthelp="full" not in asked[0], writeto_stdout=True, exitcode=0)

    wants_verbose = any(a in ("--verbose", "-verbose") or a.startswith(("--verbose=", "-verbose=")) and
                        a.split("=", 1)[1].lower() in ("1", "true") for a in argv[1:])
    try:
        _check_config_file(argv, config_flag)
        rest = flags.FLAGS(argv)
        value = flags.FLAGS[config_flag].value
        if value is not None:
            getattr(value, "keys")  # A config file that failed to load raises only when touched.
    except Exception as e:  # noqa: BLE001
        if wants_verbose:
            raise
        fail(_describe_flag_error(e, argv, config_flag))
    return rest


def _check_config_file(argv: list[str], config_flag: str) -> None:
    for i, arg in enumerate(argv[1:], 1):
        for prefix in (f"--{config_flag}", f"-{config_flag}"):
            if arg == prefix and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(prefix + "="):
                value = arg[len(prefix) + 1:]
            else:
                continue
            path = value.split(":", 1)[0]
            if not os.path.isfile(path):
                where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
                fail(f"--{config_flag}={value}: no such file{where}: give a config file, e.g. "
                     f"--{config_flag}=configs/tiny.py")


def _describe_flag_error(error: Exception, argv: list[str], config_flag: str) -> str:
    from absl import flags

    message = str(error) if isinstance(error, flags.Error) else describe(error)
    if "Error whilst parsing config file" in message:  # get_config() raised; its last line says why.
        lines = [line for line in message.splitlines() if line.strip()]
        return f"--{config_flag}: the config file failed to load: {lines[-1].strip()}"
    if isinstance(error, flags.Error):
        if f"--{config_flag}=None" in message:
            return f"--{config_flag} is required: give a config file, e.g. --{config_flag}=configs/tiny.py"
        return message.removeprefix("flag ")
    if isinstance(error, (KeyError, AttributeError)):  # An override naming a key the schema lacks.
        message = _unquote(message)
        key = message.splitlines()[0].strip("'\"")
        overrides = [a.split("=", 1)[0] for a in argv[1:] if a.lstrip("-").startswith(f"{config_flag}.")]
        named = [a for a in overrides if key in a.lstrip("-").split(".")]
        flag = f"{named[0]}: " if named else ""
        hint = " ".join(message.splitlines()[1:]) or "check the key against the config's schema"
        return f"{flag}unknown config key {key!r}: {hint}"
    if "Configuration is not available" in message:
        return f"--{config_flag}: {message.split(':', 1)[1]}"
    return message


def _unquote(text: str) -> str:
    """ml_collections wraps a KeyError's message in repr, sometimes twice: undo it."""
    for _ in range(2):
        if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
            try:
                text = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                break
    return text


class ArgumentParser(argparse.ArgumentParser):
    """argparse with `--verbose` and usage errors as one line (exit 2)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--verbose", action="store_true", help="show tracebacks for start-up errors")

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (--help lists the arguments)")
