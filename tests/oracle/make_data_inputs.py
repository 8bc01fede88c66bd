#!/usr/bin/env python3
"""make_data_inputs.py GAMES OUT: the inputs tests/test_data_in.sh feeds to tokenize_shards.py.

Takes the first 100 train and 6 validation games of GAMES (our JSON lines) and writes them to
OUT in every input layout tokenize_shards.py reads, plus broken files and a tokenizer with a
vocabulary over 65,536. Needs pyarrow, python-chess and tokenizers.
  games.jsonl, games.jsonl.gz, games.jsonl.xz   our rows {"Moves", "Termination", "Result"}
  text.jsonl                                     the tutorial's rows {"text": "e2e4 ... 1-0"}
  pq/part-0.parquet, pq/part-1.parquet          laion/strategic_game_chess layout, split in two
  games.pgn                                      SAN movetext with a Result tag
  nomoves.parquet                                columns moves, Termination, Result (no Moves)
  illegal.parquet, illegal.jsonl                 row 3 / line 4: ply 10 is illegal
  malformed.parquet                              row 5: ply 7 is "e2e9"
  illegal.pgn                                    game 2 has an illegal SAN move
  bigvocab/tokenizer.json                        WordLevel, 70,211 entries, every move id >= 66,000
"""
import gzip
import json
import lzma
import os
import sys

import chess
import chess.pgn
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, models, pre_tokenizers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from chess_corpus import RESULTS, iter_games, split_of  # noqa: E402

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
FIRST_MOVE_ID = 66000   # > 65535: a u16 shard cannot hold these ids


def pick_games(path, n_train=100, n_val=6):
    left = {"train": n_train, "validation": n_val}
    out = []
    for _, _, g in iter_games(path):
        s = split_of(g["Moves"])
        if left[s] > 0:
            left[s] -= 1
            out.append(g)
        if not any(left.values()):
            break
    return out


def write_parquet(path, games, moves_col="Moves", row_group=16):
    table = pa.table({moves_col: pa.array([g["Moves"] for g in games], pa.list_(pa.string())),
                      "Termination": [g["Termination"] for g in games],
                      "Result": [g["Result"] for g in games]})
    pq.write_table(table, path, row_group_size=row_group)


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def pgn_text(g, event):
    game = chess.pgn.Game()
    game.headers["Event"] = event
    game.headers["Result"] = g["Result"]
    node = game
    for m in g["Moves"]:
        node = node.add_variation(chess.Move.from_uci(m))
    return str(game) + "\n\n"


def with_illegal_ply(g, ply):
    """g with move `ply` (1-based) replaced by the previous move again (its from-square is
    empty by then, so the move is illegal); checked with python-chess."""
    moves = list(g["Moves"])
    moves[ply - 1] = moves[ply - 2]
    board = chess.Board()
    for m in moves[:ply - 1]:
        board.push_uci(m)
    assert not board.is_legal(chess.Move.from_uci(moves[ply - 1]))
    return dict(g, Moves=moves)


def big_vocab_tokenizer(path):
    squares = [f + r for r in "12345678" for f in "abcdefgh"]
    words = [a + b for a in squares for b in squares if a != b]
    for frm, to in (("7", "8"), ("2", "1")):
        for i, f in enumerate("abcdefgh"):
            for g in "abcdefgh"[max(i - 1, 0):i + 2]:
                words += [f + frm + g + to + p for p in "qrbn"]
    words += list(RESULTS)
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({"<filler%d>" % i: i for i in range(len(SPECIALS), FIRST_MOVE_ID)})
    vocab.update({w: FIRST_MOVE_ID + i for i, w in enumerate(words)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    assert tok.get_vocab_size() > 65536
    tok.save(path)
    return tok.get_vocab_size()


def main():
    games_path, out = sys.argv[1], sys.argv[2]
    games = pick_games(games_path)
    os.makedirs(os.path.join(out, "pq"), exist_ok=True)
    os.makedirs(os.path.join(out, "bigvocab"), exist_ok=True)
    for name, opener in (("games.jsonl", open), ("games.jsonl.gz", gzip.open), ("games.jsonl.xz", lzma.open)):
        write_jsonl(os.path.join(out, name), games, opener)
    write_jsonl(os.path.join(out, "text.jsonl"), [{"text": " ".join(g["Moves"] + [g["Result"]])} for g in games])
    half = len(games) // 2
    write_parquet(os.path.join(out, "pq", "part-0.parquet"), games[:half])
    write_parquet(os.path.join(out, "pq", "part-1.parquet"), games[half:])
    with open(os.path.join(out, "games.pgn"), "w") as f:
        f.writelines(pgn_text(g, "g%d" % i) for i, g in enumerate(games))
    # the same games with three unfinished ones among them (PGN result "*": the first 20 plies
    # of games 0-2), as PGN and as JSON lines: skipped by default, kept with --keep_unfinished
    cut = [dict(g, Moves=g["Moves"][:20], Result="*") for g in games[:3]]
    mixed = games[:10] + cut[:1] + games[10:50] + cut[1:] + games[50:]
    with open(os.path.join(out, "unfinished.pgn"), "w") as f:
        f.writelines(pgn_text(g, "u%d" % i) for i, g in enumerate(mixed))
    write_jsonl(os.path.join(out, "unfinished.jsonl"), mixed)
    bad = list(mixed)
    bad[11] = dict(bad[11], Moves=bad[11]["Moves"][:4] + ["e2e9"] + bad[11]["Moves"][5:])
    write_jsonl(os.path.join(out, "unfinished_malformed.jsonl"), bad)
    write_parquet(os.path.join(out, "nomoves.parquet"), games[:8], moves_col="moves")
    bad = games[:8]
    bad[3] = with_illegal_ply(bad[3], 10)
    write_parquet(os.path.join(out, "illegal.parquet"), bad)
    write_jsonl(os.path.join(out, "illegal.jsonl"), bad)
    bad = games[:8]
    bad[5] = dict(bad[5], Moves=bad[5]["Moves"][:6] + ["e2e9"] + bad[5]["Moves"][7:])
    write_parquet(os.path.join(out, "malformed.parquet"), bad)
    with open(os.path.join(out, "illegal.pgn"), "w") as f:
        f.write(pgn_text(games[0], "ok"))
        f.write('[Event "bad"]\n[Result "1-0"]\n\n1. e4 e5 2. Ke4 Nf6 1-0\n\n')
    # a split finetune could not use: 8 training games and no validation game; no game at all
    write_jsonl(os.path.join(out, "trainonly.jsonl"), [g for g in games if split_of(g["Moves"]) == "train"][:8])
    write_jsonl(os.path.join(out, "empty.jsonl"), [])
    vocab = big_vocab_tokenizer(os.path.join(out, "bigvocab", "tokenizer.json"))
    print("inputs: %d games (%d validation); big vocabulary %d"
          % (len(games), sum(split_of(g["Moves"]) == "validation" for g in games), vocab))


if __name__ == "__main__":
    main()
