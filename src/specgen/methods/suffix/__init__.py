"""The suffix method: its drafter module registers it as `--method suffix`
(`specgen.methods.registered` imports it on first use)."""
