#!/usr/bin/env bash
# The Debian packages `make test` needs besides the Python ones in .venv:
#
#   jq                       /usr/bin/jq, with which the docs' scripts read `controlplane -o json`
#                            (tests/integration/test_readme.py runs them)
#   prometheus               /usr/bin/prometheus and promtool (rules checks, the alert tests)
#   prometheus-alertmanager  /usr/bin/prometheus-alertmanager (the webhook end to end)
#   libgoogle-perftools4     libtcmalloc.so.4, which the README's tcmalloc recipe preloads into
#                            tritonserver (tests/integration/test_readme.py runs it)
#   chromium                 /usr/bin/chromium, the headless browser that renders the status
#                            page and /docs in the tests (tests/support/browser.py)
#   chromium-driver          /usr/bin/chromedriver, through which selenium drives it (given
#                            by path: Selenium Manager never downloads a browser or a driver)
#   openssl                  /usr/bin/openssl, which makes the publisher keys and signatures of
#                            the signature tests and docs/signatures.md
#   haproxy                  /usr/sbin/haproxy, the load balancer in front of a fleet's members
#                            in the rolling-update tests (tests/support/haproxy.py)
#   faketime                 libfaketime, preloaded into daemons whose clocks the fleet tests
#                            run 10 minutes ahead or behind (tests/integration/test_fleet_clocks.py)
#
# kubectl is not one of them: Debian's is 1.20, and `make install` puts kubectl 1.32 into
# .venv/bin (tools/install-k8s-tools.py).
#
# Nothing to do when every command is on PATH. Otherwise they are installed with apt-get when
# this runs as root or with password-less sudo; else it prints the one command to run and fails.
set -euo pipefail

# command:package pairs, in the order they are checked.
NEEDED=(
    jq:jq
    prometheus:prometheus
    promtool:prometheus
    prometheus-alertmanager:prometheus-alertmanager
    chromium:chromium
    chromedriver:chromium-driver
    openssl:openssl
    haproxy:haproxy
    faketime:faketime
)

# library:package pairs: shared libraries, found by their soname in the linker's cache.
LIBRARIES=(
    libtcmalloc.so.4:libgoogle-perftools4
)

missing=()
need() {
    case " ${missing[*]-} " in
        *" $1 "*) ;;
        *) missing+=("$1") ;;
    esac
}
for pair in "${NEEDED[@]}"; do
    if ! command -v "${pair%%:*}" >/dev/null 2>&1; then
        need "${pair#*:}"
    fi
done
cached=$(/sbin/ldconfig -p 2>/dev/null || true)
for pair in "${LIBRARIES[@]}"; do
    if ! grep -q "^[[:space:]]*${pair%%:*} " <<<"$cached"; then
        need "${pair#*:}"
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

install=(apt-get install -y --no-install-recommends "${missing[@]}")
if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo)
else
    echo "make test needs the Debian packages: ${missing[*]}. Install them with:" >&2
    echo "  sudo apt-get update && sudo ${install[*]}" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "make test needs ${missing[*]} (Debian package names), and apt-get is not here:" >&2
    echo "install the equivalent packages with this system's package manager" >&2
    exit 1
fi
echo "installing the Debian packages make test needs: ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" "${install[@]}"
