# Sourced after cache.sh by the scripts that build: one cargo target folder per toolchain,
# outside the clone, so that a fresh clone, the tests, the demo and the benchmarks reuse one
# build. An explicit CARGO_TARGET_DIR wins.
#
# Every build here is for the host's triple, named explicitly, and on glibc statically linked
# (+crt-static): the binaries the tests run are then the very ones the FROM-scratch images
# ship, so one release build serves every stage. Naming the triple keeps RUSTFLAGS off build
# scripts and proc-macros, which must stay dynamic. The release binaries land in
# $ASTRO_RELEASE_DIR.
toolchain_key="$(rustc -V | sha256sum | cut -c1-12)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ASTRO_CACHE_DIR/cargo-target-$toolchain_key}"
host_triple="$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_BUILD_TARGET="$host_triple"
case "$host_triple" in
  *-linux-gnu)
    rustflags_var="CARGO_TARGET_$(tr a-z- A-Z_ <<<"$host_triple")_RUSTFLAGS"
    export "$rustflags_var=-C target-feature=+crt-static"
    unset rustflags_var
    ;;
esac
export ASTRO_RELEASE_DIR="$CARGO_TARGET_DIR/$host_triple/release"

# cargo_release_build [ARGS]: the release build every script asks for, always of the whole
# workspace, whichever binary the caller needs. Cargo resolves features per invocation:
# `-p astro-sentinel` alone resolves tokio-util, tower and more without the agent's features,
# and so compiles them and every crate above them again; with the workspace, the tests, the
# stages and the benchmarks share one build.
cargo_release_build() { cargo build --workspace --release "$@"; }
