"""Built-in tasks and corpus from WordNet 3.0's dict files (Debian package wordnet-base).

Read straight from data.{noun,verb,adj,adv}; no NLTK. Everything is deterministic: synsets are
sorted by (pos, offset) and shuffled with `seeded_order`, so a seed names the same splits on
every machine.
"""

from __future__ import annotations

import functools
import os
import random
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pretrain.data import Split, TaskData, seeded_order, split_counts
from pretrain.errors import UserError

DEFAULT_DIR = "/usr/share/wordnet"
POS_FILES = {"n": "data.noun", "v": "data.verb", "a": "data.adj", "r": "data.adv"}
FRACTIONS = (0.8, 0.1, 0.1)

# The 45 lexicographer files of WordNet 3.0 (lexnames(5WN)); lex_filenum indexes this tuple.
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal",
    "noun.artifact", "noun.attribute", "noun.body", "noun.cognition", "noun.communication",
    "noun.event", "noun.feeling", "noun.food", "noun.group", "noun.location", "noun.motive",
    "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
    "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state",
    "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition",
    "verb.communication", "verb.competition", "verb.consumption", "verb.contact",
    "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession",
    "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)

_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")   # syntactic markers such as long(a), galore(ip)
_TRAILING = " \t;:,"


@dataclass(frozen=True, slots=True)
class Synset:
    pos: str                    # the data file's pos: n, v, a (satellites included), r
    offset: int
    lexname: int                # index into LEXNAMES
    words: tuple[str, ...]      # underscores as spaces, adjective markers removed
    definition: str             # the gloss before its first quoted example
    examples: tuple[str, ...]   # quoted example sentences, without the quotes

    @property
    def first_definition(self) -> str:
        """The first ';'-separated part of the definition (';' inside parentheses kept)."""
        return _top_level_split(self.definition)[0]


def find_dict_dir(wordnet_dir: str | None = None) -> Path:
    """The WordNet dict folder: the argument, else $WNHOME (or $WNHOME/dict), else the Debian path."""
    if wordnet_dir is not None:
        candidates = [Path(wordnet_dir)]
    elif os.environ.get("WNHOME"):
        home = Path(os.environ["WNHOME"])
        candidates = [home, home / "dict"]
    else:
        candidates = [Path(DEFAULT_DIR)]
    for folder in candidates:
        if all((folder / name).is_file() for name in POS_FILES.values()):
            return folder
    looked = ", ".join(str(c) for c in candidates)
    raise UserError(
        f"WordNet 3.0 dict files (data.noun, data.verb, data.adj, data.adv) not found in {looked}; "
        "install Debian package wordnet-base or set WNHOME")


def load_synsets(wordnet_dir: str | None = None) -> tuple[Synset, ...]:
    """All synsets, sorted by (pos, offset)."""
    return _parse_dict_dir(str(find_dict_dir(wordnet_dir).resolve()))


@functools.lru_cache(maxsize=4)
def _parse_dict_dir(folder: str) -> tuple[Synset, ...]:
    synsets = []
    for pos, name in POS_FILES.items():
        path = Path(folder) / name
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.startswith("  "):  # two leading spaces mark the license header
                    synsets.append(_parse_line(line, pos, path))
    synsets.sort(key=lambda s: (s.pos, s.offset))
    return tuple(synsets)


def _parse_line(line: str, pos: str, path: Path) -> Synset:
    # offset lex_filenum ss_type w_cnt word lex_id [word lex_id...] p_cnt ... | gloss
    head, _, gloss = line.partition(" | ")
    fields = head.split()
    lexname = int(fields[1])
    if lexname >= len(LEXNAMES):  # only a corrupt or non-3.0 file gets here
        raise UserError(f"{path}: synset {fields[0]} has lex_filenum {lexname}; WordNet 3.0 has 45")
    n_words = int(fields[3], 16)
    words = tuple(_clean_word(w) for w in fields[4:4 + 2 * n_words:2])
    definition, examples = _split_gloss(gloss.strip())
    return Synset(pos, int(fields[0]), lexname, words, definition, examples)


def _clean_word(word: str) -> str:
    return _ADJ_MARKER.sub("", word).replace("_", " ")


def _split_gloss(gloss: str) -> tuple[str, tuple[str, ...]]:
    """(definition, examples): examples are the quoted parts after the definition.

    A handful of glosses have unbalanced quotes; taking every other '"'-separated chunk
    still never lets a quote character into the definition.
    """
    quote = gloss.find('"')
    if quote < 0:
        return gloss.strip(_TRAILING), ()
    chunks = gloss[quote:].split('"')[1::2]
    examples = tuple(c.strip(_TRAILING) for c in chunks if c.strip(_TRAILING))
    return gloss[:quote].strip(_TRAILING), examples


def _top_level_split(text: str) -> list[str]:
    """Split at ';' outside parentheses; empty parts dropped (at least one part returned)."""
    parts: list[str] = []
    depth = 0
    for piece in text.split(";"):
        # Inside an open parenthesis the ';' belongs to the same part: glue it back.
        if depth > 0:
            parts[-1] += ";" + piece
        else:
            parts.append(piece)
        depth = max(0, depth + piece.count("(") - piece.count(")"))
    kept = [p.strip(_TRAILING) for p in parts if p.strip(_TRAILING)]
    return kept or [""]


def _split_in_three(items: list, seed: int) -> tuple[list, list, list]:
    order = seeded_order(len(items), seed)
    n_train, n_val, _ = split_counts(len(items), FRACTIONS)
    shuffled = [items[i] for i in order]
    return shuffled[:n_train], shuffled[n_train:n_train + n_val], shuffled[n_train + n_val:]


def supersense_task(seed: int = 0, wordnet_dir: str | None = None) -> TaskData:
    """'lemma: first definition' -> lexicographer class, one example per synset."""
    examples = [(f"{s.words[0]}: {s.first_definition}", s.lexname) for s in load_synsets(wordnet_dir)]
    splits = {
        name: Split([t for t, _ in part], [label for _, label in part])
        for name, part in zip(("train", "validation", "test"), _split_in_three(examples, seed))
    }
    return TaskData("wordnet-supersense", LEXNAMES, splits, spec="wordnet-supersense")


def wsd_task(seed: int = 0, wordnet_dir: str | None = None) -> TaskData:
    """(example sentence, candidate definition) -> does the definition fit? Split by lemma."""
    synsets = load_synsets(wordnet_dir)
    by_lemma = _pairs_by_lemma(synsets, random.Random(seed))
    lemma_splits = _split_in_three(sorted(by_lemma), seed)
    splits = {}
    for i, (name, lemmas) in enumerate(zip(("train", "validation", "test"), lemma_splits)):
        pairs = [p for lemma in lemmas for p in by_lemma[lemma]]
        # Shuffle inside the split too, so a positive and its negative are not neighbours
        # and Split.head(n) takes a random sample.
        pairs = [pairs[i] for i in seeded_order(len(pairs), seed + i + 1)]
        splits[name] = Split([p[0] for p in pairs], [p[2] for p in pairs], [p[1] for p in pairs])
    return TaskData("wordnet-wsd", ("no", "yes"), splits, spec="wordnet-wsd")


def _pairs_by_lemma(synsets: tuple[Synset, ...], rng: random.Random) -> dict[str, list[tuple]]:
    """lemma -> [(sentence, definition, label)], a positive and one negative per example.

    Each example is used once, with the first of its synset's words that is ambiguous and
    occurs in it: using it again for another word would repeat the identical positive pair
    under a different lemma, and so possibly in another split.
    """
    senses: dict[tuple[str, str], list[Synset]] = defaultdict(list)
    for s in synsets:
        for word in dict.fromkeys(w.lower() for w in s.words):
            senses[s.pos, word].append(s)
    # A few example sentences appear in several synsets; a negative must not be the
    # definition of any synset that owns the sentence, or the labels would contradict.
    owners: dict[str, set[str]] = defaultdict(set)
    for s in synsets:
        for sentence in s.examples:
            owners[sentence].add(s.definition)
    pairs: dict[str, list[tuple]] = defaultdict(list)
    for s in synsets:
        for sentence in s.examples:
            word = _target_word(s, sentence, senses)
            if word is None or not s.definition:
                continue
            wrong = [o.definition for o in senses[s.pos, word]
                     if o.definition and o.definition not in owners[sentence]]
            if wrong:
                pairs[word].append((sentence, s.definition, 1))
                # random() rather than choice(): only random()'s sequence is version-stable.
                pairs[word].append((sentence, wrong[int(rng.random() * len(wrong))], 0))
    return pairs


def _target_word(s: Synset, sentence: str, senses: dict) -> str | None:
    lowered = sentence.lower()
    for word in dict.fromkeys(w.lower() for w in s.words):
        if len(senses[s.pos, word]) >= 2 and _occurs(word, lowered):
            return word
    return None


def _occurs(word: str, lowered_sentence: str) -> bool:
    """The word, or for a phrase its first token, starts a word of the sentence.

    Matching word starts (not whole words) lets regular inflections count: dog -> dogs.
    Plain str.find, not a regex: compiling one per lemma took most of wsd_task's time.
    """
    for form in dict.fromkeys((word, word.split()[0])):
        at = lowered_sentence.find(form)
        while at >= 0:
            if at == 0 or not lowered_sentence[at - 1].isalnum():
                return True
            at = lowered_sentence.find(form, at + 1)
    return False


def corpus_documents(wordnet_dir: str | None = None) -> Iterator[list[str]]:
    """One document per synset: its definition, then each example sentence, one per line."""
    for s in load_synsets(wordnet_dir):
        lines = [line for line in (s.definition, *s.examples) if line]
        if lines:
            yield lines


def write_corpus(path: str | os.PathLike, wordnet_dir: str | None = None) -> int:
    """Write the wordnet corpus as plain text, blank lines between documents; returns their count."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for doc in corpus_documents(wordnet_dir):
            f.write("\n".join(doc) + "\n\n")
            count += 1
    return count
