"""placeholder during development"""
from __future__ import annotations


def tokenizer_corpus():
    out = []
    for a in range(100):
        for b in range(100):
            out.append(f"{a}+{b}=")
            out.append(str(a + b))
    return out
