"""Timings for scripts/bench-layers; prints a JSON object (docs/benchmarks.json)."""
import json, os, re, shutil, statistics, subprocess, sys, tempfile, time

RUNS = int(sys.argv[1])
BIN = os.path.abspath("target/release/substrat-sandbox")
root = tempfile.mkdtemp(prefix="bench-layers-")

def run(args, **kw):
    return subprocess.run([BIN, *args], check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

def timed(args):
    t = time.perf_counter()
    run(args)
    return time.perf_counter() - t

def summary(xs):
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1000, 2),
            "p90_ms": round(xs[int(len(xs) * 0.9) - 1] * 1000, 2), "runs": len(xs)}

try:
    worker = open("policies/worker.toml").read()
    no_cgroups = re.sub(r"\n\[cgroup\].*?(?=\n\[)", "\n", worker, flags=re.S)
    policy = os.path.join(root, "p.toml")
    open(policy, "w").write(no_cgroups)
    ws = os.path.join(root, "ws")
    os.makedirs(os.path.join(ws, ".cursor"))
    common = ["run", "--backend", "native", "--policy", policy, "--workspace", ws,
              "--git-state", os.path.join(root, "git")]
    layer = os.path.join(root, "layer")
    lines = {"direct": common + ["--", "true"],
             "overlay (kept layer)": common + ["--workspace-mode", "overlay", "--keep-layer", layer, "--", "true"],
             "overlay (scratch layer)": common + ["--workspace-mode", "overlay", "--", "true"]}
    times = {k: [] for k in lines}
    for args in lines.values():
        run(args)  # warm
    for _ in range(RUNS):
        for name, args in lines.items():
            times[name].append(timed(args))
    launch = {k: summary(v) for k, v in times.items()}
    base = launch["direct"]["median_ms"]
    for k in launch:
        launch[k]["vs_direct"] = round(launch[k]["median_ms"] / base, 2)

    big = os.path.join(root, "big")
    for d in range(100):
        os.makedirs(os.path.join(big, f"d{d:02}"))
        for f in range(1000):
            with open(os.path.join(big, f"d{d:02}", f"f{f:03}.txt"), "w") as fh:
                fh.write(f"line one of {d}/{f}\nline two\n")
    os.makedirs(os.path.join(big, ".cursor"))
    diff_stat, diff_patch, apply_t = [], [], []
    for round_ in range(3):
        blayer = os.path.join(root, f"blayer{round_}")
        script = "for d in 00 11 22 33 44 55 66 77 88 99; do for f in $(seq -w 0 99); do echo changed >> d$d/f0$f.txt; done; done"
        run(["run", "--backend", "native", "--policy", policy, "--workspace", big,
             "--git-state", os.path.join(root, "git2"), "--workspace-mode", "overlay",
             "--keep-layer", blayer, "--", "sh", "-c", script])
        stat = run(["workspace", "diff", blayer, "--stat"]).stdout.decode()
        assert "1000 paths changed, 1000 insertions(+), 0 deletions(-)\n" in stat, stat[-200:]
        for _ in range(3):
            diff_stat.append(timed(["workspace", "diff", blayer, "--stat"]))
            diff_patch.append(timed(["workspace", "diff", blayer]))
        apply_t.append(timed(["workspace", "apply", blayer]))
    print(json.dumps({
        "about": f"workspace layers: native backend, worker policy without cgroups, release build, 2 cores, kernel {os.uname().release}, {'root' if os.geteuid() == 0 else 'unprivileged'}",
        "launch": launch,
        "workspace_files": 100000,
        "changed_files": 1000,
        "diff_stat_s": {"median": round(statistics.median(diff_stat), 3), "max": round(max(diff_stat), 3)},
        "diff_patch_s": {"median": round(statistics.median(diff_patch), 3), "max": round(max(diff_patch), 3)},
        "apply_s": {"median": round(statistics.median(apply_t), 3), "max": round(max(apply_t), 3)},
        "target_diff_s": 1.0,
    }, indent=1))
finally:
    shutil.rmtree(root, ignore_errors=True)
