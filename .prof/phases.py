import cProfile, pstats, time, io, sys, os
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
from harness.input.scenario_file import default_files, load_files, load_file, SCENARIO_DIR
from harness.run.pipeline import run_scenario
from harness.devices.cuda import CudaDevice
t3 = time.perf_counter()
print(f"import torch {t1-t0:.2f}s cuda init {t2-t1:.2f}s import harness {t3-t2:.2f}s")
S = {s.name: s for s in load_files(default_files())}
M = {s.name: s for s in load_file(SCENARIO_DIR / "mutants" / "kill_matrix.toml")}
dev = CudaDevice()
names = [("S","attention-full-none"),("S","hybrid-full-final_event"),("S","mamba-breakable-none"),("S","gate-full-none"),
         ("S","writeback-store-engine"),("M","correct.layerwise_value.gate"),("M","mutant.write_after_read"),("M","correct.piecewise.gate")]
run_scenario(S["attention-full-none"], dev, replays=3)  # warm
rows = []
pr = cProfile.Profile()
for src, n in names:
    s = (S if src == "S" else M)[n]
    pr.enable()
    r = run_scenario(s, dev, replays=30)
    pr.disable()
    rows.append((n, r.wall_s, r.replay_s, r.met, r.error))
for row in rows:
    print("%-40s wall %.3f replay %.3f met %s %s" % row)
out = io.StringIO()
st = pstats.Stats(pr, stream=out); st.sort_stats("cumulative").print_stats(60)
st.sort_stats("tottime").print_stats(40)
open(os.environ["OUT"] + "/profile.txt", "w").write(out.getvalue())
print(out.getvalue()[:9000])
