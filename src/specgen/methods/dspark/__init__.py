"""The dspark method: its drafter module registers it as `--method dspark`
(`specgen.methods.registered` imports it on first use)."""
