"""Print the probe lines (the probe patches of lab/patches) of a folder of llama-server / llama-bench logs, compactly, so that a device
call can print them into its output and the figures are read even if the result files are lost (the twenty-second and
twenty-third runs did):

    python -m lab.runs.probe_summary DIR [--min N]

Per log: the step timeline's last line, and every decode-phases, cuda-launch and sched-splits line of N or more
decodes/computes (default 10), shortened."""
import re
import sys
from pathlib import Path

KEEP = ("pyllm-timeline", "pyllm-decode-phases", "pyllm-cuda-launch", "pyllm-sched-splits")


def short(line: str) -> str:
    line = line.split("pyllm-", 1)[1]
    line = re.sub(r"context 0x[0-9a-f]+|sched 0x[0-9a-f]+", lambda m: "ctx" + m.group(0)[-4:], line)
    for a, b in (("ms a decode: ", ""), ("ms a compute: ", ""), ("ms a step: ", ""), ("sched_reserve", "res"),
                 ("memory_update", "mem"), ("init_batch", "init"), ("decode-phases", "dp"), ("cuda-launch", "cl"),
                 ("sched-splits", "ss"), ("timeline", "tl"), ("first node ne1", "ne1")):
        line = line.replace(a, b)
    return line.strip()


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    folder, n_min = Path(args[0]), 10
    if "--min" in args:
        n_min = int(args[args.index("--min") + 1])
    for log in sorted(folder.glob("*.log")):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if any(k in ln for k in KEEP)]
        out = [ln for ln in lines if "pyllm-timeline" in ln][-1:]
        for ln in lines:
            m = re.search(r"(\d+) (decodes|computes)", ln)
            if m and int(m.group(1)) >= n_min and "pyllm-timeline" not in ln:
                out.append(ln)
        if out:
            print(f"== {log.name}")
            for ln in out:
                print("  " + short(ln)[:230])
    return 0


if __name__ == "__main__":
    sys.exit(main())
