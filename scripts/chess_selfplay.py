#!/usr/bin/env python3
"""Generate a chess corpus by letting Stockfish play itself over UCI.

Standard library only (runs with plain python3). Every game is a pure function of
(--seed, game index, engine build, --nodes, --hash): each game gets its own RNG seeded
from sha256("<seed>:<index>"), the engine is reset with `ucinewgame` before every game
and searches with Threads=1 and a fixed node budget (`go nodes N`), so the output is
identical for any --workers value and games can be generated in independent ranges
(--start) and appended later.

A game starts with a random number (--min_open..--max_open) of uniformly random legal
plies (legal moves from `go perft 1`), then Stockfish plays both sides. The game ends,
checked in python-chess `Board.outcome()` order, with
  CHECKMATE              no legal move and in check (winner: the side that just moved)
  INSUFFICIENT_MATERIAL  python-chess rules (lone kings, single minor, same-colour bishops)
  STALEMATE              no legal move, not in check
  SEVENTYFIVE_MOVES      halfmove clock >= 150
  FIVEFOLD_REPETITION    same position (board, side, castling, legal e.p.) seen 5 times
  MAX_PLIES              --max_plies reached (adjudicated as a draw; should be rare)

Output: JSON lines {"Moves": [uci, ...], "Termination": str, "Result": "1-0"|"0-1"|"1/2-1/2"}
(the columns of laion/strategic_game_chess), duplicates (same move list) removed keeping
the first, written xz-compressed (preset 9) plus a meta JSON next to it.

Example:
  nice -n 10 python3 scripts/chess_selfplay.py --games 10000 --workers 2 --seed 1 \
      --out data/chess/games.jsonl.xz
"""
import argparse
import datetime
import hashlib
import json
import lzma
import multiprocessing as mp
import os
import platform
import random
import re
import subprocess
import sys
import time

MOVE_LINE = re.compile(r"^([a-h][1-8][a-h][1-8][qrbn]?): 1$")
DRAW = "1/2-1/2"


def split_of(moves):
    """Content-hash split: stable when games are appended or reordered."""
    h = int(hashlib.sha1(" ".join(moves).encode()).hexdigest(), 16)
    return "validation" if h % 100 < 2 else "train"


def game_seed(base_seed, index):
    d = hashlib.sha256(("chess-selfplay:%d:%d" % (base_seed, index)).encode()).digest()
    return int.from_bytes(d[:8], "little")


class Engine:
    def __init__(self, path, hash_mb, threads=1):
        self.p = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.send("uci")
        self.name = None
        for line in self.lines_until(lambda l: l == "uciok"):
            if line.startswith("id name "):
                self.name = line[len("id name "):].strip()
        self.send("setoption name Threads value %d" % threads)
        self.send("setoption name Hash value %d" % hash_mb)
        self.sync()

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def lines_until(self, stop):
        out = []
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("engine exited unexpectedly")
            line = line.rstrip("\n")
            out.append(line)
            if stop(line):
                return out

    def sync(self):
        self.send("isready")
        self.lines_until(lambda l: l == "readyok")

    def set_position(self, moves):
        self.send("position startpos moves " + " ".join(moves) if moves else "position startpos")

    def fen_and_check(self):
        self.send("d")
        fen = None
        checkers = None
        for line in self.lines_until(lambda l: l.startswith("Checkers:")):
            if line.startswith("Fen: "):
                fen = line[5:].strip()
            if line.startswith("Checkers:"):
                checkers = line[len("Checkers:"):].split()
        if fen is None:
            raise RuntimeError("no Fen line from engine")
        return fen, bool(checkers)

    def legal_moves(self):
        self.send("go perft 1")
        moves = []
        for line in self.lines_until(lambda l: l.startswith("Nodes searched:")):
            m = MOVE_LINE.match(line.strip())
            if m:
                moves.append(m.group(1))
        return moves

    def best_move(self, nodes):
        self.send("go nodes %d" % nodes)
        line = self.lines_until(lambda l: l.startswith("bestmove"))[-1]
        return line.split()[1]

    def quit(self):
        try:
            self.send("quit")
            self.p.wait(timeout=5)
        except Exception:
            self.p.kill()


def parse_board(placement):
    """FEN piece placement -> dict square('e4') -> piece letter."""
    board = {}
    for r, row in enumerate(placement.split("/")):
        rank = 8 - r
        f = 0
        for ch in row:
            if ch.isdigit():
                f += int(ch)
            else:
                board["abcdefgh"[f] + str(rank)] = ch
                f += 1
    return board


def is_dark(sq):
    return ((ord(sq[0]) - ord("a")) + (int(sq[1]) - 1)) % 2 == 0  # a1 is dark


def side_insufficient(board, white):
    """python-chess Board.has_insufficient_material(color) on a parsed FEN board."""
    mine = {sq: p for sq, p in board.items() if p.isupper() == white and p.upper() != "K"}
    theirs = {sq: p for sq, p in board.items() if p.isupper() != white and p.upper() != "K"}
    kinds = {p.upper() for p in mine.values()}
    if kinds & {"P", "R", "Q"}:
        return False
    if "N" in kinds:
        # one lone knight, and the opponent has nothing but queens (no selfmate helpers)
        return len(mine) <= 1 and all(p.upper() == "Q" for p in theirs.values())
    if "B" in kinds:
        bishops = [sq for sq, p in board.items() if p.upper() == "B"]  # both colours
        same = all(is_dark(s) for s in bishops) or not any(is_dark(s) for s in bishops)
        no_pn = not any(p.upper() in ("P", "N") for p in board.values())
        return same and no_pn
    return True


def insufficient_material(board):
    return side_insufficient(board, True) and side_insufficient(board, False)


def repetition_key(fen, board, legal):
    """Board, side, castling and the e.p. square only if an e.p. capture is legal."""
    f = fen.split()
    ep = f[3]
    if ep != "-":
        pawn = "P" if f[1] == "w" else "p"
        if not any(m[2:4] == ep and board.get(m[0:2]) == pawn for m in legal):
            ep = "-"
    return " ".join((f[0], f[1], f[2], ep))


def play_game(engine, index, base_seed, nodes, min_open, max_open, max_plies):
    rng = random.Random(game_seed(base_seed, index))
    n_open = rng.randint(min_open, max_open)
    engine.send("ucinewgame")
    engine.sync()
    moves = []
    seen = {}
    while True:
        engine.set_position(moves)
        fen, in_check = engine.fen_and_check()
        legal = engine.legal_moves()
        board = parse_board(fen.split()[0])
        side_white = fen.split()[1] == "w"
        key = repetition_key(fen, board, legal)
        seen[key] = seen.get(key, 0) + 1
        term = None
        result = DRAW
        if not legal and in_check:
            term, result = "CHECKMATE", ("0-1" if side_white else "1-0")
        elif insufficient_material(board):
            term = "INSUFFICIENT_MATERIAL"
        elif not legal:
            term = "STALEMATE"
        elif int(fen.split()[4]) >= 150:
            term = "SEVENTYFIVE_MOVES"
        elif seen[key] >= 5:
            term = "FIVEFOLD_REPETITION"
        elif len(moves) >= max_plies:
            term = "MAX_PLIES"
        if term:
            return {"Moves": moves, "Termination": term, "Result": result}
        if len(moves) < n_open:
            mv = rng.choice(sorted(legal))
        else:
            mv = engine.best_move(nodes)
            if mv not in legal:
                raise RuntimeError("game %d: engine move %r not legal in %s" % (index, mv, fen))
        moves.append(mv)


_ENGINE = None
_ARGS = None


def _init_worker(args):
    global _ENGINE, _ARGS
    _ARGS = args
    _ENGINE = Engine(args.engine, args.hash)


def _work(index):
    a = _ARGS
    return index, play_game(_ENGINE, index, a.seed, a.nodes, a.min_open, a.max_open, a.max_plies)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--games", type=int, default=10000, help="number of games to play (before dedup)")
    ap.add_argument("--start", type=int, default=0, help="first game index (for appending ranges)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=1000, help="go nodes N per engine move")
    ap.add_argument("--hash", type=int, default=16, help="engine hash MB")
    ap.add_argument("--min_open", type=int, default=4, help="min random opening plies")
    ap.add_argument("--max_open", type=int, default=10, help="max random opening plies")
    ap.add_argument("--max_plies", type=int, default=1000, help="adjudicate a draw (MAX_PLIES) here")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--engine", default="/usr/games/stockfish")
    ap.add_argument("--out", default="data/chess/games.jsonl.xz")
    ap.add_argument("--meta", default=None, help="default: <out without .jsonl.xz>.meta.json")
    args = ap.parse_args()

    meta_path = args.meta or re.sub(r"\.jsonl(\.xz)?$", "", args.out) + ".meta.json"
    probe = Engine(args.engine, args.hash)
    engine_name = probe.name
    probe.quit()

    t0 = time.time()
    indices = range(args.start, args.start + args.games)
    if args.workers <= 1:
        _init_worker(args)
        results = (_work(i) for i in indices)
        pool = None
    else:
        pool = mp.Pool(args.workers, initializer=_init_worker, initargs=(args,))
        results = pool.imap(_work, indices, chunksize=8)

    games, seen, dups = [], set(), 0
    for n, (idx, g) in enumerate(results, 1):
        key = " ".join(g["Moves"])
        if key in seen:
            dups += 1
        else:
            seen.add(key)
            games.append(g)
        if n % 500 == 0 or n == args.games:
            el = time.time() - t0
            print("%d/%d games, %.1f s, %.0f games/min, %d duplicates"
                  % (n, args.games, el, 60 * n / max(el, 1e-9), dups), file=sys.stderr, flush=True)
    if pool:
        pool.close()
        pool.join()
    elif _ENGINE:
        _ENGINE.quit()
    wall = time.time() - t0

    data = "".join(json.dumps(g) + "\n" for g in games).encode()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.out.endswith(".xz"):
        with lzma.open(args.out, "wb", preset=9 | lzma.PRESET_EXTREME, check=lzma.CHECK_CRC64) as f:
            f.write(data)
    else:
        with open(args.out, "wb") as f:
            f.write(data)
    with open(args.out, "rb") as f:
        file_sha = hashlib.sha256(f.read()).hexdigest()

    def counts(key):
        c = {}
        for g in games:
            c[g[key]] = c.get(g[key], 0) + 1
        return dict(sorted(c.items()))

    plies = [len(g["Moves"]) for g in games]
    n_val = sum(split_of(g["Moves"]) == "validation" for g in games)
    meta = {
        "description": "Stockfish self-play chess games (laion/strategic_game_chess columns)",
        "file": os.path.basename(args.out),
        "engine": engine_name,
        "engine_path": args.engine,
        "settings": {"Threads": 1, "Hash": args.hash, "go": "nodes %d" % args.nodes,
                     "random_opening_plies": [args.min_open, args.max_open],
                     "opening_move_choice": "uniform over sorted `go perft 1` moves",
                     "max_plies": args.max_plies},
        "seed": args.seed,
        "game_seed_rule": "random.Random(int.from_bytes(sha256(b'chess-selfplay:<seed>:<index>')[:8], 'little'))",
        "game_index_range": [args.start, args.start + args.games],
        "games_played": args.games,
        "duplicates_removed": dups,
        "count": len(games),
        "plies_total": sum(plies),
        "plies_avg": round(sum(plies) / max(len(games), 1), 2),
        "plies_min": min(plies) if plies else 0,
        "plies_max": max(plies) if plies else 0,
        "terminations": counts("Termination"),
        "results": counts("Result"),
        "split_rule": "int(sha1(' '.join(Moves)).hexdigest(), 16) % 100 < 2 -> validation, else train",
        "split_counts": {"train": len(games) - n_val, "validation": n_val},
        "sha256_jsonl": hashlib.sha256(data).hexdigest(),
        "sha256_file": file_sha,
        "workers": args.workers,
        "wall_seconds": round(wall, 1),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python3"] + sys.argv),
    }
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps({k: meta[k] for k in ("count", "duplicates_removed", "plies_avg",
                                           "terminations", "results", "split_counts",
                                           "wall_seconds")}), file=sys.stderr)


if __name__ == "__main__":
    main()
