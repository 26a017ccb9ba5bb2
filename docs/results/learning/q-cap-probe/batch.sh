# args: tag scale run_s quiet margin measure
tag=$1; shift
for seed in 1 2 3; do for st in 4.2 1.05; do echo "$seed $st"; done; done | xargs -P 2 -n 2 sh -c 'timeout 900 /work/main/.venv/bin/python /tmp/pr/probe_sim.py whale $0 '"$1 $2"' $1 '"$3 $4 $5"' > /tmp/pr/'"$tag"'_$0_$1.txt 2>&1'
for f in /tmp/pr/${tag}_*.txt; do echo "$f $(grep 'final base' $f)"; done
