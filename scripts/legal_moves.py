#!/usr/bin/env python3
"""Legal-move rate of sampled game continuations, checked by Stockfish.

    scripts/legal_moves.py OUT_DIR [--stockfish PATH] [--json]

Reads OUT_DIR/samples.jsonl (written by `finetune --sample_tokens N --sample_games G`): each
line holds a prompt (the start of a validation game, UCI moves) and the model's
continuation. For every sample the moves after the prompt are replayed from the start
position: a move is legal when Stockfish's `go perft 1` lists it in the position reached so
far. The first illegal (or malformed) move ends that sample, since the position after it is
undefined; the result token (1-0, 0-1, 1/2-1/2) ends it too.

Prints one line per sample and the totals: legal / attempted moves (attempted = legal moves
plus the one illegal move that ended the sample, if any). Only the standard library and
Debian's stockfish (/usr/games/stockfish) are needed. Exit status 0; 2 on bad input.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

UCI = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")
RESULTS = {"1-0", "0-1", "1/2-1/2", "*"}


class Engine:
    """One Stockfish process answering `legal(moves)` with the set of legal UCI moves."""

    def __init__(self, path):
        self.p = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._send("uci")
        self._until("uciok")

    def _send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def _until(self, prefix):
        lines = []
        for line in self.p.stdout:
            line = line.strip()
            if line.startswith(prefix):
                return lines
            lines.append(line)
        raise RuntimeError("stockfish exited early")

    def legal(self, moves):
        self._send("position startpos" + (" moves " + " ".join(moves) if moves else ""))
        self._send("go perft 1")
        out = self._until("Nodes searched")
        return {line.split(":")[0] for line in out if ":" in line and UCI.match(line.split(":")[0])}

    def close(self):
        self._send("quit")
        self.p.wait(timeout=10)


def split_moves(prompt, continuation):
    """(given, sampled): the prompt's complete moves, then the sampled ones. A prompt that
    ends inside a move (no space before the continuation) has that move completed by the
    continuation, so it counts as sampled."""
    given = prompt.split()
    joined = (prompt + continuation).split()
    if given and continuation and not continuation[0].isspace() and not prompt[-1:].isspace():
        given = given[:-1]
    return given, joined[len(given):]


def check_sample(engine, prompt, continuation):
    """(legal, attempted, reason) for one sample."""
    given, sampled = split_moves(prompt, continuation)
    board = []
    for m in given:
        if m in RESULTS:
            return 0, 0, "prompt ends the game"
        if m not in engine.legal(board):
            return 0, 0, f"prompt move {m} is illegal (corrupt sample)"
        board.append(m)
    legal = 0
    for m in sampled:
        if m in RESULTS:
            return legal, legal, f"result {m}"
        if not UCI.match(m):
            return legal, legal + 1, f"malformed move '{m}'"
        if m not in engine.legal(board):
            return legal, legal + 1, f"illegal move {m}"
        board.append(m)
        legal += 1
    return legal, legal, "end of sample"


def read_samples(path):
    """The samples of `path`, one JSON object per non-blank line, each with string fields
    "prompt" and "continuation"; ValueError naming the file and line of the first bad one,
    or saying that the file holds no sample (a rate over nothing is not 0%)."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}") from None
            if not isinstance(r, dict) or not all(isinstance(r.get(k), str) for k in ("prompt", "continuation")):
                raise ValueError(f"{path}:{n}: not a sample (an object with string fields 'prompt' and 'continuation')")
            rows.append(r)
    if not rows:
        raise ValueError(f"{path}: no samples (finetune --sample_tokens N writes them)")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--stockfish", default=shutil.which("stockfish") or "/usr/games/stockfish")
    ap.add_argument("--json", action="store_true", help="print the totals as one JSON object")
    a = ap.parse_args()
    path = os.path.join(a.out_dir, "samples.jsonl")
    try:
        rows = read_samples(path)
    except (OSError, ValueError) as e:
        print(f"legal_moves: {e}", file=sys.stderr)
        return 2
    if not os.access(a.stockfish, os.X_OK):
        print(f"legal_moves: stockfish not found at {a.stockfish} (apt-get install stockfish)", file=sys.stderr)
        return 2
    eng = Engine(a.stockfish)
    tot_legal = tot_att = 0
    for r in rows:
        legal, att, why = check_sample(eng, r["prompt"], r["continuation"])
        tot_legal += legal
        tot_att += att
        if not a.json:
            print(f"game {r.get('game', '?')}: {legal} legal of {att} attempted ({why})")
    eng.close()
    rate = tot_legal / tot_att if tot_att else 0.0
    if a.json:
        print(json.dumps({"samples": len(rows), "legal": tot_legal, "attempted": tot_att, "rate": rate}))
    else:
        print(f"legal moves: {tot_legal} of {tot_att} attempted ({100 * rate:.1f}%) over {len(rows)} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
