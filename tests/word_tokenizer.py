"""A whitespace tokenizer with the small HF surface the index uses (vocab, fingerprint, batch call)."""


class WordTokenizer:
    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(words)}
        self.all_special_tokens = ["<eos>"]

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)

    def __call__(self, text, add_special_tokens=True):
        if isinstance(text, list):
            return {"input_ids": [[self.vocab[w] for w in t.split()] for t in text]}
        return {"input_ids": [self.vocab[w] for w in text.split()]}
