"""Drafters: cheap proposals of the next few tokens, all verified by the target."""

from decoding.drafters.base import Drafter, Proposal
from decoding.drafters.composite import CompositeDrafter
from decoding.drafters.draft_model import DraftModelDrafter
from decoding.drafters.fallback import FallbackDrafter
from decoding.drafters.grammar_forced import GrammarForcedDrafter
from decoding.drafters.head import HeadDrafter
from decoding.drafters.ngram import NgramDrafter

__all__ = [
    "CompositeDrafter", "DraftModelDrafter", "Drafter", "FallbackDrafter", "GrammarForcedDrafter", "HeadDrafter",
    "NgramDrafter", "Proposal",
]
