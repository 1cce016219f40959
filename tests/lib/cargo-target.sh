# Sourced after cache.sh by the scripts that build: one cargo target folder per toolchain,
# outside the clone, so that a fresh clone, the tests, the demo and the benchmarks reuse one
# build. An explicit CARGO_TARGET_DIR wins.
toolchain_key="$(rustc -V | sha256sum | cut -c1-12)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ASTRO_CACHE_DIR/cargo-target-$toolchain_key}"
