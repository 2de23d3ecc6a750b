#!/usr/bin/env bash
# Time the default workflow run (config/config.yaml, simulated backend, --cores 2 as tools/run.sh gives it) in a
# fresh temporary copy of the workflow, and say where the time went and how well the simulated servers kept their
# clock:
#   - wall time; the load average during the run (sampled every 2 s) and the busiest other processes at its middle
#     (what else ran on the machine);
#   - each phase: Snakemake's start until its first job, each server's job (its start-up before the server, its
#     server's span from the journal), aggregation and the report rules;
#   - the simulated servers' late steps: late_seconds over scheduled_seconds (their modelled time), per server and
#     in all, summed over the cells' counters (specsweep/sim/clock.py);
#   - the report: its pages, the sections whose headings its text holds, and each page as a PNG at 50 dpi
#     (pdftoppm -r 50) in the folder KEEP names (default: not kept).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/tools/setup.sh"
work="$(mktemp -d)"
sampler="" run=""
# on any exit: the load sampler and a run still going (Snakemake stops its jobs and their servers) end first
trap 'kill $sampler $run 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
cp -r "$root/Snakefile" "$root/rules" "$root/config" "$root/scripts" "$work/"
cd "$work"
(while true; do cut -d' ' -f1 /proc/loadavg >>load.txt; sleep 2; done) &
sampler=$!
start=$(date +%s.%N)
"$root/.venv/bin/snakemake" --cores 2 >run.log 2>&1 &
run=$!
sleep 30
ps -eo pcpu,etimes,args --sort=-pcpu >ps.txt
{ grep -v -e "$work" -e "ps -eo" ps.txt || true; } | head -8 | cut -c1-150 >others.txt
wait "$run"
run=""
end=$(date +%s.%N)
kill "$sampler"
sampler=""
echo "default workflow: $(echo "$end - $start" | bc) s wall"
"$root/.venv/bin/python" - "$work" "$start" <<'PY'
import datetime, glob, json, re, subprocess, sys
from pathlib import Path

from specsweep.layout import REPORT_SECTIONS

work, start = Path(sys.argv[1]), float(sys.argv[2])
loads = [float(x) for x in (work / "load.txt").read_text().split()]
print(f"load average (1 min) during the run: mean {sum(loads) / len(loads):.1f}, max {max(loads):.1f}")
print("busiest processes 30 s in (this run's own left out):\n  " + "\n  ".join((work / "others.txt").read_text().splitlines()))

log = (work / "run.log").read_text()
stamps = [datetime.datetime.strptime(m, "%a %b %d %H:%M:%S %Y").timestamp() for m in re.findall(r"^\[(.+ \d{4})\]$", log, re.M)]
print(f"Snakemake's start until its first job: {stamps[0] - start:.0f} s")
jobs = {}
for block in re.split(r"\n(?=\[[A-Z][a-z]{2} )", log):
    when = re.match(r"\[(.+ \d{4})\]", block)
    rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
    done = re.search(r"Finished jobid: (\d+) \(Rule: (\w+)\)", block)
    if when and rule:
        jobid = re.search(r"jobid: (\d+)", block).group(1)
        jobs[jobid] = [rule.group(1), datetime.datetime.strptime(when.group(1), "%a %b %d %H:%M:%S %Y").timestamp(), None]
    elif when and done:
        jobs[done.group(1)][2] = datetime.datetime.strptime(when.group(1), "%a %b %d %H:%M:%S %Y").timestamp()
servers = {}
for path in glob.glob(str(work / "results/cache/journal/*/*.jsonl")):
    events = [json.loads(line) for line in open(path)]
    spans = [e["time"] for e in events if e["event"] in ("server_start", "server_stop")]
    if spans:
        servers[events[0]["server"]] = (min(spans), max(spans))
bench = sorted(j for j in jobs.values() if j[0] == "bench_server")
for name, (first, last) in sorted(servers.items()):
    print(f"  server {name}: {first - start:.0f} s to {last - start:.0f} s ({last - first:.0f} s)")
for rule, began, ended in sorted(jobs.values(), key=lambda j: j[1]):
    if rule != "bench_server":
        print(f"  {rule}: {began - start:.0f} s to {ended - start:.0f} s")
print(f"  server jobs: {min(j[1] for j in bench) - start:.0f} s to {max(j[2] for j in bench) - start:.0f} s, "
      f"{len(bench)} jobs, at most {max(sum(1 for k in bench if k[1] <= j[1] < k[2]) for j in bench)} at once")

late = {}
for path in glob.glob(str(work / "results/cells/*/*/*/*.json")):
    cell = json.loads(open(path).read())
    counters = cell["server_counters"]
    entry = late.setdefault(cell["method"]["name"], [0.0, 0.0])
    entry[0] += counters["specsweep_sim:late_seconds_total"]
    entry[1] += counters["specsweep_sim:scheduled_seconds_total"]
total_late, total = sum(v[0] for v in late.values()), sum(v[1] for v in late.values())
print("late steps (late_seconds / scheduled_seconds): " + ", ".join(f"{m} {100 * a / b:.2f}%" for m, (a, b) in sorted(late.items()))
      + f"; all {total_late:.2f} s of {total:.1f} s = {100 * total_late / total:.2f}%")

pdf = work / "results/report/report.pdf"
text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
pages = text.count("\f")
titles = list(REPORT_SECTIONS.values())
found = [t for t in titles if re.search(r"^\s*\d+\s+" + re.escape(t), text, re.M)]
print(f"report: {pages} pages; sections {len(found)} of {len(titles)}: {', '.join(found)}")
print("figures: " + ", ".join(f"{d.name} {len(list(d.glob('*.png')))}" for d in sorted((work / "results/report/figures").iterdir())))
PY
if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    pdftoppm -r 50 -png results/report/report.pdf "$KEEP/page"
    cp results/report/report.pdf run.log "$KEEP/"
    echo "pages at 50 dpi, the PDF and Snakemake's log in $KEEP"
fi
