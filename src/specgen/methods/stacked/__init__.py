"""The stacked method: its drafter module registers it as `--method stacked`
(`specgen.methods.registered` imports it on first use)."""
