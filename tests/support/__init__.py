"""What tests share besides fixtures: builders of tiny checkpoints, writers of files in
other tools' formats, test drafters and servers, statistics. Fixtures stay in
`conftest.py`; reference implementations used as oracles live in `tests/oracles/`."""
