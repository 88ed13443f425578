"""Decoding loops: the AR baseline now; the speculative loop and overlap loop build on it."""
