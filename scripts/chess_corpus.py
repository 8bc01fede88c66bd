"""Shared helpers for the chess corpus (standard library only).

Reads the JSON-lines corpus written by chess_selfplay.py, applies the content-hash
train/validation split and renders a game as one text document in the format of the
original tutorial: UCI moves joined by single spaces, then a space and the result,
e.g. "e2e4 e7e5 g1f3 ... 1-0".
"""
import hashlib
import json
import lzma

RESULTS = ("1-0", "0-1", "1/2-1/2")
TERMINATIONS = ("CHECKMATE", "STALEMATE", "INSUFFICIENT_MATERIAL", "SEVENTYFIVE_MOVES",
                "FIVEFOLD_REPETITION", "MAX_PLIES")


def split_of(moves):
    """sha1(" ".join(moves)) % 100 < 2 -> "validation", else "train" (append-stable)."""
    h = int(hashlib.sha1(" ".join(moves).encode()).hexdigest(), 16)
    return "validation" if h % 100 < 2 else "train"


def game_text(game):
    return " ".join(game["Moves"] + [game["Result"]])


def load_games(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def split_texts(path):
    """{"train": [text, ...], "validation": [...]} in corpus order."""
    out = {"train": [], "validation": []}
    for g in load_games(path):
        out[split_of(g["Moves"])].append(game_text(g))
    return out
