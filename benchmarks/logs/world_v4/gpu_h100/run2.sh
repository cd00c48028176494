# Device check 2 (issue 15): where the demo's time goes on a GPU machine. Indicator scoring of
# the world base (the demo's tasks and settings; batch 1 as the demo, and "auto") on the CPU and
# on cuda, and world.sft training speed on one CPU thread. DRY=1: here, CPU only.
set -u
T0=$(date +%s)
[ "${DRY:-0}" = 1 ] || { source .gpu/on_device.sh || exit 1; }
layerswap world build --out /tmp/ls_w --seed 0 > $OUT/world.log 2>&1 || { cat $OUT/world.log; exit 1; }
python3 - 2>$OUT/timing.err <<'P' | tee $OUT/timing.txt
import os, time
from pathlib import Path
import torch
from trainables.evaluate.indicators import IndicatorScorer, load_tokenizer
from trainables.evaluate.tasks import write_world_tasks
w, tdir = Path("/tmp/ls_w"), Path("/tmp/ls_tasks")
write_world_tasks(w, tdir)
tasks = ["world_mgsm_direct_en_dev", "world_belebele_xa_dev"]
tok = load_tokenizer(w / "base")
print("cpus", os.cpu_count(), "torch threads", torch.get_num_threads(), "cuda", torch.cuda.is_available(), flush=True)
for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
    IndicatorScorer(tasks, tok, include_path=str(tdir), limit=2, max_gen_toks=24, device=dev).score_checkpoint(w / "base")  # warm-up
    for bs in (1, "auto"):
        sc = IndicatorScorer(tasks, tok, include_path=str(tdir), max_gen_toks=24, device=dev, batch_size=bs)
        t = time.time()
        s = sc.score_checkpoint(w / "base").scores
        print(f"indicators of the base on {dev}, batch {bs}: {time.time() - t:.1f} s", {k: round(v, 3) for k, v in s.items()}, flush=True)
from world.sft import load_base, pairs, read_rows, sft
torch.set_num_threads(1)
model, tk = load_base(w)
t = time.time()
sft(model, tk, pairs(read_rows(w, "data/sft/math_en.jsonl")), 30, 3e-5, seed=0)
print(f"world.sft math, 30 steps, 1 CPU thread: {time.time() - t:.1f} s", flush=True)
P
echo "total $(( $(date +%s) - T0 ))s"
