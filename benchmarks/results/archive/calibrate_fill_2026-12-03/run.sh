cd /tmp
for rev in old new; do
  s=$(date +%s.%N)
  PYTHONPATH=/tmp/$rev /work/main/.venv/bin/python -c "import sys, layerslide; print(layerslide.__file__); from layerslide.cli.main import main; sys.exit(main())" calibrate --out /tmp/caltime/$rev.toml --overwrite > /tmp/caltime/$rev.log 2>&1
  e=$(date +%s.%N)
  echo "$rev $(echo "$e - $s" | bc) s" >> /tmp/caltime/times2.txt
done
