# Sourced by scripts/test: the browser tests' Chromium and ChromeDriver, Debian's packages
# chromium and chromium-driver, installed once with apt-get (as root, or with sudo if it
# asks no password). Selenium, their Python driver, comes with the test extras.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    _sudo=""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    _sudo="sudo -n"
  else
    echo "millstream: the browser tests need Chromium and ChromeDriver; install them with" >&2
    echo "  sudo apt-get install chromium chromium-driver" >&2
    exit 1
  fi
  echo "millstream: installing Chromium and ChromeDriver for the browser tests (first run only)" >&2
  _install="DEBIAN_FRONTEND=noninteractive $_sudo apt-get install -y -q chromium chromium-driver"
  # A fresh machine's package lists may be missing or stale: update them once if need be.
  if ! { eval "$_install" || { $_sudo apt-get update -q && eval "$_install"; }; } > .venv/apt.log 2>&1; then
    cat .venv/apt.log >&2
    echo "millstream: installing chromium and chromium-driver failed (log above, also in .venv/apt.log)" >&2
    exit 1
  fi
  unset _install
fi
unset _sudo
