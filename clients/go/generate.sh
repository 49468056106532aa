#!/usr/bin/env bash
# Generates the Go stubs of geostate's protobuf API (../../proto) into geostatepb/.
#   ./generate.sh          write them
#   ./generate.sh --check  exit 1 if the committed stubs differ from what proto/ gives
# protoc comes from the Python client's virtualenv (grpcio-tools, made by
# ../python/check.py), the Go plugins from the module proxy (pinned below).
set -euo pipefail
cd "$(dirname "$0")"
VENV="$HOME/.cache/geostate/clients-venv"
BIN="$HOME/.cache/geostate/go-bin"
GOBIN="$BIN" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOBIN="$BIN" go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0
out="geostatepb"
if [ "${1:-}" = "--check" ]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
files=(geostate/v1/crdt.proto geostate/v1/update.proto geostate/v1/state.proto geostate/v1/function.proto)
maps=()
for f in "${files[@]}"; do maps+=("--go_opt=M$f=geostate.dev/client/geostatepb" "--go-grpc_opt=M$f=geostate.dev/client/geostatepb"); done
"$VENV/bin/python" -m grpc_tools.protoc -I../../proto \
  --plugin=protoc-gen-go="$BIN/protoc-gen-go" --plugin=protoc-gen-go-grpc="$BIN/protoc-gen-go-grpc" \
  --go_out="$out" --go_opt=paths=source_relative --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  "${maps[@]}" "${files[@]}"
# source_relative keeps the proto folders: flatten them into the one package
mv "$out"/geostate/v1/*.go "$out"/ && rm -rf "$out/geostate"
if [ "${1:-}" = "--check" ]; then
  diff -ru geostatepb "$out" || { echo "stale stubs: run clients/go/generate.sh" >&2; exit 1; }
  echo "the stubs match proto/"
fi
