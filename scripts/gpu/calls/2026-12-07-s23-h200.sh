#!/bin/bash
# Twenty-third session: every open H200 figure of issues 12, 13 and 15 (s22-h200.sh),
# the prefill line with tiles 17 and 28, the new long-prompt default.
PREFILL_TILES=17,28 exec bash .gpu/2026-12-06-s22-h200.sh
