#!/usr/bin/env bash
# Issue 6 on the H200 benchmark machine, one call: layerslide, DeepSpeed ZeRO-3 CPU offload and
# all-GPU PyTorch side by side (Llama-3.2-3B shape, sequence 1024, micro-batch 8,1,4,16,32),
# then DeepSpeed at a larger model, each run in a fresh process.
# A quick calibrate first (about 40 s) bounds each layerslide row by this machine's host memory.
# usage (device): bash benchmarks/run_compare_gpu.sh [compare_offload.py args]
#   (wheels in $LAYERSLIDE_WHEELS, default .whl/: simpy, DeepSpeed and its small dependencies)
set -uo pipefail
source benchmarks/device_env.sh
# DeepSpeed is a source archive: it builds against the torch already there
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
    --target /tmp/site "${LAYERSLIDE_WHEELS:-.whl}"/deepspeed-*.tar.gz
free -g | head -2
python3 -c "import deepspeed, torch; print('deepspeed', deepspeed.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
# this machine's host rates (machines differ by 10-20%): the report bounds each layerslide row
python3 -c "import sys; from layerslide.cli.main import main; sys.exit(main())" calibrate \
    --quick --out "$out/h200-calibrated.toml" --overwrite --ram 128GiB 2>&1 | tail -3
floor=()  # and layerslide-tuned tunes on it, unless --profile says otherwise
[ -f "$out/h200-calibrated.toml" ] && floor=(--floor-profile "$out/h200-calibrated.toml"
                                             --profile "$out/h200-calibrated.toml")
python3 benchmarks/compare_offload.py --out "$out" ${floor[@]+"${floor[@]}"} "$@" 2>&1 | grep -v -i warn
