#!/usr/bin/env bash
# The sealed pool, end to end: build each hand-written set's index, run the router and one search per mode on its
# questions, and print the tables (benchmarks/router_table.py with pool.json). Run from the repository root:
#     bash benchmarks/heldout/run_pool.sh
# Over two hours on 2 cores for the twenty-four sets. Every run of it is a read: log it in each set's READS.md (README.md beside this).
set -euo pipefail
cd "$(dirname "$0")/../.."
for name in tarrowmere coastal brindlemoor caldwick merrowgate quellin askerry wrenbury vessandra carrickvale hollowaystaithe brannoch dunmarrow skarrholm fellgarth quarrendon ellisveig tamsworth morwick ardvellan saltmoor greyhithe orlwyn halverstone; do
  [ -e "indexes/heldout/$name" ] || routerag build-graph "benchmarks/heldout/$name/corpus.jsonl" --out "indexes/heldout/$name"
  routerag eval "indexes/heldout/$name" --questions "benchmarks/heldout/$name/questions.jsonl" \
      --modes learned,naive-passage,naive-graph,naive-hybrid --out "reports/heldout/$name"
done
python benchmarks/router_table.py benchmarks/heldout/pool.json
