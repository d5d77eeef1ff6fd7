"""WordNet tasks and corpus, on the real WordNet 3.0 dict files (skipped when absent)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pretrain.data import load_corpus, load_task, whole_task
from pretrain.data import wordnet
from pretrain.errors import UserError

try:
    DICT_DIR = wordnet.find_dict_dir()
except UserError as e:
    DICT_DIR, WHY = None, str(e)
else:
    WHY = ""
needs_wordnet = pytest.mark.skipif(DICT_DIR is None, reason=WHY)


@pytest.fixture(scope="module")
def supersense():
    return wordnet.supersense_task(seed=0)


@pytest.fixture(scope="module")
def wsd():
    return wordnet.wsd_task(seed=0)


def _rows(split):
    pairs = split.text_pairs or [None] * len(split)
    return set(zip(split.texts, pairs, split.labels))


# --- locating the dict files (no WordNet needed) ---

def test_missing_dict_dir_names_where_it_looked_and_the_fix(tmp_path):
    with pytest.raises(UserError, match="wordnet-base") as err:
        wordnet.find_dict_dir(str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in str(err.value)
    assert "WNHOME" in str(err.value)


def test_wnhome_missing_lists_both_candidates(tmp_path, monkeypatch):
    monkeypatch.setenv("WNHOME", str(tmp_path))
    with pytest.raises(UserError) as err:
        wordnet.find_dict_dir()
    assert str(tmp_path) in str(err.value) and str(tmp_path / "dict") in str(err.value)


@needs_wordnet
def test_wnhome_may_hold_a_dict_subfolder(tmp_path, monkeypatch):
    (tmp_path / "dict").symlink_to(DICT_DIR)
    monkeypatch.setenv("WNHOME", str(tmp_path))
    assert wordnet.find_dict_dir() == tmp_path / "dict"


def test_gloss_split_keeps_definition_and_unquotes_examples():
    definition, examples = wordnet._split_gloss(
        'a member of the genus Canis (probably descended from the wolf); '
        'occurs in many breeds; "the dog barked all night"; "dogs bark"')
    assert definition == "a member of the genus Canis (probably descended from the wolf); occurs in many breeds"
    assert examples == ("the dog barked all night", "dogs bark")
    assert wordnet._top_level_split(definition) == [
        "a member of the genus Canis (probably descended from the wolf)", "occurs in many breeds"]
    assert wordnet._top_level_split("a mark (`;') used; other") == ["a mark (`;') used", "other"]


def test_adjective_markers_and_underscores_are_cleaned():
    assert wordnet._clean_word("long(a)") == "long"
    assert wordnet._clean_word("galore(ip)") == "galore"
    assert wordnet._clean_word("physical_entity") == "physical entity"


def test_lexnames_are_the_45_wordnet_classes():
    assert len(wordnet.LEXNAMES) == 45 == len(set(wordnet.LEXNAMES))
    assert wordnet.LEXNAMES[3] == "noun.Tops" and wordnet.LEXNAMES[44] == "adj.ppl"


# --- the supersense task ---

@needs_wordnet
def test_supersense_has_every_synset_once_and_45_labels(supersense):
    sizes = [len(supersense.split(name)) for name in ("train", "validation", "test")]
    assert sum(sizes) == 117_659
    assert sizes == [94_129, 11_765, 11_765]
    assert supersense.label_names == wordnet.LEXNAMES
    assert not supersense.is_pair_task
    used = {label for split in supersense.splits.values() for label in split.labels}
    assert used == set(range(45))


@needs_wordnet
def test_supersense_splits_partition_the_synsets(supersense):
    # Texts can repeat ("bank: ..." twice would be two synsets), so compare multisets:
    # every synset's example appears exactly once over all splits.
    expected = Counter((f"{s.words[0]}: {s.first_definition}", s.lexname) for s in wordnet.load_synsets())
    seen = Counter()
    for split in supersense.splits.values():
        seen.update(zip(split.texts, split.labels))
    assert seen == expected
    train, test = (set(supersense.split(n).texts) for n in ("train", "test"))
    assert len(train & test) < 50, "only WordNet's own duplicate texts may straddle splits"


@needs_wordnet
def test_supersense_is_seeded(supersense):
    again = wordnet.supersense_task(seed=0)
    other = wordnet.supersense_task(seed=1)
    assert again.split("test").texts == supersense.split("test").texts
    assert again.split("test").labels == supersense.split("test").labels
    assert other.split("test").texts != supersense.split("test").texts


@needs_wordnet
def test_supersense_text_of_entity(supersense):
    label = wordnet.LEXNAMES.index("noun.Tops")
    entity = "entity: that which is perceived or known or inferred to have its own distinct existence (living or nonliving)"
    found = [(t, l) for s in supersense.splits.values() for t, l in zip(s.texts, s.labels) if t.startswith("entity: ")]
    assert (entity, label) in found


@needs_wordnet
def test_supersense_texts_hold_no_example_quotes(supersense):
    texts = [t for s in supersense.splits.values() for t in s.texts]
    assert not [t for t in texts if '"' in t]
    assert all(t.split(": ", 1)[1] for t in texts), "every text has a definition"
    # "dog" has the example "the dog barked all night"; it must not leak into the text.
    dog = [t for t in texts if t.startswith("dog: a member of the genus Canis")]
    assert dog and "barked" not in dog[0]


@needs_wordnet
def test_a_whole_built_in_task_is_its_three_splits_together(wsd):
    whole = whole_task("wordnet-wsd")
    assert list(whole.splits) == ["all"] and whole.label_names == wsd.label_names and whole.is_pair_task
    for field in ("texts", "labels", "text_pairs"):
        assert getattr(whole.split("all"), field) == [x for name in ("train", "validation", "test")
                                                      for x in getattr(wsd.split(name), field)]


@needs_wordnet
def test_load_task_by_name(supersense):
    assert load_task("wordnet-supersense").split("validation").texts == supersense.split("validation").texts


# --- the word-sense task ---

@needs_wordnet
def test_wsd_is_a_balanced_pair_task(wsd):
    assert wsd.label_names == ("no", "yes") and wsd.is_pair_task
    for split in wsd.splits.values():
        assert len(split) > 1000
        assert abs(sum(split.labels) / len(split) - 0.5) < 0.01
        assert len(split.text_pairs) == len(split)
        assert not any('"' in t for t in split.texts)


@needs_wordnet
def test_wsd_sizes_roughly_80_10_10(wsd):
    sizes = {name: len(split) for name, split in wsd.splits.items()}
    total = sum(sizes.values())
    assert 0.7 < sizes["train"] / total < 0.9
    assert 0.05 < sizes["test"] / total < 0.15


@needs_wordnet
def test_wsd_splits_have_disjoint_lemmas(wsd):
    synsets = wordnet.load_synsets()
    pairs = wordnet._pairs_by_lemma(synsets, random.Random(0))
    lemma_of = {(sentence, definition): lemma
                for lemma, rows in pairs.items() for sentence, definition, label in rows if label}
    lemmas = {}
    for name, split in wsd.splits.items():
        lemmas[name] = {lemma_of[(t, p)] for t, p, y in zip(split.texts, split.text_pairs, split.labels) if y}
    assert not lemmas["train"] & lemmas["test"]
    assert not lemmas["train"] & lemmas["validation"]
    assert not lemmas["validation"] & lemmas["test"]


@needs_wordnet
def test_wsd_labels_say_whether_the_definition_owns_the_example(wsd):
    # A few sentences are examples of several synsets (e.g. "a live shell"), so a sentence
    # maps to the set of definitions it is an example of.
    owners = {}
    for s in wordnet.load_synsets():
        for sentence in s.examples:
            owners.setdefault(sentence, set()).add(s.definition)
    for split in wsd.splits.values():
        for text, pair, label in zip(split.texts, split.text_pairs, split.labels):
            assert (pair in owners[text]) == bool(label), (text, pair, label)


@needs_wordnet
def test_wsd_is_seeded(wsd):
    assert _rows(wordnet.wsd_task(seed=0).split("test")) == _rows(wsd.split("test"))
    assert _rows(wordnet.wsd_task(seed=3).split("test")) != _rows(wsd.split("test"))


# --- the corpus ---

@needs_wordnet
def test_corpus_documents_are_plain_lines():
    docs = list(wordnet.corpus_documents())
    assert len(docs) == 117_659
    assert all(doc and all(line.strip() for line in doc) for doc in docs)
    assert not any('"' in line for doc in docs for line in doc[1:])
    assert ["a member of the genus Canis (probably descended from the common wolf) that has been "
            "domesticated by man since prehistoric times; occurs in many breeds",
            "the dog barked all night"] in docs


@needs_wordnet
def test_write_corpus_round_trips_through_load_corpus(tmp_path):
    path = tmp_path / "wordnet.txt"
    count = wordnet.write_corpus(path)
    first = next(wordnet.corpus_documents())
    streamed = load_corpus(str(path))
    assert next(streamed) == first
    assert 1 + sum(1 for _ in streamed) == count == 117_659
    assert next(load_corpus("wordnet")) == first


def test_load_corpus_of_text_file(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("one\ntwo\n\n\nthree\n  \nfour", encoding="utf-8")
    assert list(load_corpus(str(path))) == [["one", "two"], ["three"], ["four"]]


def test_load_corpus_unknown_lists_builtins(tmp_path):
    with pytest.raises(UserError, match="wordnet") as err:
        load_corpus(str(tmp_path / "missing.txt"))
    assert "missing.txt" in str(err.value)


def test_load_corpus_not_utf8(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(UserError, match="UTF-8"):
        list(load_corpus(str(path)))


def test_missing_wordnet_fails_cleanly_for_tasks(tmp_path):
    for build in (wordnet.supersense_task, wordnet.wsd_task):
        with pytest.raises(UserError, match="wordnet-base"):
            build(wordnet_dir=str(tmp_path))
    with pytest.raises(UserError, match="wordnet-base"):
        list(load_corpus("wordnet", wordnet_dir=str(tmp_path)))
