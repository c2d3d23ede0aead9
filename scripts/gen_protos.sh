#!/usr/bin/env bash
# Regenerate libs/llmapi-proto/src from protos/ with the pinned grpcio-tools and mypy-protobuf.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=$(realpath -s "${PYTHON:-$root/.venv/bin/python}")
out=$root/libs/llmapi-proto/src
bindir=$(dirname "$py")

find "$out/llmapi" -name '*_pb2*' -delete 2>/dev/null || true
mapfile -t files < <(cd "$root/protos" && find llmapi -name '*.proto' | sort)

# protoc-gen-mypy chats on stderr; show its output only when generation fails.
log=$(cd "$root/protos" && PATH="$bindir:$PATH" "$py" -m grpc_tools.protoc -I . \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out="$out" --mypy_grpc_out="$out" "${files[@]}" 2>&1) || { echo "$log" >&2; exit 1; }

# grpc modules only for files that declare a service (as opentelemetry-proto does).
for f in "${files[@]}"; do
  grep -q '^service ' "$root/protos/$f" || rm -f "$out/${f%.proto}_pb2_grpc.py" "$out/${f%.proto}_pb2_grpc.pyi"
done

# Every generated directory is a regular package; the top-level marks typed code.
find "$out/llmapi" -type d -exec touch {}/__init__.py \;
touch "$out/llmapi/py.typed"
