#!/usr/bin/env bash
# Wheels the device check needs beyond the device's image, into infra/gpu/wheels/ (ignored by git;
# give it to `run` as carry). pydantic-core and msgpack are compiled: one wheel per CPython 3.10-3.13.
set -euo pipefail
cd "$(dirname "$0")"
PIP="${PIP:-../../.venv/bin/pip}"
mkdir -p wheels
"$PIP" download -q --no-deps -d wheels pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5 hjson==3.1.0 \
  py-cpuinfo==9.0.0 einops==0.8.2 ninja==1.13.2
for py in 310 311 312 313; do
  "$PIP" download -q --no-deps -d wheels --only-binary=:all: --python-version "$py" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 pydantic-core==2.50.5 msgpack==1.2.4 || echo "no wheels for cp$py"
done
"$PIP" wheel -q --no-deps -w wheels deepspeed==0.19.8   # an sdist: built here once (pure Python, ops JIT-built on use)
du -sh wheels
