# Sourced by the cluster stage's build scripts (after tests/lib/cache.sh): the Go environment
# every Go build of the tests shares (the KEDA contract stage uses the same folders), and
# go_build_cached, which builds a module's commands once per key.
bash "$(dirname "${BASH_SOURCE[0]}")/../lib/prerequisites.sh" go
gover="$(go env GOVERSION)"
export GOMODCACHE="$ASTRO_CACHE_DIR/go/$gover/mod"
export GOCACHE="$ASTRO_CACHE_DIR/go/$gover/build"
export GOFLAGS=-mod=mod
export GOTOOLCHAIN=local
mkdir -p "$GOMODCACHE" "$GOCACHE" "$ASTRO_CACHE_DIR/cluster"

# go_build_cached NAME MODULE_DIR LDFLAGS PACKAGE...
# Builds PACKAGE... of the module in MODULE_DIR into $ASTRO_CACHE_DIR/cluster/NAME-<key> (the key
# covers the module's files, the Go version and the flags) unless that folder exists, and
# prints the folder. An interrupted build leaves no folder behind, so it is never trusted.
go_build_cached() {
  local name="$1" dir="$2" ldflags="$3"
  shift 3
  local key out tmp start
  key="$( (cd "$dir" && cat go.mod go.sum ./*.go 2>/dev/null; echo "$gover $ldflags $*") | sha256sum | cut -c1-12)"
  out="$ASTRO_CACHE_DIR/cluster/$name-$key"
  if [ ! -d "$out" ]; then
    tmp="$(mktemp -d "$ASTRO_CACHE_DIR/cluster/.$name.XXXXXX")"
    start=$SECONDS
    echo "building $name ($*) ..." >&2
    (cd "$dir" && go build -trimpath -ldflags="$ldflags" -o "$tmp/" "$@") >&2
    mv -T "$tmp" "$out"
    echo "built $name in $((SECONDS - start)) s" >&2
  fi
  echo "$out"
}
