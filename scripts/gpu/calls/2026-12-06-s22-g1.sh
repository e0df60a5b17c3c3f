#!/bin/bash
# Twenty-second session, first call (the bundle of 4a2239a, built in the twenty-first
# session): on an H200 the headline figures (2026-12-06-s22-h200.sh); on any other card
# the twenty-first session's call 2 (the persistent producer that loads the next item's
# Q under the current one: correctness first, then the prefill bench beside SDPA).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash .gpu/2026-12-06-s22-h200.sh
fi
exec bash .gpu/2026-12-06-s21-g2.sh
