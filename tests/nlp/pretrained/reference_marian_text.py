"""The text side of `reference_marian.py`'s OPUS-MT folders: English-/German-like sentences
(accents, foreign scripts, placeholders, tags, quotes), the two SentencePiece models trained on
them, OPUS-MT's vocab.json and tokenizer files, and the strings whose tokenization and
detokenization the folders record (MarianTokenizer's, in `text_outputs`)."""

import io
import json

import numpy as np
import sentencepiece

SPM_PIECES = 320  # each SentencePiece model's size
LEFT_OUT = 5  # pieces of each spm model that vocab.json leaves out on purpose
LANGUAGE_CODES = (">>fra<<", ">>deu<<")  # in the shared vocab.json only, as multilingual OPUS-MT's

EN_WORDS = (
    "the a an this that my your our house car tree river city night day time year people man "
    "woman child friend teacher doctor student book letter table window door water bread coffee "
    "music game garden street station train school office market price is are was were be have "
    "has had do does did will would can could should may must go goes went see saw make made "
    "take took give gave find found think know want need open close read write send call come "
    "leave stay work play buy sell pay help new old good bad big small long short red green "
    "blue black white happy quiet early late and or but because if when while before after with "
    "without from into over under very not never always often today tomorrow yesterday here "
    "there now again please thanks file files user users error message page button settings "
    "download upload"
).split()
DE_WORDS = (
    "der die das ein eine dieser mein dein unser Haus Auto Baum Fluss Stadt Nacht Tag Zeit Jahr "
    "Leute Mann Frau Kind Freund Lehrer Arzt Student Buch Brief Tisch Fenster Tür Wasser Brot "
    "Kaffee Musik Spiel Garten Straße Bahnhof Zug Schule Büro Markt Preis ist sind war waren "
    "sein haben hat hatte macht machte wird würde kann könnte soll muss geht ging sieht sah "
    "nimmt nahm gibt gab findet fand denkt weiß will braucht öffnen schließen lesen schreiben "
    "schicken rufen kommen bleiben arbeiten spielen kaufen verkaufen zahlen helfen neu alt gut "
    "schlecht groß klein lang kurz rot grün blau schwarz glücklich ruhig früh spät und oder "
    "aber weil wenn während vor nach mit ohne von in über unter sehr nicht nie immer oft heute "
    "morgen gestern hier dort jetzt wieder bitte danke Größe Übung Äpfel Datei Dateien Benutzer "
    "Fehler Nachricht Seite Einstellungen herunterladen hochladen"
).split()
ACCENTED = {"en": ["café", "naïve", "résumé", "façade", "jalapeño", "Zürich", "São", "Ångström"],
            "de": ["Café", "Müller", "Köln", "Zürich", "Crème", "Señor", "Ørsted", "Łódź"]}
FOREIGN = ["привет", "мир", "спасибо", "καλημέρα", "κόσμε", "東京", "日本語", "北京", "مرحبا",
           "🙂", "👍"]
PLACEHOLDERS = ["%s", "%d", "{name}", "{0}", "%(count)d", "%(name)s", "{{user}}", "$1", "%1$s"]
TAGS = [("<b>", "</b>"), ("<i>", "</i>"), ('<a href="x">', "</a>"), ("<br/>", "")]
QUOTES = {"en": ('"', '"'), "de": ("„", "“")}
ASCII_LINE = "0 1 2 3 4 5 6 7 8 9 . , ; : ! ? ' \" ( ) [ ] { } < > / \\ - _ + = * & % $ # @ ~ ^ |"

SENTENCES = [  # the parity batch: clearly different lengths (5 to ~28 tokens with eos)
    "Hi.",
    "My house is old.",
    "The teacher and the doctor were here.",
    "Send %s to {name}!",
    "<b>The</b> %(count)d files were open.",
    "Привет! The café in Zürich is open; is that good?",
    "The doctor saw 3 people at the station, but the train was late!",
    "The students took the early train to the city, but the school was closed.",
]


def number(rng) -> str:
    forms = ["{}", "{}.{:02d}", "{},{:03d}", "{}%", "{}:{:02d}", "19{:02d}", "20{:02d}"]
    form = forms[rng.integers(len(forms))]
    return form.format(*(int(x) for x in rng.integers(0, 100, form.count("{"))))


def sentence(rng, lang: str) -> str:
    """A line of English- or German-like text with digits, placeholders, tags and other scripts."""
    vocab = EN_WORDS if lang == "en" else DE_WORDS
    words = []
    for _ in range(int(rng.integers(2, 16))):
        u = rng.random()
        if u < 0.06:
            words.append(number(rng))
        elif u < 0.10:
            words.append(PLACEHOLDERS[rng.integers(len(PLACEHOLDERS))])
        elif u < 0.13:
            words.append(ACCENTED[lang][rng.integers(len(ACCENTED[lang]))])
        elif u < 0.145:
            words.append(FOREIGN[rng.integers(len(FOREIGN))])
        else:  # Zipf-like: the frequent words become whole pieces
            weights = 1.0 / np.arange(2, len(vocab) + 2)
            words.append(vocab[rng.choice(len(vocab), p=weights / weights.sum())])
    words[0] = words[0][:1].upper() + words[0][1:]
    if rng.random() < 0.3 and len(words) > 3:
        words[int(rng.integers(1, len(words) - 1))] += ","
    if rng.random() < 0.12:
        i = int(rng.integers(len(words)))
        start, end = TAGS[rng.integers(len(TAGS))]
        words[i] = start + words[i] + end
    if rng.random() < 0.1:
        i = int(rng.integers(len(words)))
        words[i] = QUOTES[lang][0] + words[i] + QUOTES[lang][1]
    if rng.random() < 0.05:
        words[-1] = "(" + words[-1] + ")"
    return " ".join(words) + [".", ".", ".", "!", "?", "...", ":", ""][rng.integers(8)]


def corpus(rng, lang: str, n: int = 400) -> list:
    return [sentence(rng, lang) for _ in range(n)] + [ASCII_LINE] * 5


def train_spm(lines: list, path: str) -> sentencepiece.SentencePieceProcessor:
    """A unigram model with SentencePiece's default ids (unk 0, <s> 1, </s> 2): OPUS-MT's."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="unigram",
        vocab_size=SPM_PIECES, character_coverage=0.995, num_threads=1)
    with open(path, "wb") as f:
        f.write(model.getvalue())
    return sentencepiece.SentencePieceProcessor(model_file=path)


def pieces(spm, rng) -> tuple:
    """The spm model's pieces but <unk>/<s>/</s> and LEFT_OUT others, in a shuffled order."""
    kept = [spm.id_to_piece(i) for i in range(spm.get_piece_size())
            if not (spm.is_unknown(i) or spm.is_control(i))]
    left_out = set(rng.choice(kept[10:150], LEFT_OUT, replace=False))  # frequent enough to show up
    return [kept[i] for i in rng.permutation(len(kept)) if kept[i] not in left_out], left_out


def opus_vocab(middle: list, tc_big: bool = False) -> dict:
    """OPUS-MT's vocab.json: "</s>" 0, "<unk>" 1, the pieces, "<pad>" last; ``tc_big``: as the
    Tatoeba tc-big releases, "</s>" and "<unk>" among the pieces (eos far from 0)."""
    if tc_big:
        middle = list(dict.fromkeys(middle))
        third = len(middle) // 3
        middle = middle[:third] + ["<unk>"] + middle[third:2 * third] + ["</s>"] \
            + middle[2 * third:]
        vocab = {}
    else:
        vocab = {"</s>": 0, "<unk>": 1}
    for piece in middle:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def write_json(path: str, content) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, ensure_ascii=False, indent=2)


def write_tokenizer(folder: str, shared: bool, rng, tc_big: bool = False) -> tuple:
    """source.spm, target.spm, vocab.json (+ target_vocab.json), tokenizer_config.json."""
    source = train_spm(corpus(rng, "en"), f"{folder}/source.spm")
    target = train_spm(corpus(rng, "de"), f"{folder}/target.spm")
    source_pieces, source_out = pieces(source, rng)
    target_pieces, target_out = pieces(target, rng)
    if shared:
        seen = set(source_pieces)
        union = source_pieces + [p for p in target_pieces if p not in seen]
        middle = [p for p in union if p not in source_out | target_out] + list(LANGUAGE_CODES)
        source_vocab = target_vocab = opus_vocab(middle, tc_big)
    else:
        source_vocab, target_vocab = opus_vocab(source_pieces), opus_vocab(target_pieces)
        write_json(f"{folder}/target_vocab.json", target_vocab)
    write_json(f"{folder}/vocab.json", source_vocab)
    write_json(f"{folder}/tokenizer_config.json", {
        "source_lang": "en", "target_lang": "de", "separate_vocabs": not shared,
        "model_max_length": 512})
    write_json(f"{folder}/special_tokens_map.json",
               {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    return source_vocab, target_vocab


def tokenization_strings(rng) -> list:
    edge = [
        "", " ", "   leading spaces", "trailing spaces   ", "multiple    spaces   inside",
        "tab\there", "new\nline", "no\xa0break space", "ﬁne ligature", "ＦＵＬＬ ｗｉｄｔｈ １２３",
        "e\u0301 decomposed", "zero\u200bwidth", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 letters", "ภาษาไทย", "עברית",
        "emoji 🙂👍🏽🎉", "%s %d {name} %(count)d", "{0} and {1} of %1$s",
        "<b>bold</b> and <i>italic</i>", "a<br/>b", '<a href="x">link</a>', "100% sure",
        "1,234.56", "3.14159", "€5 £3 ¥7", "“quotes” ‘single’ «guillemets»", "— – -", "…",
        "C++ & C#", "user@example.com", "https://example.com/a?b=c&d=e", "...", "!!!",
        "???", "ALL CAPS SENTENCE", "MiXeD cAsE", "don't can't won't", "e.g. i.e. etc.",
        "Mr. Smith", "Straße, Größe, Äpfel, Übung", "Привет, мир!", "Καλημέρα κόσμε",
        "東京と北京", "مرحبا بالعالم", ">>fra<< Hello world", ">>deu<<Guten Tag", ">>fra<<",
        " >>fra<< after a space", "a >>fra<< b", ">>xyz<< unknown code", ">> not a code",
        ">>fra<< %s {name}", "<<fra>> reversed", "><", ">><<", ">>fra<<>>deu<< two codes",
        " ".join(EN_WORDS[i] for i in rng.integers(0, len(EN_WORDS), 90)) + ".",
    ]
    generated = [sentence(rng, "en") for _ in range(170)] + [sentence(rng, "de") for _ in range(40)]
    alphabet = sorted(set("".join(generated + edge)) | set("ЖЩΩλ字あ😀ñ\u00a0"))
    scrambled = ["".join(rng.choice(alphabet, int(rng.integers(1, 25)))) for _ in range(40)]
    texts = edge + generated + scrambled
    return [t for t in texts if not any(s in t for s in ("</s>", "<unk>", "<pad>", "<s>"))]


def text_outputs(tokenizer, target_size: int, rng) -> dict:
    texts = tokenization_strings(rng)
    sequences = []
    for _ in range(50):
        ids = rng.integers(0, target_size - 1, int(rng.integers(1, 21)))  # never pad
        ids[rng.random(len(ids)) < 0.08] = tokenizer.eos_token_id  # some eos
        ids[rng.random(len(ids)) < 0.08] = tokenizer.unk_token_id  # some unk
        sequences.append(ids.tolist())
    return {
        "tokenization": [{"text": t, "input_ids": tokenizer(t)["input_ids"]} for t in texts],
        "detokenization": [{"ids": ids, "text": tokenizer.decode(ids, skip_special_tokens=True),
                            "text_with_special": tokenizer.decode(ids)} for ids in sequences]}
