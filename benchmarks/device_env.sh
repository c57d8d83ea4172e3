# Sourced by the run_*_gpu.sh scripts on the device: installs the carried wheels (.whl from
# ../shared/tools/gpu-wheels.sh) into /tmp/site, puts them and the repo on PYTHONPATH, and sets
# $out to the tool's $OUT (or /tmp/out) and creates it. Stops the calling script if the install
# fails: every run after it would fail on a missing import.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "installing the carried .whl failed"; exit 1; }
export PYTHONPATH=/tmp/site:$(pwd) PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
