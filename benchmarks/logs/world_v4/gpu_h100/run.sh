# Device check for issue 15 (world v4 on a GPU machine): the demo as shipped on seed 0,
# the leaderboard, each stage's device and time, and the raw lm-eval JSON to compare per item
# with the CPU runs; the same weights scored on cuda and cpu. DRY=1: a local rehearsal (tiny world).
set -u
T0=$(date +%s)
if [ "${DRY:-0}" = 1 ]; then SIZE="--world-size tiny"; else SIZE=""; source .gpu/on_device.sh || exit 1; fi
python3 - > $OUT/env.txt 2>&1 <<'P'
import os, torch, ray, lm_eval, optuna, sqlalchemy, transformers
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "-")
print("ray", ray.__version__, "optuna", optuna.__version__, "transformers", transformers.__version__, "cpus", os.cpu_count())
P
cat $OUT/env.txt
run_demo() {  # seed, seconds
  local s=$1 lim=$2 d=/tmp/ls_demo$1
  echo "== demo seed $s (limit ${lim}s) at +$(( $(date +%s) - T0 ))s"
  ( time timeout $lim layerswap demo --out $d --seed $s $SIZE ) > $OUT/demo$s.log 2>&1
  echo "rc=$?" >> $OUT/demo$s.log
  tail -4 $OUT/demo$s.log
  cp $d/leaderboard.md $OUT/leaderboard$s.md 2>/dev/null
  ( cd $d 2>/dev/null && sha256sum train/*/samples_*/model.safetensors > sha256.txt 2>/dev/null
    python3 -c "import json,glob;[print(f, json.load(open(f))['config'].get('device')) for f in sorted(glob.glob('promotion/lm_eval/*/*.json'))]" > devices.txt 2>&1
    tar czf $OUT/demo$s.tgz sha256.txt devices.txt leaderboard.md promotion/results.parquet promotion/lm_eval search/trials.parquet experts/registry.parquet 2>/dev/null )
}
[ "${SKIP_DEMO:-0}" = 1 ] || run_demo 0 330
# The same weights scored on cuda and on this machine's CPU: how far device numerics move the
# greedy answers (the demo itself scores on cuda here, on cpu on a CPU machine).
D=/tmp/ls_demo0; mkdir -p /tmp/cmp
declare -A M=([best]=$D/best [math]=$(ls -d $D/train/world_math_full/samples_* | tail -1) [lang]=$(ls -d $D/train/world_lang_xa_full/samples_* | tail -1) [base]=$D/world/base)
for dev in ${DEVS:-cuda cpu}; do for m in best math lang base; do
  left=$(( 540 - ($(date +%s) - T0) )); [ $left -lt 20 ] && { echo "cmp $m $dev skipped"; continue; }
  t=$(date +%s)
  timeout $left layerswap eval ${M[$m]} --world $D/world --tasks world_mgsm_direct_xa,world_belebele_brier_xa --batch-size 16 --device $dev --out /tmp/cmp/${m}_$dev.json > /tmp/cmp/${m}_$dev.log 2>&1
  echo "cmp $m $dev rc=$? $(( $(date +%s) - t ))s" | tee -a $OUT/cmp.log
done; done
tar czf $OUT/cmp.tgz -C /tmp cmp
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader 2>/dev/null
echo "total $(( $(date +%s) - T0 ))s"
