"""Shared helpers for the chess corpus.

Reads games from any of these inputs, applies the content-hash train/validation split and
renders a game as one text document in the format of the original tutorial: UCI moves
joined by single spaces, then a space and the result, e.g. "e2e4 e7e5 g1f3 ... 1-0".

  *.parquet             the laion/strategic_game_chess layout: columns Moves (list of UCI
                        strings) and Result (Termination is read when present); needs pyarrow
  *.pgn[.gz|.xz]        PGN games (SAN), converted to UCI; needs python-chess
  anything else         JSON lines, plain or .gz/.xz compressed: one object a line, either
                        {"Moves": [...], "Result": ...} (our corpus, chess_selfplay.py) or the
                        tutorial's {"text": "e2e4 ... 1-0"}
  a directory           every file above inside it (recursively), in sorted path order

JSON lines need only the standard library. Bad input raises CorpusError with one line that
names the file and the place: "line N" (JSON lines, 1-based), "row N" (parquet, 0-based, as
pyarrow and pandas count) or "game N" (PGN, 1-based).
"""
import gzip
import hashlib
import json
import lzma
import os
import re

RESULTS = ("1-0", "0-1", "1/2-1/2")
UNFINISHED = "*"   # PGN's result for a game unknown or not finished (Stockfish corpora have some)
TERMINATIONS = ("CHECKMATE", "STALEMATE", "INSUFFICIENT_MATERIAL", "SEVENTYFIVE_MOVES",
                "FIVEFOLD_REPETITION", "MAX_PLIES")
UCI_MOVE = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")
PARQUET_BATCH_ROWS = 4096


SKIP_UNFINISHED = "result * (unfinished)"   # the reason iter_games counts a skipped game under


class CorpusError(ValueError):
    """Bad input; the message is one line naming the file (and row/line/game)."""


def split_of(moves, val_percent=2):
    """sha1(" ".join(moves)) % 100 < val_percent -> "validation", else "train" (append-stable)."""
    h = int(hashlib.sha1(" ".join(moves).encode()).hexdigest(), 16)
    return "validation" if h % 100 < val_percent else "train"


def game_text(game):
    return " ".join(game["Moves"] + [game["Result"]])


# ---------------------------------------------------------------- finding the input files

def source_kind(path):
    """"parquet", "pgn" or "jsonl", from the file name."""
    name = path.lower()
    for z in (".gz", ".xz"):
        if name.endswith(z):
            name = name[:-len(z)]
    if name.endswith(".parquet"):
        return "parquet"
    return "pgn" if name.endswith(".pgn") else "jsonl"


def expand_sources(paths):
    """The input files named by paths (files, or directories searched recursively for
    .parquet, .pgn and .jsonl files, compressed or not), in order. A directory's .json files
    are not games (shards.json, games.meta.json, tokenizer.json: an --out_dir or a data
    folder holds them); name such a file of JSON lines directly. Checks each file opens (and a
    parquet file's columns) before anything is read."""
    if isinstance(paths, str):
        paths = [paths]
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for root, dirs, names in os.walk(p):
                dirs.sort()
                for n in sorted(names):
                    base = re.sub(r"\.(gz|xz)$", "", n.lower())
                    if base.endswith((".parquet", ".pgn", ".jsonl")):
                        found.append(os.path.join(root, n))
            if not found:
                raise CorpusError("%s: directory holds no .parquet, .pgn or .jsonl file" % p)
            files += found
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise CorpusError("%s: no such file or directory" % p)
    for f in files:
        try:
            open(f, "rb").close()
        except OSError as e:
            raise CorpusError("%s: cannot open: %s" % (f, e.strerror))
        if source_kind(f) == "parquet":
            parquet_file(f)
    return files


def open_text(path):
    if path.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, "rt", encoding="utf-8")


# ---------------------------------------------------------------- readers: (where, game)

def check_game(path, where, moves, result):
    """The shape every reader guarantees: a non-empty list of UCI-shaped moves (e2e4, e7e8q:
    text that is not chess is refused here; legality needs --check_moves) and a known result
    (one of the three outcomes, or "*", unfinished: iter_games skips or keeps those)."""
    if not isinstance(moves, list) or not moves or not all(isinstance(m, str) for m in moves):
        raise CorpusError("%s: %s: Moves is not a non-empty list of strings" % (path, where))
    for ply, m in enumerate(moves, 1):
        if not UCI_MOVE.fullmatch(m):   # (match's $ also passes "e2e4\n")
            raise CorpusError("%s: %s: malformed move %r at ply %d (not UCI like e2e4 or e7e8q)" % (path, where, m, ply))
    if result not in RESULTS and result != UNFINISHED:
        raise CorpusError("%s: %s: Result %r is not one of %s" % (path, where, result, ", ".join(RESULTS + (UNFINISHED,))))


def read_jsonl(path):
    try:
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = "line %d" % n
                try:
                    g = json.loads(line)
                except ValueError as e:
                    raise CorpusError("%s: %s: not JSON (%s)" % (path, where, e))
                if isinstance(g, dict) and "Moves" not in g and isinstance(g.get("text"), str):
                    words = g["text"].split()   # the tutorial's {"text": "e2e4 ... 1-0"}
                    g = {"Moves": words[:-1], "Result": words[-1] if words else None}
                if not isinstance(g, dict) or "Moves" not in g:
                    raise CorpusError("%s: %s: no \"Moves\" (or \"text\") field" % (path, where))
                check_game(path, where, g["Moves"], g.get("Result"))
                yield where, g
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise CorpusError("%s: cannot read: %s" % (path, e))


def parquet_file(path):
    """pyarrow ParquetFile for path, with the Moves and Result columns checked."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpusError("%s: reading parquet needs pyarrow (pip install pyarrow)" % path)
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for a bad file
        raise CorpusError("%s: not a readable parquet file (%s)" % (path, str(e).splitlines()[0]))
    names = pf.schema_arrow.names
    for col in ("Moves", "Result"):
        if col not in names:
            raise CorpusError("%s: no %s column (columns: %s)" % (path, col, ", ".join(names) or "none"))
    return pf


def read_parquet(path):
    pf = parquet_file(path)
    cols = [c for c in ("Moves", "Termination", "Result") if c in pf.schema_arrow.names]
    row = 0
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=cols):
        data = {c: batch.column(c).to_pylist() for c in cols}
        for i in range(batch.num_rows):
            g = {c: data[c][i] for c in cols}
            where = "row %d" % row
            check_game(path, where, g["Moves"], g["Result"])
            yield where, g
            row += 1


def read_pgn(path):
    try:
        import chess.pgn
    except ImportError:
        raise CorpusError("%s: reading PGN needs python-chess (pip install chess)" % path)

    class QuietBuilder(chess.pgn.GameBuilder):
        def handle_error(self, error):   # keep the error for our one line; python-chess would also log it
            self.game.errors.append(error)

    with open_text(path) as f:
        n = 0
        while True:
            game = chess.pgn.read_game(f, Visitor=QuietBuilder)
            if game is None:
                return
            n += 1
            where = "game %d" % n
            if game.errors:
                raise CorpusError("%s: %s: %s" % (path, where, str(game.errors[0]).splitlines()[0]))
            board = game.end().board()
            moves = [m.uci() for m in game.mainline_moves()]
            result = game.headers.get("Result")
            check_game(path, where, moves, result)
            outcome = board.outcome()
            yield where, {"Moves": moves, "Termination": outcome.termination.name if outcome else "UNKNOWN",
                          "Result": result}


READERS = {"jsonl": read_jsonl, "parquet": read_parquet, "pgn": read_pgn}


def move_checker():
    """check(path, where, moves): raises CorpusError at the first malformed or illegal move
    (replayed from the standard start position with python-chess)."""
    try:
        import chess
    except ImportError:
        raise CorpusError("--check_moves needs python-chess (pip install chess)")

    def check(path, where, moves):
        board = chess.Board()
        for ply, m in enumerate(moves, 1):
            try:
                move = chess.Move.from_uci(m) if UCI_MOVE.fullmatch(m) else None
            except ValueError:
                move = None
            if move is None:
                raise CorpusError("%s: %s: malformed move %r at ply %d (not UCI like e2e4 or e7e8q)"
                                  % (path, where, m, ply))
            if not board.is_legal(move):
                raise CorpusError("%s: %s: illegal move %r at ply %d (position %s)"
                                  % (path, where, m, ply, board.fen()))
            board.push(move)
    return check


def iter_games(paths, check_moves=False, keep_unfinished=False, skipped=None):
    """Yield (path, where, game) for every game in paths (see expand_sources), game being
    {"Moves": [...], "Result": ..., ...}. With check_moves every move is replayed. Games whose
    result is "*" (unfinished) are skipped unless keep_unfinished, and counted in the dict
    skipped (reason -> games) when one is given; a malformed move stops the run either way."""
    check = move_checker() if check_moves else None
    for path in expand_sources(paths):
        for where, g in READERS[source_kind(path)](path):
            if g["Result"] == UNFINISHED and not keep_unfinished:
                if skipped is not None:
                    skipped[SKIP_UNFINISHED] = skipped.get(SKIP_UNFINISHED, 0) + 1
                continue
            if check:
                check(path, where, g["Moves"])
            yield path, where, g


def split_texts(paths):
    """{"train": [text, ...], "validation": [...]} in corpus order."""
    out = {"train": [], "validation": []}
    for _, _, g in iter_games(paths):
        out[split_of(g["Moves"])].append(game_text(g))
    return out
