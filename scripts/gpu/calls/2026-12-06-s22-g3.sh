#!/bin/bash
# Twenty-second session, with the bundle of the anchored overlap: on an H200 the
# headline figures (2026-12-06-s22-h200.sh; run call 2 after it if time is left); on
# any other card call 2 (2026-12-06-s22-g2.sh: 4a2239a's producer and the anchored
# overlap, correctness first, then the prefill bench beside SDPA).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash .gpu/2026-12-06-s22-h200.sh
fi
exec bash .gpu/2026-12-06-s22-g2.sh
