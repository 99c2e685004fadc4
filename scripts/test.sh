#!/usr/bin/env bash
# The project's test command (README): installs what the tests need when it
# is missing (nginx and iproute2 from Debian packages), then runs formatting,
# lints, the doc build and the whole test suite. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
# `ss` checks the sock_diag lookups of reqwest-conntrace's kernel module.
command -v ss >/dev/null 2>&1 || [ -x /usr/bin/ss ] || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "== installing ${need_apt[*]} (Debian packages)"
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    # The package starts a system nginx on port 80; the tests run their own.
    $sudo service nginx stop >/dev/null 2>&1 || true
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
echo "== cargo test"
cargo test --workspace --locked "$@"
