"""Assemble an `Engine` from names: a target spec, a drafter list, a draft (a model or a draft head)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from decoding.draft_head import DraftHead, is_head_file, load_head
from decoding.drafters import (
    CompositeDrafter,
    Drafter,
    DraftModelDrafter,
    FallbackDrafter,
    GrammarForcedDrafter,
    HeadDrafter,
    NgramDrafter,
)
from decoding.drafters.head_tree import TreeShape
from decoding.drafts import shipped_draft
from decoding.errors import ModelLoadError, UnknownDrafterError
from decoding.generate import Engine
from decoding.loading import EMBEDDED, LoadedModel, check_same_tokenizer, load_model
from decoding.pass_costs import pass_costs

DRAFTER_NAMES = ("grammar", "ngram", "draft")
# a model's draft chain stops before a token it gives less than this (drafters/chain.py): on the bench
# workload 0.3 beat 0.2 and 0.4, and no cut, for the shipped draft head
MIN_DRAFT_PEAK = 0.3
# a draft head catches up over at most this many of the context's latest pairs (drafters/head.py): a
# session's first request read ~2,000-2,700 prompt pairs in 60-170 ms, ~10 ms at 512, and n-gram lookup
# alone was faster there (decoding/drafts/README.md, "The head's reach")
HEAD_REACH = 512

Draft = LoadedModel | DraftHead


def check_drafter_names(names: Sequence[str]) -> None:
    """Refuse a drafter name that is not one of DRAFTER_NAMES (before anything loads)."""
    for name in names:
        if name not in DRAFTER_NAMES:
            raise UnknownDrafterError(f"unknown drafter {name!r} (known: {', '.join(DRAFTER_NAMES)})")


def load_draft(spec: str | None, target: LoadedModel, dtype: str = "auto") -> Draft | None:
    """A draft for `target`: "embedded" (or None) is the draft head shipped for it, if any; a draft-head
    `.safetensors` file from `draftgate distill`; otherwise a draft model (.gguf or HF directory)."""
    if spec is None or spec == EMBEDDED:
        path = shipped_draft(target.name)
        if path is None:
            if spec is None:
                return None
            raise ModelLoadError(f"draftgate ships no draft for target {target.name!r}: give a draft path")
        return load_head_for(path, target)
    if is_head_file(spec):
        return load_head_for(Path(spec), target)
    if spec.endswith(".safetensors") and Path(spec).is_file():  # a lone weights file: a head or nothing
        raise ModelLoadError(f"{spec}: not a draftgate draft head (a head from `draftgate distill` carries its "
                             "metadata); a draft model is a .gguf file or a HF model directory")
    draft = load_model(spec, dtype)
    check_same_tokenizer(target, draft)
    return draft


def load_head_for(path: Path, target: LoadedModel) -> DraftHead:
    """Load a draft head on the target's embeddings and LM head, ready to decode in the target's dtype."""
    model = target.model
    head = load_head(path, model.tok_embeddings.weight.detach(), model.output.weight.detach(),
                     target.tokenizer.fingerprint())
    beyond = [i for i in head.config.feature_layers if not 0 <= i < model.args.n_layers]
    if beyond:
        raise ModelLoadError(f"{path}: the head reads target blocks {beyond}, the target has {model.args.n_layers}")
    return head.prepare_inference(model.dtype)


def draft_drafter(draft: Draft, target: LoadedModel, max_draft_tokens: int, tree: TreeShape | None = None) -> Drafter:
    """A drafter for `draft`; a draft head drafts a `tree` per pass where one is given, else a chain."""
    if isinstance(draft, DraftHead):
        return HeadDrafter(draft, max_tokens=max_draft_tokens, min_peak=MIN_DRAFT_PEAK, tree=tree, reach=HEAD_REACH)
    check_same_tokenizer(target, draft)
    if draft.model.args.vocab_size != target.model.args.vocab_size:
        raise ModelLoadError(
            f"{draft.source}: draft vocabulary {draft.model.args.vocab_size} != "
            f"target vocabulary {target.model.args.vocab_size}"
        )
    return DraftModelDrafter(draft.model, max_tokens=max_draft_tokens, min_peak=MIN_DRAFT_PEAK)


def build_drafter(names: list[str], target: LoadedModel, draft: Draft | None, max_draft_tokens: int,
                  tree: TreeShape | None = None, sampled_draft: bool = False) -> Drafter | None:
    """Drafters in the order given; "draft" needs a draft (a model with the target's tokenizer, or a draft
    head trained for the target); "grammar" proposes the tokens a grammar forces (nothing without one).

    The drafters are alternatives, tried in order each pass (drafters/fallback.py); the grammar's forced
    tokens go first, and a free drafter listed next (n-gram lookup) continues after them:
    `[grammar, ngram, draft]` proposes the forced tokens and an n-gram match after them, and where there
    is neither, the draft's chain. A model drafter never continues after other drafters' tokens: it
    would pay one step per token to catch up, and drafts far better once the target has verified them
    (measured: `draftgate bench`, constrained). Behind another drafter, the draft proposes for sampled
    requests (temperature > 0) only with `sampled_draft` (drafters/fallback.py); a lone draft always
    does."""
    check_drafter_names(names)
    forced: Drafter | None = None
    drafters: list[Drafter] = []
    for name in names:
        if name == "grammar":  # proposes only under a grammar; a no-op otherwise
            forced = GrammarForcedDrafter(target.tokenizer)
        elif name == "ngram":
            drafters.append(NgramDrafter(max_tokens=max_draft_tokens))
        elif name == "draft":
            if draft is None:
                raise ModelLoadError(f"drafter 'draft' needs a draft model (none was given, and draftgate "
                                     f"ships none for {target.name!r})")
            drafters.append(draft_drafter(draft, target, max_draft_tokens, tree))
    if forced is not None:
        if drafters and drafters[0].cost_per_token == 0.0:
            drafters[0] = CompositeDrafter([forced, drafters[0]])
        else:
            drafters.insert(0, forced)
    if not drafters:
        return None
    return drafters[0] if len(drafters) == 1 else FallbackDrafter(drafters, sampled_models=sampled_draft)


def build_engine(
    target: str = "embedded",
    drafters: tuple[str, ...] | None = None,
    draft: str | None = None,
    dtype: str = "auto",
    max_draft_tokens: int = 8,
    with_grammar: bool = False,
    draft_tree: bool = True,
    fit: bool = True,
    sampled_tree: bool = False,
    sampled_draft: bool = False,
) -> Engine:
    """`drafters` None: n-gram, plus the draft when there is one (given, or shipped for the target);
    `with_grammar` puts the grammar-forced drafter first (for constrained requests); `draft_tree`: a
    draft head drafts a tree per pass (TreeShape's default), else a chain; `sampled_draft`: the draft
    drafts sampled requests too, behind n-gram lookup (else n-gram lookup alone drafts them);
    `sampled_tree` (implies `sampled_draft`): a tree drawn from q there, else the chain. `max_draft_tokens` is a
    bound: with `fit`, n-gram lookup and the draft propose fewer a pass where this machine's bigger
    passes cost more than they are expected to earn (fit_to_machine)."""
    target_model = load_model(target, dtype)
    wants_draft = drafters is None or "draft" in drafters
    draft_model = load_draft(draft, target_model, dtype) if wants_draft else None
    if drafters is None:
        drafters = ("ngram", "draft") if draft_model is not None else ("ngram",)
    if with_grammar and "grammar" not in drafters:
        drafters = ("grammar", *drafters)
    tree = TreeShape(sampled=sampled_tree) if draft_tree else None
    drafter = build_drafter(list(drafters), target_model, draft_model, max_draft_tokens, tree,
                            sampled_draft=sampled_draft or sampled_tree)
    if fit and drafter is not None:
        fit_to_machine(target_model, drafter)
    return Engine(target_model, drafter, max_draft_tokens=max_draft_tokens)


def fit_to_machine(target: LoadedModel, drafter: Drafter) -> Drafter:
    """Size `drafter`'s proposals by what the target's passes cost on this machine and what each request
    accepts (decoding/pass_costs.py: measured once per model, ~5 s; adaptive.DraftLength)."""
    drafter.fit(pass_costs(target.model))
    return drafter
