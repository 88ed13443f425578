"""The eagle3 method: its drafter module registers it as `--method eagle3`
(`specgen.methods.registered` imports it on first use)."""
