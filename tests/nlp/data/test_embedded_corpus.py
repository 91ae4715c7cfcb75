"""Tests of the offline English→German corpus (`nlp.data.embedded`)."""

import re

import pytest
from babel import dates as babel_dates
from num2words import num2words

from nlp.data import embedded


@pytest.fixture(scope="module")
def train_pairs():
    return embedded.generate_pairs(3000, seed=0, split="train")


def test_same_seed_same_pairs_and_prefix_stable():
    first = embedded.generate_pairs(60, seed=7)
    assert first == embedded.generate_pairs(60, seed=7)
    assert embedded.generate_pairs(20, seed=7) == first[:20]
    assert embedded.generate_pairs(60, seed=8) != first


def test_train_and_valid_sources_are_disjoint_across_seeds():
    train = {s for seed in (0, 1) for s, _ in embedded.generate_pairs(1500, seed, "train")}
    valid = {s for seed in (0, 1) for s, _ in embedded.generate_pairs(150, seed, "valid")}
    assert len(valid) > 150  # the two seeds give different valid sentences
    assert not train & valid
    assert all(embedded.split_of(s) == "valid" for s in valid)


def test_pairs_are_distinct_sentences(train_pairs):
    sources = [s for s, _ in train_pairs]
    assert len(set(sources)) == len(sources) == 3000
    for source, target in train_pairs:
        assert source[0].isupper() and target[0].isupper(), (source, target)
        assert source.endswith(".") and target.endswith("."), (source, target)


def test_num2words_cardinals_in_pairs(train_pairs):
    with_21 = [(s, t) for s, t in train_pairs if re.search(r"\btwenty-one\b", s)]
    assert with_21, "expected a sentence with the number twenty-one"
    for source, target in with_21:
        assert "einundzwanzig" in target, (source, target)
    pattern = re.compile(r"^(\w+) (\w+) ([a-z -]+) apples\.$")
    apples = [(pattern.match(s), t) for s, t in train_pairs if pattern.match(s)]
    assert len(apples) > 5
    subjects = {"I": "Ich", "You": "Du", "He": "Er", "She": "Sie", "We": "Wir", "They": "Sie"}
    for match, target in apples:
        subject, _, number = match.groups()
        assert target.startswith(subjects[subject] + " "), (match.group(0), target)
        assert target.endswith(f" {_german_for(number)} Äpfel."), (match.group(0), target)


def _german_for(english: str) -> str:
    for n in range(2, 1000):
        if num2words(n, lang="en") == english:
            return num2words(n, lang="de")
    raise AssertionError(f"not a number word: {english!r}")


def test_babel_dates_in_pairs(train_pairs):
    pattern = re.compile(r"^The meeting is on (\w+) (\d+), (\d{4})\.$")
    meetings = [(pattern.match(s), t) for s, t in train_pairs if pattern.match(s)]
    assert meetings
    months_en = babel_dates.get_month_names("wide", locale="en")
    months_de = babel_dates.get_month_names("wide", locale="de")
    for match, target in meetings:
        month = next(k for k, name in months_en.items() if name == match.group(1))
        day, year = int(match.group(2)), match.group(3)
        assert target == f"Das Treffen ist am {day}. {months_de[month]} {year}."


def test_ordinals_take_german_endings(train_pairs):
    nominative = [(s, t) for s, t in train_pairs if s.startswith("This is the third ")]
    dative = [(s, t) for s, t in train_pairs if "on the third day" in s]
    for source, target in nominative:
        assert " dritte " in target, (source, target)
    for source, target in dative:
        assert "am dritten Tag" in target, (source, target)
    ordinal_pairs = [t for s, t in train_pairs if re.search(r"\bthe twenty-first\b", s)]
    assert all("einundzwanzigste" in t for t in ordinal_pairs)


def test_no_german_eins_before_a_noun():
    # 101 apples is "hunderteins Äpfel"-wrong; such numbers are never put before a noun.
    pairs = embedded.generate_pairs(2000, seed=3)
    assert not [t for _, t in pairs if re.search(r"eins [A-ZÄÖÜ]", t)]


def test_default_sizes_and_bad_arguments():
    assert embedded.DEFAULT_SIZES == {"train": 20_000, "valid": 500}
    assert embedded.generate_pairs(0) == []
    with pytest.raises(ValueError, match="split.*'test'"):
        embedded.generate_pairs(3, split="test")
    with pytest.raises(ValueError, match="n=-1"):
        embedded.generate_pairs(-1)
