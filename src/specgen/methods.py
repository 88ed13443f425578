"""Plain decoding's name among the methods: `--method ar`, the key of every speedup's baseline.

Every other method is a drafter registered in `specgen.drafting.DRAFTERS`; plain decoding
has no drafter to register, so its one name lives here, below every module that says it
(the config, the stats, the bench reports)."""

AR = "ar"
