"""The mtp method: its drafter module registers it as `--method mtp`
(`specgen.methods.registered` imports it on first use)."""
