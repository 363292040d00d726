# Sourced by the twenty-eighth session's probes: `train NAME "ARGS" CMD...` runs the training loop
# of `bench transparent` (bench/transparent_train.py ARGS) under CMD, its JSON and stderr in
# $work, and appends its median step, each step, the last loss and the `--stats` lines that
# matter to $work/summary.txt (and stdout).
train() {
    local name=$1 extra=$2; shift 2
    timeout 200 "$@" python3 bench/transparent_train.py $extra --out "$work/$name.json" 2> "$work/$name.log"
    echo "$name: exit $? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['step_s_median'],3), d['oom'], [round(x,2) for x in d['step_s']], d['losses'][-1])" "$work/$name.json" 2>&1) | $(grep -E 'all in HBM|segments on|async frees' "$work/$name.log" | sed 's/tiermem: stats: //' | tr '\n' ' ')" | tee -a "$work/summary.txt"
}
