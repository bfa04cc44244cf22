"""The generate loop: prefill, then decode — one token per target pass, or speculatively several.

After gpt-fast's `generate.py`. Each step feeds the last emitted token (not yet in the KV cache) plus the
drafter's k proposals to the target in one forward pass at position `pos`, giving k + 1 next-token
distributions; the verifier keeps a prefix of the drafts and adds one token of its own. Cache entries
past the kept tokens are stale and are overwritten by the next pass: rollback is free.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import torch

from decoding.adaptive import ControllerConfig, SpeculationController
from decoding.constraints.base import Grammar, GrammarFactory, TimedGrammar
from decoding.drafters.base import Drafter, Proposal
from decoding.errors import ContextLengthError, InvalidRequestError
from decoding.loading import LoadedModel
from decoding.rejection_sampler import rejection_sample, verify_greedy
from decoding.sampling import SamplingParams, next_token, processed_probs
from decoding.stats import SpecStats
from decoding.stopping import StopChecker
from decoding.tokenizer import IncrementalDetokenizer
from decoding.tree import TokenTree, verify_tree
from decoding.tree_sampling import verify_sampled_tree


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    speculative: bool = True
    ignore_eos: bool = False
    # a compiled grammar (JSON schema, tool call): every token is sampled under its mask
    grammar: GrammarFactory | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise InvalidRequestError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop sequences must be non-empty strings")


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # every generated token, EOS included when it ended the generation
    finish_reason: str  # "stop" (EOS or a stop sequence) or "length"
    prompt_tokens: int
    stats: SpecStats
    prefill_s: float = 0.0  # time to the first token
    decode_s: float = 0.0  # time from the first token to the last

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


class Generation:
    """A running generation: iterate for text deltas (never a split UTF-8 character); then `.result`.

    Closing it early (or breaking out of the loop) stops the decode loop: a client that disconnects
    cancels its generation.
    """

    def __init__(self, engine: Engine, prompt: list[int], config: GenerationConfig) -> None:
        self.engine = engine
        self.prompt = prompt
        self.config = config
        self.stats = SpecStats()
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self._result: GenerationResult | None = None
        self._started = time.perf_counter()
        self._first_token_at: float | None = None
        self._iter = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def __next__(self) -> str:
        return next(self._iter)

    def close(self) -> None:
        self._iter.close()

    @property
    def result(self) -> GenerationResult:
        if self._result is None:
            for _ in self._iter:
                pass
        assert self._result is not None
        return self._result

    def _run(self) -> Generator[str, None, None]:
        tokenizer = self.engine.target.tokenizer
        eos = frozenset() if self.config.ignore_eos else tokenizer.eos_token_ids
        detok = IncrementalDetokenizer(tokenizer, self.prompt)
        stops = StopChecker(self.config.stop)
        emitted_chars = 0
        steps = self.engine.decode_tokens(self.prompt, self.config, self.stats)
        try:
            for new in steps:
                if self._first_token_at is None:
                    self._first_token_at = time.perf_counter()
                # token by token, as target-only decoding sees them: a pass's tokens past an end of turn
                # or past the token that completes a stop sequence are neither text nor usage
                for token in new:
                    self.token_ids.append(token)
                    if token in eos:
                        self.finish_reason = "stop"
                    else:
                        self.text += detok.push([token])
                    if self.finish_reason is not None or len(self.token_ids) >= self.config.max_new_tokens:
                        self.finish_reason = self.finish_reason or "length"
                        self.text += detok.flush()
                    cut = stops.find(self.text, emitted_chars)
                    if cut is not None:
                        self.text, self.finish_reason = self.text[:cut], "stop"
                    if self.finish_reason is not None:
                        break
                safe = len(self.text) if self.finish_reason else stops.safe_length(self.text)
                if safe > emitted_chars:
                    yield self.text[emitted_chars:safe]
                    emitted_chars = safe
                if self.finish_reason is not None:
                    break
            if self.finish_reason is None:  # max_new_tokens == 0
                self.finish_reason = "length"
        finally:
            steps.close()
            now = time.perf_counter()
            first = self._first_token_at or now
            self._result = GenerationResult(
                text=self.text,
                token_ids=self.token_ids,
                finish_reason=self.finish_reason or "cancelled",
                prompt_tokens=len(self.prompt),
                stats=self.stats,
                prefill_s=first - self._started,
                decode_s=now - first,
            )


class Engine:
    """A target model, optionally a drafter, and the decode loop. One request at a time."""

    def __init__(
        self,
        target: LoadedModel,
        drafter: Drafter | None = None,
        max_draft_tokens: int = 8,
        controller: ControllerConfig | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.max_draft_tokens = max_draft_tokens
        self.controller_config = controller or ControllerConfig()
        # what this engine left in the model's cache: (the model's cache_version after its last pass, the
        # tokens at positions [0, n), the drafter that read their features or None)
        self._left: tuple[int, list[int], Drafter | None] | None = None
        self.reuse_prefixes = True  # read a prompt's cached prefix instead of recomputing it, where exact

    def reusable_prefix(self, prompt: list[int], reader: Drafter | None) -> int:
        """How many of the prompt's first tokens the cache already holds, exactly as a pass over the
        prompt would write them: the tokens this engine's previous request left there, if no other pass
        or new cache came since, on a model whose passes are split-invariant (Transformer.split_invariant),
        and, for a drafter that reads the target's features, only if it read those positions' (it keeps
        them). The last prompt token is always read again: its pass gives the first logits."""
        model = self.target.model
        if not (self.reuse_prefixes and self._left is not None and model.split_invariant):
            return 0
        version, left, left_reader = self._left
        if version != model.cache_version or (reader is not None and left_reader is not reader):
            return 0  # another pass came since, or the features this request's drafter reads were not kept
        n = 0
        for a, b in zip(left, prompt[:-1], strict=False):  # the last prompt token is read again
            if a != b:
                break
            n += 1
        return n

    @property
    def max_context(self) -> int:
        return self.target.model.args.max_seq_len

    def generate(self, prompt: list[int], config: GenerationConfig) -> Generation:
        """Start generating after `prompt` token ids; iterate the result for text deltas."""
        if not prompt:
            bos = self.target.tokenizer.bos_token_id
            if bos is None:
                raise InvalidRequestError("empty prompt and the tokenizer has no BOS token to start from")
            prompt = [bos]
        self.check_length(prompt, config)
        return Generation(self, list(prompt), config)

    def check_length(self, prompt: list[int], config: GenerationConfig, limit_field: str = "max_tokens") -> None:
        """Refuse up front a prompt plus max new tokens that the context cannot hold: the prompt's fault
        when it leaves no room for one new token, else the limit's (`limit_field`: the request's name
        for it)."""
        size = max(len(prompt), 1)
        if size + 1 > self.max_context:
            raise ContextLengthError(f"the prompt is {len(prompt)} tokens: the context of {self.max_context} "
                                     "leaves no room for a reply", param="messages")
        if size + config.max_new_tokens > self.max_context:
            raise ContextLengthError(
                f"prompt of {len(prompt)} tokens plus {limit_field} {config.max_new_tokens} exceeds the context of "
                f"{self.max_context}: at most {self.max_context - size} new tokens fit", param=limit_field)

    def complete(self, prompt: list[int], config: GenerationConfig) -> GenerationResult:
        return self.generate(prompt, config).result

    def decode_tokens(
        self, prompt: list[int], config: GenerationConfig, stats: SpecStats
    ) -> Generator[list[int], None, None]:
        """Yield the tokens each target pass emits (1 without speculation, accepted + 1 with it)."""
        budget = config.max_new_tokens
        if budget == 0:
            return
        model = self.target.model
        drafter = self.drafter if config.speculative else None
        k_max = self.max_draft_tokens if drafter is not None else 0
        need = len(prompt) + budget + max(k_max, drafter.max_nodes if drafter is not None else 0) + 1
        model.setup_cache(min(need, self.max_context))
        params = config.sampling
        gen = params.generator()
        controller = SpeculationController(self.controller_config, drafter.cost_per_token if drafter else 0.0)
        if drafter is not None:
            drafter.reset()
            drafter.prepare(min(need, self.max_context))

        grammar = TimedGrammar(config.grammar.new()) if config.grammar is not None else None
        tokens = list(prompt)
        reader = drafter if drafter is not None and drafter.uses_features else None  # reads target features
        cached = self.reusable_prefix(prompt, reader)  # positions [0, cached) are in the cache already
        self._left = None
        written = 0  # positions [0, written) of `tokens` are in the cache
        try:
            taps = reader.feature_layers if reader is not None else ()
            logits, hidden = model.forward_hidden(torch.tensor(tokens[cached:]), cached, last_only=True,
                                                  feature_layers=taps)  # [1, V], [P - cached, F]
            stats.target_passes += 1
            stats.cached_prompt_tokens = cached
            written = len(prompt)
            if reader is not None:  # the cached positions' features are the reader's from before
                reader.observe_features(cached, hidden)
            token = next_token(logits[-1], params, gen, grammar.allowed_mask() if grammar else None)
            if grammar is not None:
                grammar.accept(token)
            tokens.append(token)
            produced = 1
            yield [token]
            pos = len(tokens) - 1  # position of the last token, which is not in the cache yet

            while produced < budget:
                began = time.perf_counter()
                proposal = Proposal()
                # drafts beyond the budget or the cache would be wasted: each pass emits accepted + 1
                room = min(budget - produced - 1, self.max_context - pos - 1, k_max)
                if drafter is not None and room > 0:
                    if controller.should_speculate():
                        proposal = drafter.propose(tokens, room, params, gen, grammar)
                    else:
                        stats.paused_steps += 1
                if proposal.parents is not None and (grammar is not None or len(proposal) == 0):
                    # the tree walk applies no grammar mask: under a grammar its first branch is verified
                    # as a chain, which is masked; a tree of no nodes (a drafter's "a plain step pays
                    # more here") is a plain step, not a verify pass
                    proposal = proposal.chain()
                if proposal.parents is not None:  # a draft tree: one pass verifies every branch
                    emitted, kept = self._verify_tree(proposal, token, pos, params, gen, stats, controller, taps)
                    if reader is not None:
                        reader.observe_features(pos, kept)
                    tokens.extend(emitted)
                    pos += len(emitted)
                    written = pos
                    token = emitted[-1]
                    produced += len(emitted)
                    if drafter is not None:
                        drafter.observe_time(time.perf_counter() - began, len(emitted))
                    yield emitted
                    continue
                k = len(proposal)
                inp = torch.tensor([token, *proposal.tokens])  # [k + 1]
                logits, hidden = model.forward_hidden(inp, pos, feature_layers=taps)  # [k + 1, V], [k + 1, F]
                stats.target_passes += 1
                masks = grammar_masks(grammar, proposal.tokens) if grammar is not None else None  # [k + 1, V]
                if k == 0:
                    emitted = [next_token(logits[0], params, gen, None if masks is None else masks[0])]
                else:
                    if params.greedy:
                        masked = logits if masks is None else logits.masked_fill(~masks, float("-inf"))
                        verdict = verify_greedy(proposal.tokens, masked.argmax(-1).tolist())
                    else:
                        target_probs = processed_probs(logits, params, masks)  # [k + 1, V]
                        verdict = rejection_sample(proposal.tokens, proposal.probs, target_probs, gen)
                    emitted = [*proposal.tokens[: verdict.num_accepted], verdict.next_token]
                    assert drafter is not None
                    drafter.observe(k, verdict.num_accepted)
                    controller.observe(k, verdict.num_accepted, proposal.model_drafted)
                    stats.record(proposal.sources, verdict.num_accepted)
                if reader is not None:  # positions whose inputs were kept: the last token, the accepted drafts
                    reader.observe_features(pos, hidden[: len(emitted)])
                if grammar is not None:
                    for t in emitted:
                        grammar.accept(t)
                tokens.extend(emitted)
                pos += len(emitted)
                written = pos
                token = emitted[-1]
                produced += len(emitted)
                if drafter is not None:
                    drafter.observe_time(time.perf_counter() - began, len(emitted))
                yield emitted
        finally:
            if grammar is not None:
                stats.grammar_s += grammar.seconds
            if written:  # what the next request may find in the cache (reusable_prefix)
                self._left = (model.cache_version, tokens[:written], reader)

    def _verify_tree(self, proposal: Proposal, token: int, pos: int, params: SamplingParams,
                     gen: torch.Generator, stats: SpecStats, controller: SpeculationController,
                     taps: tuple[int, ...] = (),
                     ) -> tuple[list[int], torch.Tensor]:
        """Verify a draft tree rooted at `token` (position `pos`) -> (emitted tokens, the target's
        features (n, F) of the positions whose inputs were kept: the root, then the accepted nodes)."""
        assert proposal.parents is not None and self.drafter is not None
        model = self.target.model
        tree = TokenTree(proposal.tokens, proposal.parents)
        tree = tree.truncated(min(len(tree), model.max_seq_len - pos - 1))  # room in the cache
        inp = torch.tensor([token, *tree.tokens])  # [N + 1]
        logits, hidden = model.forward_hidden(inp, pos, tree=tree, feature_layers=taps)  # [N + 1, V], [N + 1, F]
        stats.target_passes += 1
        if proposal.probs is not None and not params.greedy:  # drawn from q: recursive rejection sampling
            target_probs = processed_probs(logits, params)  # [N + 1, V]
            verdict = verify_sampled_tree(tree, target_probs, proposal.probs[: len(tree)], gen)
        else:  # deterministic drafts: walk the tree along the target's draws
            verdict = verify_tree(tree, logits, params, gen)
        model.keep_path(pos, verdict.rows)
        n = verdict.num_accepted
        if verdict.tried:  # a sampled tree: how each node's candidates fared, before the summary
            self.drafter.observe_candidates(verdict.tried)
        self.drafter.observe(len(tree), n)
        controller.observe(len(tree), n, proposal.model_drafted)
        stats.record_tree(proposal.sources[0] if proposal.sources else "draft", len(tree), tree.depth, n)
        emitted = [*(int(inp[r]) for r in verdict.rows), verdict.next_token]
        return emitted, hidden[[0, *verdict.rows]]


def grammar_masks(grammar: Grammar, drafts: list[int]) -> torch.Tensor:
    """[k + 1, V] the grammar's mask after each prefix of the drafts; the grammar's state is unchanged."""
    rows = [grammar.allowed_mask()]
    for token in drafts:
        grammar.accept(token)
        rows.append(grammar.allowed_mask())
    grammar.rollback(len(drafts))
    return torch.stack(rows)
