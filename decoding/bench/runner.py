"""Run every configuration on every prompt, interleaved, in one process; collect rows.

Configurations run prompt by prompt in turn (not one configuration after another), so a slow spell of
the machine hits all of them alike. Times include prompt processing, as the peers' numbers do.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from decoding.bench.baselines import HFRunner, LlamaCppRunner, llama_cpp_available
from decoding.bench.constrained import run_constrained
from decoding.bench.report import BenchReport, Divergence, Measurement, Row
from decoding.bench.workload import CATEGORIES, CONSTRAINED, BenchPrompt, load_workload
from decoding.build import Draft, build_drafter, draft_drafter, fit_to_machine, load_draft
from decoding.draft_head import DraftHead
from decoding.drafters import Drafter, NgramDrafter
from decoding.drafters.head_tree import TreeShape
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel, embedded_gguf_path, load_model
from decoding.pass_costs import pass_costs
from decoding.progress import progress
from decoding.sampling import SamplingParams
from decoding.stats import SpecStats

TARGET_ONLY = "engine target-only"


@dataclass(frozen=True)
class BenchOptions:
    quick: bool = False
    max_new_tokens: int = 128
    categories: tuple[str, ...] | None = None
    temperature: float = 0.0
    include_hf: bool = True
    dtype: str = "auto"
    draft: str | None = None  # None: the draft shipped for the target
    no_draft: bool = False
    seed: int = 0
    constrained_max_new_tokens: int = 256  # a tool call or a schema output runs to its end
    fit_to_machine: bool = True  # size proposals by this machine's pass costs (build.fit_to_machine)


# a configuration: prompt ids, max tokens, seed -> (generated tokens, speculative stats or None, seconds
# from the first token to the last or None where the peer does not say)
RunFn = Callable[[list[int], int, int], tuple[list[int], SpecStats | None, float | None]]


@dataclass
class Config:
    name: str
    run: RunFn
    reference: str | None  # whose greedy output this one must reproduce


def _engine_run(engine: Engine, speculative: bool, temperature: float) -> RunFn:
    def run(prompt: list[int], max_new_tokens: int, seed: int) -> tuple[list[int], SpecStats | None, float | None]:
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, sampling=SamplingParams(temperature=temperature, seed=seed),
            speculative=speculative,
        )
        result = engine.complete(prompt, config)
        return result.token_ids, result.stats, result.decode_s

    return run


def _some(drafter: Drafter | None) -> Drafter:
    assert drafter is not None, "a drafter list that is not empty builds a drafter"
    return drafter


def build_configs(target: LoadedModel, draft: Draft | None, options: BenchOptions) -> list[Config]:
    greedy = options.temperature == 0.0
    ref = TARGET_ONLY if greedy else None
    t = options.temperature

    def spec(drafter: Drafter) -> RunFn:
        return _engine_run(Engine(target, fit_to_machine(target, drafter) if options.fit_to_machine else drafter),
                           True, t)

    configs = [
        Config(TARGET_ONLY, _engine_run(Engine(target), False, t), None),
        Config("engine ngram", spec(NgramDrafter()), ref),
    ]
    if draft is not None:
        configs.append(Config("engine draft", spec(draft_drafter(draft, target, 8)), ref))
        # under sampling the composites keep the draft behind n-gram lookup (what sampled_draft turns on):
        # the gateway's default there is n-gram lookup alone, the "engine ngram" row
        composite = _some(build_drafter(["ngram", "draft"], target, draft, 8, sampled_draft=True))
        configs.append(Config("engine ngram+draft", spec(composite), ref))
        if isinstance(draft, DraftHead):  # a head can draft a tree per pass instead of a chain
            shape = TreeShape(sampled=not greedy)  # under sampling the engine drafts chains unless asked
            configs.append(Config("engine draft tree", spec(draft_drafter(draft, target, 8, shape)), ref))
            composite = _some(build_drafter(["ngram", "draft"], target, draft, 8, shape, sampled_draft=True))
            configs.append(Config("engine ngram+draft tree", spec(composite), ref))
    if options.include_hf and greedy:
        # HF's assisted generation runs a standalone draft model; a draft head has no HF form, so against
        # a head HF's best is prompt lookup
        standalone = draft if isinstance(draft, LoadedModel) else None
        hf = HFRunner(target, standalone)
        modes = ["generate", "prompt_lookup"] + (["assisted"] if standalone is not None else [])
        for mode in modes:
            def run(prompt: list[int], n: int, seed: int,
                    mode: str = mode) -> tuple[list[int], SpecStats | None, float | None]:
                return hf.generate(prompt, n, mode), None, None

            name = {"generate": "hf generate", "prompt_lookup": "hf prompt-lookup", "assisted": "hf assisted"}[mode]
            # HF computes in its own bf16 numerics (bf16 attention and residual), so its reference is
            # its own plain generate; "hf generate" itself is a different computation of the same model
            configs.append(Config(name, run, None if mode == "generate" else "hf generate"))
    if greedy and llama_cpp_available() and target.name == "smollm2-135m":
        cpp = LlamaCppRunner(str(embedded_gguf_path()))
        eos = target.tokenizer.eos_token_ids

        def run_cpp(prompt: list[int], n: int, seed: int) -> tuple[list[int], SpecStats | None, float | None]:
            return cpp.generate(prompt, n, eos), None, None

        configs.append(Config("llama.cpp (Q4_1)", run_cpp, None))  # other kernels, other numerics
    return configs


def first_divergence(
    target: LoadedModel, prompt: BenchPrompt, ids: list[int], reference: list[int], tokens: list[int]
) -> Divergence | None:
    """Where `tokens` leaves `reference`, and the target's logit gap between the two choices there."""
    n = min(len(reference), len(tokens))
    j = next((i for i in range(n) if reference[i] != tokens[i]), None)
    if j is None:
        if len(reference) == len(tokens):
            return None
        # the same tokens, but one output is longer: no logit gap to speak of, so never a near-tie
        longer = reference if len(reference) > n else tokens
        ref_token, token = (longer[n], -1) if longer is reference else (-1, longer[n])
        return Divergence(prompt.id, n, ref_token, token, float("inf"))
    model = target.model
    context = ids + reference[:j]
    model.setup_cache(len(context) + 1)
    logits = model(torch.tensor(context), 0, last_only=True)[-1]  # [V]
    gap = float(logits[reference[j]] - logits[tokens[j]])
    return Divergence(prompt.id, j, reference[j], tokens[j], gap)


def run_bench(options: BenchOptions) -> BenchReport:
    torch.manual_seed(options.seed)
    target = load_model("embedded", options.dtype)
    draft = None if options.no_draft else load_draft(options.draft, target, options.dtype)
    wanted = options.categories or (*CATEGORIES, CONSTRAINED)
    plain = tuple(c for c in wanted if c != CONSTRAINED)
    constrained = None
    if CONSTRAINED in wanted:
        constrained = run_constrained(target, draft, options.quick, options.constrained_max_new_tokens,
                                      fit=options.fit_to_machine)
    prompts = load_workload(options.quick, plain) if plain else []
    if not prompts:
        return BenchReport([], _meta(target, draft, options, 0), constrained)
    encoded = {p.id: target.tokenizer.apply_chat_template(p.messages) for p in prompts}
    configs = build_configs(target, draft, options)

    for config in configs:  # warm-up: first calls allocate caches and pick kernels
        config.run(encoded[prompts[0].id], 8, options.seed)

    outputs: dict[tuple[str, str], list[int]] = {}
    results: dict[tuple[str, str], Measurement] = {}
    bar = progress(total=len(prompts) * len(configs), desc="bench", unit="run")
    for prompt in prompts:
        for config in configs:
            bar.set_postfix_str(f"{prompt.id} {config.name}")
            start = time.perf_counter()
            tokens, stats, decode_s = config.run(encoded[prompt.id], options.max_new_tokens, options.seed)
            seconds = time.perf_counter() - start
            outputs[(config.name, prompt.id)] = tokens
            for category in (prompt.category, "all"):
                results.setdefault((config.name, category), Measurement()).add(len(tokens), seconds, stats, decode_s)
            bar.update(1)
    bar.close()

    for config in configs:
        if config.reference is None:
            continue
        for prompt in prompts:
            ref, got = outputs[(config.reference, prompt.id)], outputs[(config.name, prompt.id)]
            divergence = first_divergence(target, prompt, encoded[prompt.id], ref, got)
            for category in (prompt.category, "all"):
                m = results[(config.name, category)]
                m.compared += 1
                if divergence is None:
                    m.identical += 1
                else:
                    m.divergences.append(divergence)
            # each divergence is listed once per category row it belongs to; "all" lists them all

    categories = [c for c in dict.fromkeys(p.category for p in prompts)] + ["all"]
    rows = []
    for category in categories:
        baseline = results[(TARGET_ONLY, category)].tokens_per_s
        for config in configs:
            rows.append(Row(config.name, category, config.reference, results[(config.name, category)], baseline,
                            results[(TARGET_ONLY, category)].decode_tokens_per_s))
    return BenchReport(rows, _meta(target, draft, options, len(prompts)), constrained)


def _draft_source(draft: Draft | None) -> str | None:
    if draft is None:
        return None
    if isinstance(draft, LoadedModel):
        return draft.source
    return f"draft head ({draft.config.design}, {draft.config.n_layers} layer(s), {len(draft.vocab)} tokens)"


def default_config(draft: Draft | None, options: BenchOptions) -> str | None:
    """The row that runs as the shipped policy serves these requests (policies/default.yaml: n-gram
    lookup, then the shipped head's tree; a sampled request, n-gram lookup alone), or None where the
    bench was asked for another draft."""
    if options.draft is not None or not isinstance(draft, DraftHead) or not options.fit_to_machine:
        return None
    return "engine ngram+draft tree" if options.temperature == 0.0 else "engine ngram"


def _meta(target: LoadedModel, draft: Draft | None, options: BenchOptions, prompts: int) -> dict[str, object]:
    return {
        "default_config": default_config(draft, options),
        "target": target.source,
        "dtype": str(target.model.dtype).removeprefix("torch."),
        "draft": _draft_source(draft),
        "prompts": prompts,
        "max_new_tokens": options.max_new_tokens,
        "temperature": options.temperature,
        "threads": torch.get_num_threads(),
        # a target pass of 1, 2, ... rows in one-row steps, as measured for fitting drafts to this machine
        "pass_costs": list(pass_costs(target.model).relative) if options.fit_to_machine else None,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch": torch.__version__,
        "llama_cpp": llama_cpp_available(),
    }
