"""The phrase templates of the `embedded` corpus: English→German pairs from `num2words` and `babel`.

About a dozen short templates with small noun and verb vocabularies; the numbers are spelled
out by `num2words` (cardinals and ordinals, English and German: "twenty-one" →
"einundzwanzig") and the dates are formatted by `babel` ("March 3, 2021" → "3. März 2021").
German agreement is handled in the templates: ordinals take the weak adjective ending ("der
dritte Tag", "am dritten Tag"), durations use the dative plural ("seit drei Tagen") and
numbers ending in "eins" are never put in front of a noun.

`TEMPLATES` holds one function a template, each drawing one pair from a `random.Random`;
`nlp.data.embedded.generate_pairs` draws from them.
"""

from __future__ import annotations

import datetime
import random
from typing import Callable

from babel import dates as babel_dates
from num2words import num2words

__all__ = ["TEMPLATES", "Pair"]

Pair = tuple[str, str]

# (English subject, German subject, German person index: 0 ich, 1 du, 2 er/sie/es, 3 wir/sie).
_SUBJECTS = (
    ("I", "Ich", 0),
    ("You", "Du", 1),
    ("He", "Er", 2),
    ("She", "Sie", 2),
    ("We", "Wir", 3),
    ("They", "Sie", 3),
)
# ((English base form, English 3rd person singular), German present forms by person index).
_VERBS = (
    (("have", "has"), ("habe", "hast", "hat", "haben")),
    (("need", "needs"), ("brauche", "brauchst", "braucht", "brauchen")),
    (("see", "sees"), ("sehe", "siehst", "sieht", "sehen")),
    (("buy", "buys"), ("kaufe", "kaufst", "kauft", "kaufen")),
    (("want", "wants"), ("will", "willst", "will", "wollen")),
)
_TO_BE = ("bin", "bist", "ist", "sind")
_WAIT = ("warte", "wartest", "wartet", "warten")
_BOUGHT = ("kaufte", "kauftest", "kaufte", "kauften")
_TOOK = ("belegte", "belegtest", "belegte", "belegten")
# Plural nouns (nominative = accusative plural in German).
_PLURALS = (
    ("apples", "Äpfel"),
    ("books", "Bücher"),
    ("cats", "Katzen"),
    ("dogs", "Hunde"),
    ("houses", "Häuser"),
    ("cars", "Autos"),
    ("bottles", "Flaschen"),
    ("chairs", "Stühle"),
    ("letters", "Briefe"),
    ("flowers", "Blumen"),
    ("tickets", "Fahrkarten"),
    ("eggs", "Eier"),
    ("pencils", "Bleistifte"),
    ("tables", "Tische"),
)
_PLACES = (
    ("in the box", "In der Kiste"),
    ("in the garden", "Im Garten"),
    ("on the table", "Auf dem Tisch"),
    ("in the kitchen", "In der Küche"),
    ("in the car", "Im Auto"),
)
# Dative plural units for "seit ...".
_UNITS = (
    ("minutes", "Minuten"),
    ("hours", "Stunden"),
    ("days", "Tagen"),
    ("weeks", "Wochen"),
    ("months", "Monaten"),
    ("years", "Jahren"),
)
_PRICED = (
    ("book", "Das Buch"),
    ("bicycle", "Das Fahrrad"),
    ("lamp", "Die Lampe"),
    ("coat", "Der Mantel"),
    ("ticket", "Die Fahrkarte"),
    ("watch", "Die Uhr"),
)
# Singular nouns with their German nominative article, for ordinals.
_ORDINAL_NOUNS = (
    ("day", "Tag", "der"),
    ("week", "Woche", "die"),
    ("year", "Jahr", "das"),
    ("question", "Frage", "die"),
    ("house", "Haus", "das"),
    ("chapter", "Kapitel", "das"),
    ("street", "Straße", "die"),
    ("attempt", "Versuch", "der"),
    ("page", "Seite", "die"),
    ("train", "Zug", "der"),
    ("room", "Zimmer", "das"),
    ("song", "Lied", "das"),
)
_ADJECTIVES = (
    ("long", "lang"),
    ("short", "kurz"),
    ("new", "neu"),
    ("old", "alt"),
    ("easy", "einfach"),
    ("difficult", "schwierig"),
    ("beautiful", "schön"),
)
# Prepositional phrases with a dative ordinal ("{}" = ordinal; German takes the -en ending).
_DATIVE_PHRASES = (
    ("on the {} day", "am {} Tag"),
    ("in the {} week", "in der {} Woche"),
    ("in the {} year", "im {} Jahr"),
    ("in the {} chapter", "im {} Kapitel"),
    ("on the {} page", "auf der {} Seite"),
    ("on the {} attempt", "beim {} Versuch"),
    ("in the {} room", "im {} Zimmer"),
    ("on the {} floor", "im {} Stock"),
)
_DATIVE_FRAMES = (
    ("It happened {}.", "Es geschah {}."),
    ("We found it {}.", "Wir fanden es {}."),
    ("She succeeded {}.", "Sie hatte {} Erfolg."),
    ("He stopped {}.", "Er hörte {} auf."),
)
_DATE_FRAMES = (
    ("The meeting is on {}.", "Das Treffen ist am {}."),
    ("The concert is on {}.", "Das Konzert ist am {}."),
    ("I was born on {}.", "Ich wurde am {} geboren."),
    ("She was born on {}.", "Sie wurde am {} geboren."),
    ("The train leaves on {}.", "Der Zug fährt am {} ab."),
    ("The letter arrived on {}.", "Der Brief kam am {} an."),
    ("We moved to Berlin on {}.", "Wir sind am {} nach Berlin gezogen."),
)
_DAY_FRAMES = (
    ("Today is {}.", "Heute ist {}."),
    ("Tomorrow is {}.", "Morgen ist {}."),
    ("Yesterday was {}.", "Gestern war {}."),
)
_MONTH_FRAMES = (
    ("Call me on the {} of {}.", "Ruf mich am {} {} an."),
    ("My birthday is on the {} of {}.", "Mein Geburtstag ist am {} {}."),
    ("School starts on the {} of {}.", "Die Schule beginnt am {} {}."),
)
_FIRST_DAY = datetime.date(1950, 1, 1).toordinal()
_LAST_DAY = datetime.date(2035, 12, 31).toordinal()


def _cardinal(rng: random.Random, low: int, high: int) -> tuple[str, str]:
    """Draws n in [low, high] usable before a plural noun; returns its English and German words."""
    while True:
        n = rng.randint(low, high)
        if n % 100 != 1:  # German "...eins Äpfel" is wrong; skip 101, 201, ...
            return num2words(n, lang="en"), num2words(n, lang="de")


def _ordinal(rng: random.Random, low: int = 1, high: int = 100) -> tuple[str, str, str]:
    """Returns an ordinal as (English, German "dritte", German "dritten").

    The German forms are the weak adjective endings after a definite article: "-e" in the
    nominative, "-en" in the dative (and the masculine accusative).
    """
    n = rng.randint(low, high)
    german = num2words(n, to="ordinal", lang="de")
    return num2words(n, to="ordinal", lang="en"), german, german + "n"


def _date(rng: random.Random, style: str = "long") -> tuple[str, str]:
    day = datetime.date.fromordinal(rng.randint(_FIRST_DAY, _LAST_DAY))
    return (
        babel_dates.format_date(day, style, locale="en"),
        babel_dates.format_date(day, style, locale="de"),
    )


def _subject_verb(
    rng: random.Random, english: tuple[str, str], german: tuple[str, str, str, str]
) -> tuple[str, str, str, str]:
    """Draws a subject; returns (subject, English verb, German subject, German verb) agreeing."""
    subject, subject_de, person = rng.choice(_SUBJECTS)
    verb = english[1] if subject in ("He", "She") else english[0]
    return subject, verb, subject_de, german[person]


def _have_things(rng: random.Random) -> Pair:
    english, german = rng.choice(_VERBS)
    subject, verb, subject_de, verb_de = _subject_verb(rng, english, german)
    n, n_de = _cardinal(rng, 2, 999)
    noun, noun_de = rng.choice(_PLURALS)
    return f"{subject} {verb} {n} {noun}.", f"{subject_de} {verb_de} {n_de} {noun_de}."


def _things_in_place(rng: random.Random) -> Pair:
    n, n_de = _cardinal(rng, 2, 999)
    noun, noun_de = rng.choice(_PLURALS)
    place, place_de = rng.choice(_PLACES)
    return f"There are {n} {noun} {place}.", f"{place_de} sind {n_de} {noun_de}."


def _age(rng: random.Random) -> Pair:
    subject, be, subject_de, be_de = _subject_verb(rng, ("are", "is"), _TO_BE)
    be = "am" if subject == "I" else be
    n, n_de = _cardinal(rng, 2, 110)
    return f"{subject} {be} {n} years old.", f"{subject_de} {be_de} {n_de} Jahre alt."


def _waiting(rng: random.Random) -> Pair:
    subject, have, subject_de, wait_de = _subject_verb(rng, ("have", "has"), _WAIT)
    n, n_de = _cardinal(rng, 2, 99)
    unit, unit_de = rng.choice(_UNITS)
    return (
        f"{subject} {have} been waiting for {n} {unit}.",
        f"{subject_de} {wait_de} seit {n_de} {unit_de}.",
    )


def _price(rng: random.Random) -> Pair:
    thing, thing_de = rng.choice(_PRICED)
    n, n_de = _cardinal(rng, 2, 999)
    return f"The {thing} costs {n} euros.", f"{thing_de} kostet {n_de} Euro."


def _bought_on_date(rng: random.Random) -> Pair:
    subject, bought, subject_de, bought_de = _subject_verb(rng, ("bought", "bought"), _BOUGHT)
    n, n_de = _cardinal(rng, 2, 99)
    noun, noun_de = rng.choice(_PLURALS)
    day, day_de = _date(rng)
    # German is verb-second: the date moves in front of the object.
    return (
        f"{subject} {bought} {n} {noun} on {day}.",
        f"{subject_de} {bought_de} am {day_de} {n_de} {noun_de}.",
    )


def _event_on_date(rng: random.Random) -> Pair:
    frame, frame_de = rng.choice(_DATE_FRAMES)
    day, day_de = _date(rng)
    return frame.format(day), frame_de.format(day_de)


def _weekday(rng: random.Random) -> Pair:
    frame, frame_de = rng.choice(_DAY_FRAMES)
    day, day_de = _date(rng, "full")
    return frame.format(day), frame_de.format(day_de)


def _this_is_ordinal(rng: random.Random) -> Pair:
    noun, noun_de, article = rng.choice(_ORDINAL_NOUNS)
    nth, nth_de, _ = _ordinal(rng)
    return f"This is the {nth} {noun}.", f"Das ist {article} {nth_de} {noun_de}."


def _ordinal_adjective(rng: random.Random) -> Pair:
    noun, noun_de, article = rng.choice(_ORDINAL_NOUNS)
    adjective, adjective_de = rng.choice(_ADJECTIVES)
    nth, nth_de, _ = _ordinal(rng)
    return (
        f"The {nth} {noun} is {adjective}.",
        f"{article.capitalize()} {nth_de} {noun_de} ist {adjective_de}.",
    )


def _ordinal_dative(rng: random.Random) -> Pair:
    frame, frame_de = rng.choice(_DATIVE_FRAMES)
    phrase, phrase_de = rng.choice(_DATIVE_PHRASES)
    nth, _, nth_dative = _ordinal(rng)
    return frame.format(phrase.format(nth)), frame_de.format(phrase_de.format(nth_dative))


def _day_of_month(rng: random.Random) -> Pair:
    frame, frame_de = rng.choice(_MONTH_FRAMES)
    month = rng.randint(1, 12)
    # Last day of the month in a non-leap year: the day before the 1st of the next month.
    next_month = datetime.date(2001 + month // 12, month % 12 + 1, 1)
    days_in_month = (next_month - datetime.timedelta(days=1)).day
    nth, _, nth_dative = _ordinal(rng, 1, days_in_month)
    month_en = babel_dates.get_month_names("wide", locale="en")[month]
    month_de = babel_dates.get_month_names("wide", locale="de")[month]
    return frame.format(nth, month_en), frame_de.format(nth_dative, month_de)


def _place_in_race(rng: random.Random) -> Pair:
    subject, took, subject_de, took_de = _subject_verb(rng, ("took", "took"), _TOOK)
    nth, _, nth_accusative = _ordinal(rng, 1, 50)  # masculine accusative: "den dritten Platz"
    return f"{subject} {took} {nth} place.", f"{subject_de} {took_de} den {nth_accusative} Platz."


TEMPLATES: tuple[Callable[[random.Random], Pair], ...] = (
    _have_things,
    _things_in_place,
    _age,
    _waiting,
    _price,
    _bought_on_date,
    _event_on_date,
    _weekday,
    _this_is_ordinal,
    _ordinal_adjective,
    _ordinal_dative,
    _day_of_month,
    _place_in_race,
)
