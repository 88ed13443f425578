"""The dflash2 method: its drafter module registers it as `--method dflash2`
(`specgen.methods.registered` imports it on first use)."""
