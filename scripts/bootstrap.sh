# Sourced by the other scripts: make .venv with millstream, its test tools, what the
# example jobs need (the main job plots with matplotlib) and the documentation tools,
# reinstalling only when the package metadata changed.
_python=${PYTHON:-python3}
if ! "$_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "millstream needs Python 3.11 or newer; '$_python' is $("$_python" --version 2>&1)." >&2
  echo "Install Python 3.11 and run again, or point PYTHON at it (PYTHON=python3.11 $0)." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "millstream: creating .venv with $("$_python" --version)" >&2
  "$_python" -m venv .venv
fi
_stamp=$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat .venv/.millstream-stamp 2>/dev/null)" != "$_stamp" ]; then
  echo "millstream: installing Python dependencies into .venv (first run takes a minute)" >&2
  # pip's and setuptools' chatter (an editable install's BuildBackendWarning) goes to a log,
  # shown whole if the install fails. No byte-compiling of every module installed (a third
  # of the install's time, PySpark's thousands of files): Python compiles a module the first
  # time it is imported, and most of them never are.
  if ! { .venv/bin/python -m pip install --quiet --upgrade pip &&
    .venv/bin/python -m pip install --quiet --no-compile -e '.[test,examples,docs]'; } \
    > .venv/install.log 2>&1; then
    cat .venv/install.log >&2
    echo "millstream: installing into .venv failed (log above, also in .venv/install.log)" >&2
    exit 1
  fi
  echo "$_stamp" > .venv/.millstream-stamp
fi
export PATH="$PWD/.venv/bin:$PATH"
unset _python _stamp
