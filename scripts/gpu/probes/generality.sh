#!/usr/bin/env bash
# The twenty-ninth session (issue 16): programs beyond the issue's list under `tiermem run` —
# Hugging Face training and decoding, a CNN with cuDNN, torch.compile, two streams — each plainly
# and at 2x, 0.7x and 0.5x its peak (bench/transparent_matrix.py), then the decode at 0.5x with
# stage 3 off and with migration off, to see whether moving weights pays against reading them
# in place. Everything is in OUT/generality.tar.xz (and OUT/matrix.json).
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/generality.sh OUT [PROGRAMS]
set -u
out=$1 programs=${2:-hf_decode,hf_train,cnn_train,two_streams,torch_compile}
tiermem=$PWD/dist/tiermem
work=$(mktemp -d)
timeout 420 python3 bench/transparent_matrix.py --tiermem "$tiermem" --out "$work/matrix.json" --programs "$programs" 2>&1 | tee "$work/matrix.log"
cp "$work/matrix.json" "$out/matrix.json" 2>/dev/null
budget=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['programs']['hf_decode']['0_5']['budget_bytes'])" "$work/matrix.json" 2>/dev/null)
if [ -n "$budget" ]; then
    for variant in default TIERMEM_SEGMENTS=off TIERMEM_MIGRATE=off; do
        (cd bench/matrix && timeout 120 env $([ $variant = default ] || echo $variant) "$tiermem" run --hbm-limit "$budget" --stats -- python3 hf_decode.py > "$work/decode-$variant.out" 2> "$work/decode-$variant.log")
        echo "decode at 0.5x, $variant: exit $? $(tail -1 "$work/decode-$variant.out") $(grep -E 'all in HBM|segments on|moved' "$work/decode-$variant.log" | tr '\n' ' ')" | tee -a "$work/summary.txt"
    done
fi
tar -C "$work" -cJf "$out/generality.tar.xz" .
