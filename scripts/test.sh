#!/usr/bin/env bash
# The project's test command (README): installs what the tests need when it
# is missing (nginx, iproute2's ss and prometheus's promtool from Debian
# packages, the rotel collector from PyPI), checks the Prometheus config and
# rules, then runs formatting, lints, the doc build and the whole test suite.
# Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
# `ss` checks the sock_diag lookups of reqwest-conntrace's kernel module.
command -v ss >/dev/null 2>&1 || [ -x /usr/bin/ss ] || need_apt+=(iproute2)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# Headless Chromium opens the `--html` pages in crates/conntrace/tests/cli/view.rs.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "== installing ${need_apt[*]} (Debian packages)"
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    # The packages start a system nginx on port 80 and a Prometheus server on
    # 9090; the tests run their own nginx and only need promtool.
    $sudo service nginx stop >/dev/null 2>&1 || true
    $sudo service prometheus stop >/dev/null 2>&1 || true
fi

# rotel: a third-party OTLP collector (Rust, shipped as a PyPI wheel with its
# binary) that the CLI interop test exports through. Pinned; the test fails
# (does not skip) without it.
ROTEL_VERSION=0.0.1a15
rotel_installed=$(python3 -m pip show rotel 2>/dev/null | sed -n 's/^Version: //p' || true)
if [ "$rotel_installed" != "$ROTEL_VERSION" ]; then
    echo "== installing rotel==$ROTEL_VERSION (PyPI)"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "rotel==$ROTEL_VERSION"
fi

echo "== promtool: Prometheus config, rules and rule unit tests"
# check config resolves rule_files relative to the config file.
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/rules.yml
promtool test rules deploy/prometheus/rules_test.yml

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
echo "== cargo test"
cargo test --workspace --locked "$@"
