set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 -m tools.mixed_check --model qwen3-8b --prompt 12000 --time 0,8192 --profile 64@0,64@8192,256@0,256@8192,1024@0 --out $OUT/check.json > $OUT/log.txt 2>&1
grep -E '"all_equal"|^timing|^profile|Error|error' $OUT/log.txt | cut -c1-3000
