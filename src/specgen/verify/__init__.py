"""The shared verifier every drafter plugs into (see rejection.py for the vocabulary)."""

from specgen.verify.rejection import Verdict, verify_draft

__all__ = ["Verdict", "verify_draft"]
