"""In-process llama.cpp with its layers split over rpc-servers (issue 56 item 2, "in-process Llama with the same
split"): ``pyllm_a100.Llama(rpc=...)`` on a model, greedy tokens of the given prompts, printed as one JSON line with
llama.cpp's own layer assignment from its log. Run as a child process, so that the A100 dispatch's LD_PRELOAD reaches
the library and a crash is a dead child, not a dead run:

    python -m lab.bench.rpc_inprocess MODEL --rpc HOST:PORT[,...] --tensor-split 1xN --prompts FILE [--gen N] [--n-ctx N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rpc", required=True)
    ap.add_argument("--tensor-split", required=True)
    ap.add_argument("--prompts", required=True, help="a JSON file: a list of token-id lists")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--n-ctx", type=int, default=4096)
    a = ap.parse_args()
    from pyllm_a100 import Llama

    prompts = json.load(open(a.prompts))
    logs = io.StringIO()
    with contextlib.redirect_stderr(logs):  # verbose: llama.cpp's log (the layer assignment) comes to stderr
        llm = Llama(a.model, n_gpu_layers=-1, tensor_split=a.tensor_split, n_ctx=a.n_ctx, verbose=True, rpc=a.rpc)
        tokens = []
        for prompt in prompts:
            out: list[int] = []
            for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
                out.append(int(token))
                if len(out) == a.gen:
                    break
            tokens.append(out)
        llm.close()
    print(json.dumps({"how": "Llama(rpc=...)", "tokens": tokens, "log": logs.getvalue()[-200000:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
