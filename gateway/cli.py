"""The `draftgate` command: serve, generate, bench, distill."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from decoding.bench.workload import CATEGORIES, CONSTRAINED, LONG
from decoding.errors import DecodingError, InvalidRequestError, UnknownToolError
from gateway.auth import NoKeysError
from policies.loader import PolicyError

if TYPE_CHECKING:
    from decoding.loading import LoadedModel


def _read_json(path: str, what: str) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"{what} {path}: {exc}") from exc


def _generate(args: argparse.Namespace) -> int:
    from decoding.build import build_engine, check_drafter_names
    from decoding.chat_engine import ChatEngine, ChatRequest, ConstraintOptions
    from decoding.constraints.bounds import Bounds
    from decoding.constraints.spec import could_be_call
    from decoding.generate import GenerationConfig
    from decoding.loading import resolve_dtype
    from decoding.sampling import SamplingParams
    from decoding.structured import OutputValidationError, parse_response_format, plan_output
    from decoding.tokenizer import cache_root
    from decoding.tools import parse_tool_choice, parse_tools

    # everything that can be checked without the model is checked before it loads (seconds)
    drafters = tuple(args.drafters) if args.drafters else None
    check_drafter_names(drafters or ())
    resolve_dtype(args.dtype)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    messages = [{"role": "user", "content": args.prompt}]
    if args.system:
        messages.insert(0, {"role": "system", "content": args.system})
    response_format = None
    if args.not_strict and not args.json_schema:
        raise InvalidRequestError("--not-strict needs --json-schema")
    if args.json_schema:
        schema = _read_json(args.json_schema, "--json-schema")
        response_format = {"type": "json_schema",
                           "json_schema": {"name": "output", "schema": schema, "strict": not args.not_strict}}
    elif args.json_object:
        response_format = {"type": "json_object"}
    tools = _read_json(args.tools, "--tools") if args.tools else None
    tool_choice: object = args.tool_choice
    if tool_choice not in (None, "none", "auto", "required"):
        tool_choice = {"type": "function", "function": {"name": tool_choice}}
    if tool_choice is not None and not tools:
        raise InvalidRequestError("--tool-choice needs --tools")
    parsed_tools = parse_tools(tools)
    try:
        choice = parse_tool_choice(tool_choice, parsed_tools)
    except UnknownToolError as exc:  # a mode mistyped reads as a tool's name: say both
        names = ", ".join(t.name for t in parsed_tools)
        raise UnknownToolError(f"--tool-choice {args.tool_choice!r}: none, auto, required or a tool's name "
                               f"({names})") from exc
    plan_output(parsed_tools, choice, parse_response_format(response_format), args.backend)  # the preflight
    structured = bool(tools or args.json_schema or args.json_object)
    engine = build_engine(args.model, drafters, args.draft, args.dtype, args.max_draft_tokens, with_grammar=structured,
                          draft_tree=not args.draft_chain, fit=not args.no_fit, sampled_tree=args.sampled_tree,
                          sampled_draft=args.sampled_draft)
    config = GenerationConfig(
        max_new_tokens=args.max_tokens,
        sampling=sampling,
        stop=tuple(args.stop),
        speculative=not args.no_speculative,
    )
    options = ConstraintOptions(backend=args.backend, bounds=Bounds() if structured else None,
                                cache_dir=cache_root() / "outlines")
    chat = ChatEngine(engine, options)
    prepared = chat.prepare(ChatRequest(
        messages, config, tools=tools, tool_choice=tool_choice,
        response_format=response_format,
    ))
    started = time.perf_counter()
    generation = prepared.start()
    held = ""  # with tools, text that may still turn out to be a call (printed parsed, at the end)
    for delta in generation:
        if not args.stream:
            continue
        held += delta
        if args.tools and could_be_call(held):
            continue
        sys.stdout.write(held)
        sys.stdout.flush()
        held = ""
    result = generation.result
    elapsed = time.perf_counter() - started
    try:
        output = prepared.finish(result)
    except OutputValidationError:  # (--not-strict) the text that missed the schema, then the error
        sys.stdout.write((result.text if not args.stream else held) + "\n")
        sys.stdout.flush()
        raise
    if output.tool_calls:
        sys.stdout.write(json.dumps([c.to_openai() for c in output.tool_calls], indent=2))
    elif output.content is not None and (not args.stream or held):
        sys.stdout.write(result.text if not args.stream else held)
    sys.stdout.write("\n")
    sys.stdout.flush()  # the text and its newline before the stats line (stderr, unbuffered)
    summary = {
        "finish_reason": output.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "tokens_per_s": round(result.completion_tokens / elapsed, 1) if elapsed else 0.0,
        **result.stats.to_dict(),
    }
    print(json.dumps(summary), file=sys.stderr)
    return 0


class UsageError(Exception):
    """Arguments that cannot work, found before any long work starts."""


def _check_writable(path: str | None) -> None:
    """A file written at the end of a run of minutes must be writable before it starts."""
    if path is None:
        return
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: no directory {parent}")
    if not os.access(parent, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"cannot write {path}: permission denied")


def _bench(args: argparse.Namespace) -> int:
    from decoding.bench.runner import BenchOptions, run_bench

    _check_writable(args.json)
    if args.gateway:
        return _bench_gateway(args)
    options = BenchOptions(
        quick=args.quick,
        max_new_tokens=args.max_tokens or (64 if args.quick else 128),
        categories=tuple(args.category) if args.category else None,
        temperature=args.temperature,
        include_hf=not args.no_hf,
        dtype=args.dtype,
        draft=args.draft,
        no_draft=args.no_draft,
        fit_to_machine=not args.no_fit,
    )
    report = run_bench(options)
    print(report.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        print(f"wrote {args.json}")
    return 0


def _bench_gateway(args: argparse.Namespace) -> int:
    from gateway.bench import GatewayBenchOptions, run_gateway_bench, table

    options = GatewayBenchOptions(policy=args.policy, model=args.model, quick=args.quick,
                                  max_new_tokens=args.max_tokens or 64, requests=args.requests)
    report = run_gateway_bench(options)
    print(table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def _distill(args: argparse.Namespace) -> int:
    from decoding.distill.card import card_markdown
    from decoding.distill.data import DataConfig
    from decoding.distill.run import checkpoint_path, distill
    from decoding.distill.train import TrainConfig
    from decoding.draft_head import default_feature_layers, read_metadata
    from decoding.loading import load_model

    for head in args.evaluate or ():  # checked before the minutes of work that come first
        if not Path(head).is_file():
            raise UsageError(f"--evaluate {head}: no such file")
        if read_metadata(Path(head)) is None:
            raise UsageError(f"--evaluate {head}: not a draftgate draft head")
    if args.rounds < 1:
        raise UsageError(f"--rounds: must be at least 1, got {args.rounds}")
    for name in ("epochs", "minutes", "lr", "tokens_per_update", "layers", "steps", "vocab_size", "max_new_tokens"):
        if not getattr(args, name) > 0:  # found now, not an hour of data generation later
            raise UsageError(f"--{name.replace('_', '-')}: must be above 0, got {getattr(args, name)}")
    if args.prompt_weight < 0:
        raise UsageError(f"--prompt-weight: must be 0 or more, got {args.prompt_weight}")
    _check_writable(args.out)
    _check_writable(args.data)  # read if there, else built and written there
    target = load_model(args.model, args.dtype)
    if args.evaluate:
        return _evaluate_heads(target, [Path(p) for p in args.evaluate])
    taps: tuple[int, ...] = ()
    if args.design == "eagle3":
        taps = (tuple(int(i) for i in args.feature_layers.split(",")) if args.feature_layers
                else default_feature_layers(target.model.args.n_layers))
        beyond = [i for i in taps if not 0 <= i < target.model.args.n_layers]
        if beyond:
            raise SystemExit(f"--feature-layers {beyond}: the target has blocks 0 .. {target.model.args.n_layers - 1}")
    data = DataConfig(seed=args.seed, stage_one=args.stage_one, stage_two=args.stage_two,
                      agent_prompts=args.agent_prompts, max_new_tokens=args.max_new_tokens,
                      text_sequences=args.text_sequences, feature_layers=taps, rounds=args.rounds)
    config = TrainConfig(design=args.design, n_layers=args.layers, steps=args.steps if args.design != "tokens" else 1,
                         vocab_size=args.vocab_size, lr=args.lr, epochs=args.epochs, minutes=args.minutes,
                         seed=args.seed, tokens_per_update=args.tokens_per_update, prompt_weight=args.prompt_weight,
                         feature_layers=taps, copy_hint=args.copy_hint and args.design != "tokens",
                         context_vocab=args.context_vocab)
    out = Path(args.out or f"draft-{target.name}-{args.design}.safetensors")
    checkpoint = checkpoint_path(target, data, config)
    if args.resume and not checkpoint.exists():  # not a silent fresh hour-long run
        raise UsageError("--resume: no checkpoint of this configuration to resume (the options must be the ones "
                         f"of the run to resume; looked for {checkpoint})")
    card = distill(target, out, data, config, resume=args.resume, data_file=Path(args.data) if args.data else None)
    out.with_suffix(".md").write_text(card_markdown(card, f"Draft head for {target.name} ({args.design})"))
    print(json.dumps({"held_out": card["held_out"]["all"], "cost": card["cost"],
                      "updates": card["training"]["updates"], "train_wall_s": card["training"]["train_wall_s"]}))
    print(f"wrote {out} and its model card {out.with_suffix('.md')} (use it with --draft {out})")
    return 0


def _evaluate_heads(target: LoadedModel, paths: list[Path]) -> int:
    from decoding.distill.bench_set import bench_sequences, evaluate_on_bench

    sequences = bench_sequences(target)
    print("| head | category | chains | first draft accepted | mean acceptance length |")
    print("|---|---|---:|---:|---:|")
    for path in paths:
        result = evaluate_on_bench(target, path, sequences)
        for name, s in [*result["categories"].items(), ("all", result["all"])]:
            print(f"| {path.name} | {name} | {s['chains']} | {s['first_draft_accepted']:.1%} "
                  f"| {s['mean_acceptance_length']:.2f} |")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gateway.serve import PortInUseError, serve

    try:
        return serve(args.policy, args.host, args.port)
    except PortInUseError as exc:
        print(f"draftgate: error: {exc}", file=sys.stderr)
        return 2


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("draftgate")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _int_in(low: int, high: int | None, noun: str, bounds: str) -> Callable[[str], int]:
    """An argparse type: an int in [low, high] (no upper end with None); errors say `noun` and `bounds`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{bounds}, got {value}")
        return value

    return parse


_positive = _int_in(1, None, "a whole number", "must be at least 1")
_port = _int_in(0, 65535, "a port number", "a port is 0 to 65535")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"draftgate {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    # -v after the command too (`draftgate serve -v`, `scripts/run.sh --port 8001 -v`); SUPPRESS keeps a -v
    # given before it
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level")

    srv = sub.add_parser("serve", help="serve the OpenAI-compatible API (the policy's routes)", parents=[verbose])
    srv.add_argument("--policy", default=None, metavar="FILE", help="policy YAML (default: the shipped default.yaml)")
    srv.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface, give the policy API "
                          "keys first)")
    srv.add_argument("--port", type=_port, default=8000, help="default 8000; 0: any free port (the banner says which)")
    srv.set_defaults(func=_serve)

    gen = sub.add_parser("generate", help="generate a chat reply on a local model", parents=[verbose])
    gen.add_argument("prompt", help="the user message (rendered with the model's chat template)")
    gen.add_argument("--system", default=None, help="a system message before the prompt")
    gen.add_argument("--model", default="embedded", help='"embedded", a .gguf file or a HF model directory')
    gen.add_argument("--draft", default=None,
                     help="a draft head (.safetensors from `draftgate distill`) or a draft model (.gguf or HF "
                          "directory) with the same tokenizer; default: the draft shipped for the target")
    gen.add_argument("--drafters", nargs="+", default=None,
                     help="drafters in order: grammar, ngram, draft (default: ngram draft; grammar is added "
                          "under a constraint)")
    gen.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU has it), bf16, fp32, fp64 or fp16")
    gen.add_argument("--max-tokens", type=_positive, default=256, help="new tokens at most (default 256)")
    gen.add_argument("--max-draft-tokens", type=_int_in(1, 32, "a whole number", "must be 1 to 32"), default=8,
                     help="drafts per pass at most (default 8; fewer where bigger passes do not pay on this machine)")
    gen.add_argument("--no-fit", action="store_true",
                     help="draft --max-draft-tokens a pass without measuring what passes cost here")
    gen.add_argument("--draft-chain", action="store_true",
                     help="a draft head drafts one chain per pass instead of a tree of alternatives")
    gen.add_argument("--sampled-draft", action="store_true",
                     help="at --temperature > 0, the draft drafts too, behind n-gram lookup "
                          "(default: n-gram lookup alone there, which measured faster)")
    gen.add_argument("--sampled-tree", action="store_true",
                     help="at --temperature > 0 too, a tree drawn from the head's distribution "
                          "(implies --sampled-draft, whose head drafts a chain without it)")
    gen.add_argument("--temperature", type=float, default=0.0,
                     help="0 (the default here, unlike the API's 1): greedy; above 0: sampled")
    gen.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens only (0: all)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the likeliest tokens up to this mass")
    gen.add_argument("--seed", type=int, default=None, help="a sampled output's seed: the same seed, the same output")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="end the output before this text (repeat for several)")
    gen.add_argument("--no-speculative", action="store_true", help="target-only decoding")
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.add_argument("--tools", default=None, metavar="FILE", help="OpenAI-style tools, a JSON array")
    gen.add_argument("--tool-choice", default=None, help="none, auto, required, or a tool's name (needs --tools)")
    shape = gen.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", default=None, metavar="FILE", help="constrain the output to this JSON schema")
    shape.add_argument("--json-object", action="store_true", help="constrain the output to a JSON object")
    gen.add_argument("--not-strict", action="store_true",
                     help='with --json-schema: "strict": false, keywords the backend cannot enforce are validated '
                          "after generation instead of refused")
    gen.add_argument("--backend", default="outlines", choices=["outlines", "xgrammar"], help="constraint backend")
    gen.set_defaults(func=_generate)

    bench = sub.add_parser("bench", help="benchmark the engine against HF transformers (and llama.cpp)",
                           parents=[verbose])
    bench.add_argument("--quick", action="store_true", help="a subset: two prompts per category, 64 tokens each")
    bench.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    bench.add_argument("--max-tokens", type=int, default=None, help="new tokens per prompt (default 128)")
    bench.add_argument("--category", action="append", default=None, choices=[*CATEGORIES, CONSTRAINED, LONG],
                       help="only these categories (repeat the option for several); `long` (agent sessions of "
                            "1.9k-2.6k tokens) runs only when named")
    bench.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; above 0: sampled")
    bench.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU has it), bf16, fp32, fp64 or fp16")
    bench.add_argument("--draft", default=None,
                       help="the draft for the draft rows: a draft head or a draft model (default: the shipped one)")
    bench.add_argument("--no-draft", action="store_true", help="no draft rows")
    bench.add_argument("--no-hf", action="store_true", help="skip the HF transformers baselines")
    bench.add_argument("--no-fit", action="store_true",
                       help="draft up to 8 tokens a pass without measuring what passes cost on this machine")
    bench.add_argument("--gateway", action="store_true",
                       help="bench the HTTP gateway instead: its overhead, and speculation on vs off through the API")
    bench.add_argument("--policy", default=None, metavar="FILE", help="policy for --gateway (default: the shipped one)")
    bench.add_argument("--requests", type=_positive, default=40, help="one-token requests for the --gateway overhead")
    bench.add_argument("--model", default=None,
                       help="the local route --gateway benches (default: the policy's first local route)")
    bench.set_defaults(func=_bench)

    dist = sub.add_parser("distill", help="train a draft head for a target from the target's own generations",
                          parents=[verbose])
    dist.add_argument("--model", default="embedded", help="the target to distill")
    dist.add_argument("--out", default=None, help="the draft head file to write (.safetensors)")
    dist.add_argument("--design", default="eagle", choices=["eagle", "eagle3", "tokens"],
                      help="eagle: reads the target's final hidden states; eagle3: those and two earlier depths, "
                           "fused; tokens: an independent small LM")
    dist.add_argument("--feature-layers", default=None, metavar="I,J",
                      help="eagle3: the target blocks read besides the final state (default: block 2 and the middle)")
    dist.add_argument("--copy-hint", action=argparse.BooleanOptionalAction, default=True,
                      help="eagle heads: each position also reads prompt lookup's guess, so the head can copy")
    dist.add_argument("--context-vocab", action=argparse.BooleanOptionalAction, default=True,
                      help="the head also scores the request's context tokens outside its fixed vocabulary")
    dist.add_argument("--layers", type=int, default=1, help="decoder layers in the head")
    dist.add_argument("--steps", type=int, default=3, help="unrolled draft steps per training sequence (eagle)")
    dist.add_argument("--vocab-size", type=int, default=8192, help="tokens the head can emit")
    dist.add_argument("--epochs", type=float, default=4.0)
    dist.add_argument("--minutes", type=float, default=75.0, help="wall-time limit of the training")
    dist.add_argument("--lr", type=float, default=2e-3)
    dist.add_argument("--tokens-per-update", type=int, default=1024, help="tokens per optimiser step")
    dist.add_argument("--seed", type=int, default=0)
    dist.add_argument("--stage-one", type=int, default=320, help="prompts the target answers first")
    dist.add_argument("--stage-two", type=int, default=320, help="prompts built on those answers")
    dist.add_argument("--agent-prompts", type=int, default=400,
                      help="agent-shaped prompts (tools in the system prompt, structured copy, summaries, chat)")
    dist.add_argument("--rounds", type=int, default=2,
                      help="prompt rounds: each draws every prompt afresh (seed, seed + 1, ...) and is generated "
                           "and cached on its own, so more rounds reuse the ones made before (~30 min a round)")
    dist.add_argument("--text-sequences", type=int, default=480,
                      help="standard-library docs and code read by the target (teacher-forced)")
    dist.add_argument("--prompt-weight", type=float, default=0.3, help="loss weight of prompt positions")
    dist.add_argument("--max-new-tokens", type=int, default=160, help="tokens the target generates per prompt")
    dist.add_argument("--data", default=None, metavar="FILE", help="the data set file (default: in the cache)")
    dist.add_argument("--resume", action="store_true", help="continue from this configuration's checkpoint")
    dist.add_argument("--dtype", default="auto", help="the target's dtype (auto: bf16 where the CPU has it)")
    dist.add_argument("--evaluate", nargs="+", metavar="HEAD",
                      help="train nothing: score these draft head files' greedy chains on the bench prompts' own "
                           "outputs (offline, never trained on)")
    dist.set_defaults(func=_distill)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)  # its INFO lines say little, on every upstream call
    try:
        return int(args.func(args))
    except DecodingError as exc:
        hint = ""
        if exc.code == "unsupported_schema_keyword" and args.command == "generate":
            hint = " (on the command line, --not-strict asks for that)"
        print(f"draftgate: error [{exc.code}]: {exc}{hint}", file=sys.stderr)
        return 2
    except (PolicyError, NoKeysError, UsageError) as exc:
        print(f"draftgate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the server has shut down, or a generation stops; no traceback
        print("draftgate: stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
