"""How many draft tokens to verify: pure decisions from estimates made before the tokens
they judge were seen by the target (so they never bias the output), and measured costs."""
