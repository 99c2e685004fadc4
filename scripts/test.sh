#!/usr/bin/env bash
# The project's test command (README, and CI through .ci/run). On a stock
# Debian machine it first installs what the tests need when it is missing:
# Debian packages (nginx, iproute2's ss, prometheus's promtool,
# prometheus-alertmanager's amtool, a C compiler for ring, python3-venv),
# and the rotel collector from PyPI into a virtual environment this script
# owns (target/venv, never the system Python). Then it checks the
# Prometheus and Alertmanager configs, and runs formatting, lints, the doc
# build and the whole test suite.
#
# Every step runs even when an earlier one fails, every test binary runs even
# when another fails (cargo test --no-fail-fast), and the run ends with a
# summary of what failed (steps, test binaries, test names) and a non-zero
# exit status if anything did. Arguments are passed to `cargo test`
# (e.g. `bash scripts/test.sh -- lab_`). Safe to run repeatedly.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
logs="$root/target/test-logs"
mkdir -p "$logs"
started=$(date +%s)

if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi

# --- Debian packages ---------------------------------------------------------
# One line per tool: `need COMMAND PACKAGE...` installs PACKAGE(s) when
# COMMAND is on neither PATH nor /usr/sbin. Add a tool by adding a line.
need_apt=()
need() {
    local cmd=$1
    shift
    if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ]; then
        need_apt+=("$@")
    fi
}
need nginx nginx
need ss iproute2            # checks the kernel (sock_diag) lookups
need promtool prometheus    # deploy/prometheus checks, dashboard PromQL; /usr/bin/prometheus for tests/e2e/paging.rs
need amtool prometheus-alertmanager # deploy/alertmanager check; /usr/bin/prometheus-alertmanager for tests/e2e/paging.rs
need cc gcc libc6-dev       # ring's C code
need python3 python3 python3-venv # the rotel venv below
need chromium chromium      # headless Chromium opens the --html pages (crates/conntrace/tests/cli/view.rs)
# python3-venv: Debian splits `python3 -m venv` (with ensurepip) out of python3.
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    need_apt+=(python3-venv)
fi

apt_install() {
    echo "== installing $* (Debian packages)"
    $sudo apt-get update -qq || return 1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null || return 1
    # The packages start a system nginx on port 80, Prometheus on 9090 and
    # Alertmanager on 9093 where an init system runs them; the tests run
    # their own nginx and only need the command-line tools.
    for service in nginx prometheus prometheus-alertmanager; do
        $sudo service "$service" stop >/dev/null 2>&1 || true
    done
}
if [ ${#need_apt[@]} -gt 0 ]; then
    apt_install "${need_apt[@]}" || { echo "error: could not install ${need_apt[*]}" >&2; exit 1; }
fi
export PATH="$PATH:/usr/sbin"

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo not found: install Rust (https://rustup.rs, rust-version in Cargo.toml) and rerun" >&2
    exit 1
fi
if command -v rustup >/dev/null 2>&1; then
    for component in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$component" ||
            rustup component add "$component"
    done
fi

# --- rotel, in a virtual environment this script owns -------------------------
# rotel: a third-party OTLP collector (Rust, shipped as a PyPI wheel with its
# binary) that the CLI interop test exports through. Pinned; the test fails
# (does not skip) without it. The venv lives in target/ (ignored by git,
# removed by `cargo clean`): Debian's Python refuses pip installs into the
# system (PEP 668, externally-managed-environment), and the script must not
# change the system anyway.
ROTEL_VERSION=0.0.1a15
venv="$root/target/venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "== creating $venv (python3 -m venv)"
    rm -rf "$venv"
    python3 -m venv "$venv" || { echo "error: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
rotel_installed=$("$venv/bin/python" -m pip show rotel 2>/dev/null | sed -n 's/^Version: //p')
if [ "$rotel_installed" != "$ROTEL_VERSION" ]; then
    echo "== installing rotel==$ROTEL_VERSION (PyPI, into $venv)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "rotel==$ROTEL_VERSION" ||
        { echo "error: pip install rotel==$ROTEL_VERSION into $venv failed" >&2; exit 1; }
fi
ROTEL_AGENT=$("$venv/bin/python" -c 'import os, rotel; print(os.path.join(os.path.dirname(rotel.__file__), "rotel-agent"))')
export ROTEL_AGENT

# --- the checks ------------------------------------------------------------
failed_steps=()
step() {
    local name=$1
    shift
    local t0
    t0=$(date +%s)
    echo "== $name"
    if "$@"; then
        echo "   ok: $name ($(($(date +%s) - t0)) s)"
    else
        echo "   FAILED: $name ($(($(date +%s) - t0)) s)"
        failed_steps+=("$name")
    fi
}

# check config resolves rule_files relative to the config file.
step "promtool check config" promtool check config deploy/prometheus/prometheus.yml
step "promtool check rules" promtool check rules deploy/prometheus/rules.yml
step "promtool test rules" promtool test rules deploy/prometheus/rules_test.yml
step "amtool check-config" amtool check-config deploy/alertmanager/alertmanager.yml
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets --locked -- -D warnings
doc() { RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet; }
step "cargo doc" doc

# All test binaries, each to the end; output also kept in target/test-logs.
# A watchdog ends a run that hangs (a cold run on 2 busy cores takes about
# 12 minutes): the step fails in CI's time, and the log names the tests
# libtest saw running for over 60 seconds.
test_log="$logs/cargo-test.log"
TEST_TIMEOUT_SECS=${TEST_TIMEOUT_SECS:-2400}
cargo_test() {
    timeout --kill-after=30 "$TEST_TIMEOUT_SECS" cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$test_log"
    local rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "error: cargo test still running after $TEST_TIMEOUT_SECS s (TEST_TIMEOUT_SECS): stopped" | tee -a "$test_log"
        grep 'has been running for over' "$test_log" | sed 's/^/   hung: /' | tee -a "$test_log"
    fi
    return "$rc"
}
step "cargo test" cargo_test "$@"

# --- summary ---------------------------------------------------------------
# Which binary each failed test belongs to: cargo prints `Running NAME
# (path)` or `Doc-tests CRATE` before a binary's results.
failed_tests=$(awk '
    /^ *Running / { bin = $2 }
    /^ *Doc-tests / { bin = "doc-tests " $2 }
    /^test .* \.\.\. FAILED$/ { print "   " bin ": " $2 }
' "$test_log" 2>/dev/null)
elapsed=$(($(date +%s) - started))
echo
echo "== summary ($((elapsed / 60)) min $((elapsed % 60)) s)"
if [ -f "$test_log" ]; then
    grep -E '^test result:' "$test_log" | awk '
        { for (i = 1; i <= NF; i++) if ($(i) ~ /^(passed|failed|ignored);?$/) n[$(i)] += $(i - 1) }
        END { printf "   tests: %d passed, %d failed, %d ignored\n", n["passed;"], n["failed;"], n["ignored;"] }'
fi
if [ ${#failed_steps[@]} -eq 0 ]; then
    echo "   all steps passed"
    exit 0
fi
for s in "${failed_steps[@]}"; do echo "   FAILED step: $s"; done
if [ -n "$failed_tests" ]; then
    echo "   failed tests (binary: test):"
    echo "$failed_tests" | sed 's/^/  /'
fi
# Binaries that failed without a failing test line (a crash, a build error).
sed -n '/^error: [0-9]* targets\{0,1\} failed:/,$p' "$test_log" 2>/dev/null | sed 's/^/   /'

echo "   full test output: $test_log"
exit 1
