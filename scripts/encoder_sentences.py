"""The 100 sentences the encoders are checked on (scripts/make_encoder_goldens.py, tests/test_encoders.py).

Mixed lengths, from one token to about two hundred (the long ones are the short ones joined in a fixed
order), in several scripts and languages, with accents, CJK, emoji, code, numbers and odd white space, so
WordPiece's normaliser (lower-casing, accent stripping, punctuation and CJK splitting, unknown words)
and the encoders' attention over long inputs are all exercised. Plain data: nothing here imports Llamba
or llama.cpp, so both sides read the same texts.
"""

from __future__ import annotations

BASE = [
    "x",
    "Hello",
    "?",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors; similar texts land close together.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Cats are carnivores and eat mostly meat.",
    "A healthy cat diet includes protein from fish or chicken.",
    "The stock market fell sharply on Monday after the announcement.",
    "Quantum computers use qubits, which can be in superpositions of states.",
    "def add(a, b):\n    return a + b\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "The meeting is at 3:30 p.m. on 2024-05-17 in room 4B (second floor).",
    "Pi is approximately 3.14159, and e is about 2.71828.",
    "Café, naïve, résumé, façade, jalapeño and crème brûlée.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "¿Dónde está la biblioteca? Está cerca de la estación.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "東京は日本の首都です。",
    "我爱自然语言处理和机器学习。",
    "한국어 문장도 토큰화됩니다.",
    "مرحبا بالعالم، هذه جملة عربية.",
    "नमस्ते दुनिया, यह एक हिंदी वाक्य है।",
    "I ❤️ emoji 🚀🌍 and symbols like © ® ™ € £ ¥.",
    "ﬁnancial ligatures, ½ fractions, ² superscripts and Ⅷ numerals",
    "Tabs\tand\nnewlines\r\nand   multiple    spaces.",
    "URL: https://example.com/path?query=1&lang=en#section",
    "e-mail me at someone@example.org — or don't!",
    "It's a dog's life; they're here, we've gone, you'll see, I'd say.",
    "HTML <b>bold</b> &amp; <i>italic</i> tags.",
    "Mr. Smith paid $1,234.56 for 7 apples, i.e. about $176.37 each.",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "The mitochondria is the powerhouse of the cell.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong stepped out first.",
    "To be, or not to be, that is the question.",
    "Kittens drink their mother's milk for the first weeks.",
    "Ça va? Oui, très bien, merci beaucoup!",
    "São Paulo é a maior cidade do Brasil.",
    "Zażółć gęślą jaźń.",
    "Ω≈ç√∫˜µ≤≥÷ åß∂ƒ©˙∆˚¬…æ",
    "ÀÉÎÕÜ àéîõü ÇÑ çñ",
    "null\u0000byte and zero\u200bwidth space",
    "The [CLS] and [SEP] tokens are special in BERT.",
    "rain, rain, go away; come again another day",
    "Machine learning models learn patterns from data without being explicitly programmed.",
    "A transformer encoder reads the whole input at once, each token attending to every other token.",
]


def _long(i: int, n_parts: int) -> str:
    """A long input: n_parts base sentences from index i on, joined by a space (wrapping around)."""
    return " ".join(BASE[(i + k * 7) % len(BASE)] for k in range(n_parts))


def sentences() -> list[str]:
    """The 100 inputs: the 50 base sentences, then 50 joins of 2 to 16 of them (up to ~200 tokens)."""
    joined = [_long(i, 2 + (i * 5) % 15) for i in range(50)]
    return BASE + joined
