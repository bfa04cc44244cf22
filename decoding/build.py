"""Assemble an `Engine` from names: a target spec, a drafter list, an optional draft model."""

from __future__ import annotations

from decoding.drafters import CompositeDrafter, Drafter, DraftModelDrafter, GrammarForcedDrafter, NgramDrafter
from decoding.errors import ModelLoadError
from decoding.generate import Engine
from decoding.loading import LoadedModel, check_same_tokenizer, load_model

DRAFTER_NAMES = ("grammar", "ngram", "draft")


def build_drafter(
    names: list[str], target: LoadedModel, draft: LoadedModel | None, max_draft_tokens: int
) -> Drafter | None:
    """Drafters in the order given; "draft" needs a draft model with the target's tokenizer; "grammar"
    proposes the tokens a grammar forces (nothing without one)."""
    drafters: list[Drafter] = []
    for name in names:
        if name == "grammar":  # proposes only under a grammar; a no-op otherwise
            drafters.append(GrammarForcedDrafter())
        elif name == "ngram":
            drafters.append(NgramDrafter(max_tokens=max_draft_tokens))
        elif name == "draft":
            if draft is None:
                raise ModelLoadError("drafter 'draft' needs a draft model (none was given)")
            check_same_tokenizer(target, draft)
            if draft.model.args.vocab_size != target.model.args.vocab_size:
                raise ModelLoadError(
                    f"{draft.source}: draft vocabulary {draft.model.args.vocab_size} != "
                    f"target vocabulary {target.model.args.vocab_size}"
                )
            drafters.append(DraftModelDrafter(draft.model, max_tokens=max_draft_tokens))
        else:
            raise ModelLoadError(f"unknown drafter {name!r} (known: {', '.join(DRAFTER_NAMES)})")
    if not drafters:
        return None
    return drafters[0] if len(drafters) == 1 else CompositeDrafter(drafters)


def build_engine(
    target: str = "embedded",
    drafters: tuple[str, ...] = ("ngram",),
    draft: str | None = None,
    dtype: str = "auto",
    max_draft_tokens: int = 8,
) -> Engine:
    target_model = load_model(target, dtype)
    draft_model = load_model(draft, dtype) if draft else None
    drafter = build_drafter(list(drafters), target_model, draft_model, max_draft_tokens)
    return Engine(target_model, drafter, max_draft_tokens=max_draft_tokens)
