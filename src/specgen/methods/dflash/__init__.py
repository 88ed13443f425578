"""The dflash method: its drafter module registers it as `--method dflash`
(`specgen.methods.registered` imports it on first use)."""
