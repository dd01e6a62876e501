#!/usr/bin/env bash
# The README's short example, built as a new user builds it: a crate of its own outside the
# workspace, its Cargo.toml's dependencies exactly the README's ```toml block and its
# src/main.rs exactly the README's ```rust block (the first of each under "## A short
# example"), run with `cargo run`; it must print HELLO, VOLLEY. The README's path dependency
# points at a clone of the repository beside the crate, so the crate is made in a scratch
# directory next to a `volley` link to this repository. Run by scripts/test; alone:
# bash scripts/tests/readme_example.sh
set -euo pipefail
repo="$(cd "${BASH_SOURCE[0]%/*}/../.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

fail() {
    printf 'readme_example: %s\n' "$*" >&2
    exit 1
}

# The first ```LANG block after the heading "## A short example" (up to the next "## ").
block() {
    awk -v lang="$1" '
        /^## / { inside = ($0 == "## A short example") }
        inside && !done && $0 == "```" lang { grab = 1; next }
        grab && $0 == "```" { grab = 0; done = 1; next }
        grab { print }
    ' "$repo/README.md"
}

toml="$(block toml)"
rust="$(block rust)"
[ -n "$toml" ] || fail "README.md has no \`\`\`toml block under \"## A short example\""
[ -n "$rust" ] || fail "README.md has no \`\`\`rust block under \"## A short example\""

ln -s "$repo" "$scratch/volley"
mkdir -p "$scratch/hello/src"
# What `cargo new hello` writes, then the README's lines.
printf '[package]\nname = "hello"\nversion = "0.1.0"\nedition = "2024"\n\n%s\n' "$toml" >"$scratch/hello/Cargo.toml"
printf '%s\n' "$rust" >"$scratch/hello/src/main.rs"
# The workspace's lock file: the same versions of the dependencies as the workspace, so the
# build reuses what the workspace's own build compiled (and needs no new download).
cp "$repo/Cargo.lock" "$scratch/hello/Cargo.lock"

# Built in the workspace's target directory (the dependencies built already are reused); a
# warning fails the test too: a user's first build should be clean. Cargo shows the warnings of
# path dependencies (volley, volley-macros) and of the crate itself, also when replayed from
# an earlier build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
[[ $CARGO_TARGET_DIR == /* ]] || CARGO_TARGET_DIR="$PWD/$CARGO_TARGET_DIR"
(cd "$scratch/hello" && cargo build --message-format=short) 2>"$scratch/stderr" || {
    cat "$scratch/stderr" >&2
    fail "the README's example does not build as a crate of its own (Cargo.toml and main.rs from README.md)"
}
if grep -E '(^|: )warning' "$scratch/stderr" >&2; then
    fail "building the README's example gives warnings (above)"
fi
out="$("$CARGO_TARGET_DIR/debug/hello")" || fail "the README's example failed (status $?)"
[ "$out" = "HELLO, VOLLEY" ] || fail "the README's example printed '$out', expected 'HELLO, VOLLEY'"
echo "readme_example: the README's example builds as a crate of its own and prints $out"
