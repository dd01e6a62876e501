#!/usr/bin/env bash
# Tests of scripts/test on a fake machine: a copy of the script in a scratch tree, run with a
# PATH that holds only fakes of apt-get, sudo and cargo (which log their arguments) and env.
# The fake apt-get "installs" etcd-server by putting an etcd on that PATH (chromium likewise), and python3-venv by
# putting a python3 there whose `-m venv DIR` makes a logging DIR/bin/python, so the tests
# see what a fresh machine sees whether or not this machine has etcd or Python. Run by
# scripts/test; alone: bash scripts/tests/entry_point.sh
set -euo pipefail
repo="$(cd "${BASH_SOURCE[0]%/*}/../.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

bin="$scratch/bin"
log="$scratch/log"
mkdir -p "$bin" "$scratch/tree/scripts/tests"
cp "$repo/scripts/test" "$scratch/tree/scripts/test"
# A shell test in the scratch tree, to see that the entry point runs scripts/tests too.
echo "echo 'shell test ran' >>'$log'" >"$scratch/tree/scripts/tests/fake.sh"
ln -s "$(command -v env)" "$bin/env"

fake() {
    printf '#!%s\n%s\n' "$BASH" "$2" >"$bin/$1"
    chmod +x "$bin/$1"
}
fake apt-get "echo \"apt-get \$*\" >>'$log'
if [[ \" \$* \" == *' install '*' etcd-server '* && -z \${FAKE_BROKEN_PACKAGE:-} ]]; then
    printf '#!/bin/sh\n' >'$bin/etcd' && /bin/chmod +x '$bin/etcd'
fi
if [[ \" \$* \" == *' install '*' chromium '* && -z \${FAKE_BROKEN_CHROMIUM:-} ]]; then
    printf '#!/bin/sh\n' >'$bin/chromium' && /bin/chmod +x '$bin/chromium'
fi
if [[ \" \$* \" == *' install '*' python3-venv '* && -z \${FAKE_BROKEN_PYTHON:-} ]]; then
    /bin/cp '$scratch/aside/python3' '$bin/python3'
fi"
fake sudo "echo \"sudo \$*\" >>'$log'; exec \"\$@\""
fake cargo "echo \"cargo \$*\" >>'$log'
echo \"test result: ok. 3 passed; 0 failed; \${FAKE_IGNORED:-0} ignored; 0 measured; 0 filtered out\"
exit \${FAKE_CARGO_STATUS:-0}"

# The python3 that the fake python3-venv package brings (kept aside until then), and the
# Python of the environments its `-m venv DIR` makes, which runs pip, pytest and vermin (pytest
# exits with $FAKE_PYTEST_STATUS, or in the Python 3.10 environment $FAKE_OLDEST_PYTEST_STATUS;
# vermin with $FAKE_VERMIN_STATUS).
mkdir -p "$scratch/aside"
printf '#!%s\n%s\n' "$BASH" "echo \"venv-python \$*\" >>'$log'
case \"\$2 \$0\" in
'pytest '*python3.10-venv*) exit \${FAKE_OLDEST_PYTEST_STATUS:-0} ;;
'pytest '*) exit \${FAKE_PYTEST_STATUS:-0} ;;
'import sys, vermin'*) exit \${FAKE_VERMIN_STATUS:-0} ;;
esac" >"$scratch/aside/venv-python"
printf '#!%s\n%s\n' "$BASH" "echo \"python3 \$*\" >>'$log'
if [ \"\$1 \$2\" = '-m venv' ]; then
    /bin/mkdir -p \"\$3/bin\" && /bin/cp '$scratch/aside/venv-python' \"\$3/bin/python\"
fi" >"$scratch/aside/python3"
chmod +x "$scratch/aside/venv-python" "$scratch/aside/python3"
# A Python 3.10 where scripts/test looks for pyenv's (PYENV_ROOT), put there by the tests that
# want one: its `-m venv DIR` makes the same logging DIR/bin/python.
oldest="$scratch/pyenv/versions/3.10.99/bin/python3.10"
printf '#!%s\n%s\n' "$BASH" "echo \"python3.10 \$*\" >>'$log'
if [ \"\$1 \$2\" = '-m venv' ]; then
    /bin/mkdir -p \"\$3/bin\" && /bin/cp '$scratch/aside/venv-python' \"\$3/bin/python\"
fi" >"$scratch/aside/python3.10"
chmod +x "$scratch/aside/python3.10"

failures=0
checks=0
# check DESCRIPTION TEXT PATTERN: TEXT matches the glob PATTERN.
check() {
    checks=$((checks + 1))
    # shellcheck disable=SC2053 # the pattern is a glob on purpose
    if [[ $2 != $3 ]]; then
        failures=$((failures + 1))
        printf 'FAILED: %s\n  expected: %s\n  got:\n%s\n' "$1" "$3" "$2" >&2
    fi
}

# Runs the copy of scripts/test on the fake machine; sets $out (its output) and $status, and
# $calls (what the fakes were asked to do).
run() {
    : >"$log"
    status=0
    out="$(PATH="$bin" PYENV_ROOT="$scratch/pyenv" "$BASH" "$scratch/tree/scripts/test" "$@" 2>&1)" || status=$?
    calls="$(<"$log")"
}

# A fresh machine, --check: it says what it would do and does nothing.
run --check
check "--check succeeds" "$status" 0
check "--check names the missing package" "$out" "*etcd: missing; would install etcd-server*"
check "--check says what would run" "$out" "*would run: cargo test --workspace -- --include-ignored*"
check "--check names the missing Python" "$out" "*python3 with venv: missing; would install python3 python3-venv*"
check "--check names the missing Chromium" "$out" "*chromium: missing; would install chromium*"
check "--check says the Python suite would run" "$out" "*would run: cargo build -p volley-cli;*pytest clients/python*"
check "--check says the check against Python 3.10 would run" "$out" "*would run: vermin --target=3.10-*"
check "--check installs and runs nothing" "$calls" ""

# The first run installs etcd-server, then runs every suite with the ignored tests included.
run
check "the first run succeeds" "$status" 0
check "the first run refreshes the package lists" "$calls" "*apt-get update*"
check "the first run installs etcd-server" "$calls" "*apt-get install*etcd-server*"
if [ "$EUID" -eq 0 ]; then
    check "as root, apt-get runs without sudo" "$calls" "apt-get update*"
else
    check "as a user, apt-get runs through sudo" "$calls" "sudo env DEBIAN_FRONTEND=noninteractive apt-get update*"
fi
check "the first run says what it installed" "$out" "*installed: etcd-server*"
check "the first run runs the shell tests" "$calls" "*shell test ran*"
check "the first run runs every Rust test" "$calls" "*cargo test --workspace -- --include-ignored"$'\n'"*"
check "the first run installs python3-venv" "$calls" "*apt-get install*python3-venv*"
check "the first run installs chromium" "$calls" "*apt-get install*chromium*"
check "the first run refreshes the package lists once" "$(grep -c 'apt-get update' <<<"$calls")" 1
check "the first run builds the binary, makes the environment and runs pytest" "$calls" "*"$'\n'"cargo build -p volley-cli
python3 -m venv target/python-venv
venv-python -m pip install *-e clients/python\[test\]
venv-python -m pytest *clients/python
venv-python -c import sys, vermin; sys.exit(vermin.main()) --target=3.10- *clients/python/src*"
check "without Python 3.10 the run says only the static check covers it" "$out" "*Python 3.10: not found*only the static check*"

# The second run installs nothing and runs the same tests.
run
check "the second run succeeds" "$status" 0
check "the second run calls no package manager and reuses the environment" "$calls" "python3 -c import ensurepip, venv
shell test ran
cargo test --workspace -- --include-ignored
cargo build -p volley-cli
venv-python -m pytest -p no:cacheprovider -q clients/python
venv-python -c import sys, vermin; sys.exit(vermin.main()) --target=3.10- --no-tips --violations -q clients/python/src clients/python/tests clients/python/bench"
check "the second run finds etcd" "$out" "*etcd: present*"
check "the second run finds chromium" "$out" "*chromium: present*"
check "the second run says it installed nothing" "$out" "*installed: nothing*"
run --check
check "--check on a set-up machine would install nothing" "$out" "*would install: nothing*"

# With a Python 3.10 (pyenv's), the suite runs under it too, in an environment of its own.
mkdir -p "${oldest%/*}" && cp "$scratch/aside/python3.10" "$oldest"
run
check "with Python 3.10 the run succeeds" "$status" 0
check "with Python 3.10 the suite runs under it too" "$calls" "*venv-python -c import sys, vermin*
python3.10 -c import ensurepip, venv
python3.10 -m venv target/python3.10-venv
venv-python -m pip install *-e clients/python\[test\]
venv-python -m pytest -p no:cacheprovider -q clients/python"
FAKE_OLDEST_PYTEST_STATUS=1 run
check "failing Python tests under 3.10 fail the run" "$status" 1
rm -r "$scratch/pyenv"

# Arguments go to cargo test, before the harness's own.
run etcd
check "arguments go to cargo test" "$calls" "*cargo test --workspace etcd -- --include-ignored"
check "with arguments the Python suite is left out, and says so" "$out" "*the Python suite is left out*"

# A summary that reports an ignored test, or failing tests, fail the run.
FAKE_IGNORED=2 run
check "an ignored test fails the run" "$status" 1
check "an ignored test is named as the reason" "$out" "*2 test(s) reported as ignored*"
FAKE_CARGO_STATUS=101 run
check "failing tests fail the run" "$status" 101
FAKE_PYTEST_STATUS=1 run
check "failing Python tests fail the run" "$status" 1
FAKE_VERMIN_STATUS=1 run
check "code that needs a Python newer than 3.10 fails the run" "$status" 1

# Without cargo nothing is installed; a package that does not give etcd is an error.
rm "$bin/etcd" "$bin/cargo" "$bin/python3" "$bin/chromium"
run
check "without cargo the run fails" "$status" 1
check "without cargo it says how to get it" "$out" "*install Rust with rustup*"
check "without cargo nothing is installed" "$calls" ""
fake cargo "exit 0"
FAKE_BROKEN_PACKAGE=1 run
check "a package without etcd fails the run" "$status" 1
check "a package without etcd is reported" "$out" "*etcd-server is installed but there is no etcd on PATH*"
FAKE_BROKEN_PYTHON=1 run
check "a python3-venv without venv fails the run" "$status" 1
check "a python3-venv without venv is reported" "$out" "*python3-venv is installed but python3 -m venv is still unavailable*"
FAKE_BROKEN_CHROMIUM=1 run
check "a chromium package without chromium fails the run" "$status" 1
check "a chromium package without chromium is reported" "$out" "*chromium is installed but there is no chromium on PATH*"

if [ "$failures" -ne 0 ]; then
    echo "scripts/tests/entry_point.sh: $failures of $checks checks failed" >&2
    exit 1
fi
echo "scripts/tests/entry_point.sh: $checks checks passed"
