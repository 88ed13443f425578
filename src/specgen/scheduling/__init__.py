"""What to draft and how much of it to verify: decisions from what earlier steps showed
(never from the tokens being judged, so they cannot bias the output) and measured costs."""
