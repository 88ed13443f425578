"""The ngram method: its drafter module registers it as `--method ngram`
(`specgen.methods.registered` imports it on first use)."""
