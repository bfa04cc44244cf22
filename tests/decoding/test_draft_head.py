"""Draft heads: the unrolled training forward is what decoding computes, the loop learns, files round-trip
and refuse a target with another tokenizer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from decoding import kernels
from decoding.build import MIN_DRAFT_PEAK, build_drafter, load_draft
from decoding.copy_hints import sequence_hints
from decoding.distill.data import draft_vocabulary
from decoding.distill.evaluate import chain_acceptance
from decoding.distill.train import TrainConfig, context_extra, head_features, sequence_loss, train, vocab_index
from decoding.distill.unroll import step_mask, unrolled
from decoding.draft_head import DraftHead, HeadConfig, is_head_file, load_head, save_head
from decoding.drafters import CompositeDrafter, FallbackDrafter, GrammarForcedDrafter, HeadDrafter, NgramDrafter
from decoding.drafters.base import Proposal
from decoding.errors import ModelLoadError, TokenizerMismatchError
from decoding.generate import Engine, GenerationConfig
from decoding.packing import ROW_STABLE_IN_FEATURES
from decoding.stats import SpecStats
from tests.conftest import TinyFactory
from tests.decoding.heads import config_for, head_for, tiny_sequences, trained_head


def test_step_mask_reads_the_chain_a_draft_sees() -> None:
    mask = step_mask(5, 2)  # step 2: verified pairs <= j-2, step-1 pair j-1, step-2 pair j
    j = 4
    assert mask[j, :5].tolist() == [True, True, True, False, False]
    assert mask[j, 5:10].tolist() == [False, False, False, True, False]
    assert mask[j, 10:].tolist() == [False, False, False, False, True]


@pytest.mark.parametrize("design", ["eagle", "eagle3", "tokens", "eagle+copy"])
def test_unrolled_steps_equal_decode_time_steps(tiny_model: TinyFactory, design: str) -> None:
    """Step u of the training forward at pair j == the head's cached decode chain after j-u verified pairs."""
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2)
    seq = tiny_sequences(target, 1, new_tokens=12)[0]
    head = head_for(target, design)
    head.setup_cache(64)
    tokens = seq.tokens
    assert seq.features is not None
    feats = head_features(head, seq) if head.uses_features else None  # (T, F): eagle3 reads two depths
    steps = 3 if head.uses_features else 1
    with torch.no_grad():
        outputs = unrolled(head, tokens, feats, steps)
    last_verified = 9  # pairs 0 .. 9 read the target's features
    verified_feats = feats[: last_verified + 1] if feats is not None else None
    hints = sequence_hints(tokens)[1:]  # (T - 1, 2): pair j reads token j + 1, and the hint after it
    use = head.config.copy_hint
    predicted, logits = head.step(tokens[1 : last_verified + 2], verified_feats, 0,
                                  hints=hints[: last_verified + 1] if use else None)
    torch.testing.assert_close(outputs[0][: last_verified + 1], predicted, rtol=1e-4, atol=1e-4)
    # a request's prompt: the same pass, scored at its last row only
    last, last_logits = head.step(tokens[1 : last_verified + 2], verified_feats, 0,
                                  hints=hints[: last_verified + 1] if use else None, last_only=True)
    assert torch.equal(last, predicted[-1:]) and last_logits.shape == (1, logits.shape[1])
    torch.testing.assert_close(last_logits, logits[-1:], rtol=1e-5, atol=1e-5)
    feature = predicted[-1:]
    for u in range(1, steps):  # chain: pair last_verified + u reads the feature predicted one step earlier
        pos = last_verified + u
        feature, _ = head.step(tokens[pos + 1 : pos + 2], feature, pos, hints=hints[pos : pos + 1] if use else None)
        torch.testing.assert_close(outputs[u][pos], feature[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("design", ["eagle", "eagle3", "tokens", "eagle+copy"])
def test_a_few_training_steps_lower_the_distillation_loss(tiny_model: TinyFactory, design: str) -> None:
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2)
    sequences = tiny_sequences(target, 16)
    vocab, coverage = draft_vocabulary(sequences, 12, 16)
    assert len(vocab) == 12 and 0.5 < coverage <= 1.0
    head = head_for(target, design, vocab)
    config = config_for(target, design, steps=2 if design != "tokens" else 1, tokens_per_update=128, epochs=6,
                        warmup=3, lr=3e-3)
    index = vocab_index(head)

    def mean_loss() -> float:
        with torch.no_grad():
            return sum(float(sequence_loss(head, s, config, index)[0]) for s in sequences) / len(sequences)

    head.setup_cache(128)
    before = mean_loss()
    state = train(head, sequences, config, progress=False)
    after = mean_loss()
    assert state.update == state.total_updates > 10
    assert after < 0.7 * before, f"{design}: loss {before:.3f} -> {after:.3f}"
    accepted = sum(sum(chain_acceptance(head, s, 4)) for s in sequences)
    assert accepted > 0


@pytest.mark.parametrize("design", ["eagle", "eagle3", "tokens", "eagle+copy"])
def test_padding_to_a_recurring_shape_changes_neither_loss_nor_gradients(tiny_model: TinyFactory,
                                                                         design: str) -> None:
    """Training pads each sequence (and the context tokens a head scores) to a multiple of a bucket, for
    matmul shapes that recur: the loss, the agreement and every gradient are those of the sequence alone."""
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2)
    sequences = tiny_sequences(target, 4, new_tokens=13)
    vocab, _ = draft_vocabulary(sequences, 12, 16)  # a head vocabulary that leaves context tokens outside
    head = head_for(target, design, vocab)
    config = config_for(target, design, steps=3 if design != "tokens" else 1)
    index = vocab_index(head)
    seq = sequences[0]
    assert (len(seq.tokens) - 1) % 8 != 0, "the sequence must need padding"
    if design == "eagle+copy":
        extra = context_extra(head, index, seq.tokens)
        assert extra is not None and 0 < extra.numel() < 8, "the context tokens outside must need padding too"
    results = []
    for bucket in (1, 8):
        head.zero_grad(set_to_none=True)
        loss, metrics = sequence_loss(head, seq, config, index, bucket)
        loss.backward()
        grads = {name: p.grad.clone() for name, p in head.named_parameters() if p.grad is not None}
        results.append((loss.detach(), metrics, grads))
    (loss1, metrics1, grads1), (loss8, metrics8, grads8) = results
    torch.testing.assert_close(loss8, loss1, rtol=1e-5, atol=1e-6)
    assert metrics8.keys() == metrics1.keys()
    for key, value in metrics1.items():
        assert metrics8[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert grads8.keys() == grads1.keys() and grads1
    for name, grad in grads1.items():
        torch.testing.assert_close(grads8[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_training_resumes_from_its_checkpoint(tiny_model: TinyFactory, tmp_path: Path) -> None:
    """Stopped after 5 updates and resumed in a fresh process-like state == trained in one go."""
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2)
    sequences = tiny_sequences(target, 8)
    config = TrainConfig(design="eagle", steps=2, tokens_per_update=128, epochs=4, warmup=2, lr=3e-3)
    whole = head_for(target, "eagle")
    done = train(whole, sequences, config, progress=False)
    ckpt = tmp_path / "head.ckpt"
    first = train(head_for(target, "eagle"), sequences, config, ckpt, progress=False, stop_after=5)
    assert first.update == 5 < done.update and first.resumed_at is None
    with pytest.raises(ValueError, match="another training config"):
        train(head_for(target, "eagle"), sequences, TrainConfig(**{**config.__dict__, "lr": 1e-3}), ckpt,
              resume=True, progress=False)
    resumed = head_for(target, "eagle", seed=1)  # other initial weights: the checkpoint must replace them
    second = train(resumed, sequences, config, ckpt, resume=True, progress=False)
    assert second.update == done.update and len(second.history) == len(done.history) and second.resumed_at == 5
    for key, value in whole.head_state().items():
        torch.testing.assert_close(resumed.head_state()[key], value, rtol=1e-5, atol=1e-6)


def test_head_file_round_trips_and_refuses_another_tokenizer(tiny_model: TinyFactory, tmp_path: Path) -> None:
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2)
    head = head_for(target, "eagle", torch.arange(2, 14))
    path = tmp_path / "draft.safetensors"
    save_head(head, path, target.tokenizer.fingerprint(), {"design": "eagle"})
    assert is_head_file(path)
    emb, lm = target.model.tok_embeddings.weight, target.model.output.weight
    loaded = load_head(path, emb, lm, target.tokenizer.fingerprint())
    assert loaded.vocab.tolist() == list(range(2, 14))
    for key, value in head.head_state().items():
        torch.testing.assert_close(loaded.head_state()[key].float(), value.to(torch.bfloat16).float())
    other = tiny_model(vocab_size=24)
    with pytest.raises(TokenizerMismatchError, match="another tokenizer"):
        load_draft(str(path), other)
    weights = tmp_path / "weights.safetensors"  # safetensors, but no head's metadata
    save_file({"w": torch.zeros(2)}, str(weights))
    with pytest.raises(ModelLoadError, match="not a draftgate draft head"):  # was "expected a .gguf file"
        load_draft(str(weights), target)
    drafter = build_drafter(["grammar", "ngram", "draft"], target, load_draft(str(path), target), 6)
    # the grammar's forced tokens and the n-gram's match after them, or else the head's chain
    assert isinstance(drafter, FallbackDrafter) and isinstance(drafter.drafters[1], HeadDrafter)
    free = drafter.drafters[0]
    assert isinstance(free, CompositeDrafter) and [type(d) for d in free.drafters] == [
        GrammarForcedDrafter, NgramDrafter]
    assert drafter.drafters[1].min_peak == MIN_DRAFT_PEAK
    grammar_then_head = build_drafter(["grammar", "draft"], target, load_draft(str(path), target), 6)
    assert isinstance(grammar_then_head, FallbackDrafter)
    assert [type(d) for d in grammar_then_head.drafters] == [GrammarForcedDrafter, HeadDrafter]
    bogus = tmp_path / "bogus.safetensors"
    bogus.write_bytes(b"not a safetensors file")
    assert not is_head_file(bogus)
    with pytest.raises(ModelLoadError, match="not a draftgate draft head"):
        load_head(bogus, emb, lm, target.tokenizer.fingerprint())


def test_an_eagle3_head_keeps_its_feature_layers_and_is_refused_by_a_shallower_target(
        tiny_model: TinyFactory, tmp_path: Path) -> None:
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2, n_layers=3)
    head = head_for(target, "eagle3")
    head = DraftHead(replace(head.config, feature_layers=[2, 0]), head.vocab)  # a list, as JSON gives it
    assert head.config.feature_layers == (0, 2) and head.config.feature_width == 3 * head.config.dim
    path = tmp_path / "eagle3.safetensors"
    save_head(head, path, target.tokenizer.fingerprint(), {"design": "eagle3"})
    drafter = build_drafter(["ngram", "draft"], target, load_draft(str(path), target), 6)
    assert drafter is not None and drafter.feature_layers == (0, 2)  # what the engine asks the target for
    shallow = tiny_model(vocab_size=16, dtype=torch.float32, seed=2, n_layers=2)
    with pytest.raises(ModelLoadError, match=r"reads target blocks \[2\], the target has 2"):
        load_draft(str(path), shallow)
    with pytest.raises(ModelLoadError, match="needs feature layers"):
        replace(head.config, feature_layers=())


def test_target_features_at_several_depths(tiny_model: TinyFactory) -> None:
    """The final state first (what an eagle head reads), then each tapped block's residual stream at unit
    RMS; the logits do not change."""
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2, n_layers=3)
    model = target.model
    model.setup_cache(32)
    tokens = torch.tensor([0, 5, 3, 9, 3])
    logits, final = model.forward_hidden(tokens, 0)  # (5, V), (5, D)
    tapped_logits, tapped = model.forward_hidden(tokens, 0, feature_layers=(0, 1))  # (5, 3D)
    d = final.shape[-1]
    assert tapped.shape == (5, 3 * d)
    torch.testing.assert_close(tapped_logits, logits)
    torch.testing.assert_close(tapped[:, :d], final)
    rms = tapped[:, d:].view(5, 2, d).pow(2).mean(-1).sqrt()  # (5, 2)
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-3, atol=1e-3)
    assert not torch.allclose(tapped[:, d : 2 * d], tapped[:, 2 * d :])  # two different depths


def test_a_bf16_eagle3_head_steps_on_target_features_wider_than_one_packed_reduction() -> None:
    """At decode time the fuse layer is packed for oneDNN; inputs wider than ROW_STABLE_IN_FEATURES are
    reduced in chunks and come back float32, which the head must feed on in its own dtype."""
    config = HeadConfig(design="eagle3", target_vocab_size=16, dim=400, n_layers=1, n_heads=4, n_kv_heads=2,
                        intermediate_size=64, feature_layers=(0,))
    assert config.feature_width > ROW_STABLE_IN_FEATURES
    torch.manual_seed(0)
    head = DraftHead(config, torch.arange(16))
    head.attach(torch.randn(16, 400), torch.randn(16, 400))
    head.prepare_inference(torch.bfloat16)
    head.setup_cache(16)
    verified, logits = head.step(torch.tensor([3, 5, 7]), torch.randn(3, config.feature_width), 0)  # target's
    assert verified.shape == (3, 400) and logits.shape == (3, 16)
    drafted, _ = head.step(torch.tensor([2]), verified[-1:], 3)  # then its own output
    assert drafted.shape == (1, 400) and torch.isfinite(drafted).all()


@pytest.mark.skipif(not kernels.linear_available(), reason="needs the kernel and AVX512-BF16")
def test_a_bf16_head_runs_each_layer_in_one_kernel_call_and_a_multi_row_step_gives_single_steps_bits() -> None:
    """prepare_inference puts each of a bf16 head's layers through one exact kernel call: the bits of its
    kernels called one by one, and every row of a pass (the catch-up over verified positions, a tree's
    rows with their mask and positions) the bits of the single step it stands for."""
    config = HeadConfig(design="eagle", target_vocab_size=16, dim=64, n_layers=1, n_heads=4, n_kv_heads=2,
                        intermediate_size=96)
    emb, lm = torch.randn(16, 64), torch.randn(16, 64)
    heads = []
    for one_call in (True, False):
        torch.manual_seed(0)  # the same weights
        head = DraftHead(config, torch.arange(16))
        head.attach(emb, lm)
        head.prepare_inference(torch.bfloat16)
        head.setup_cache(32)
        assert head.one_call and all(block.attention.exact_kernel for block in head.blocks)
        if not one_call:  # the same kernels, called one by one (attention through the kernel too)
            for block in head.blocks:
                block.exact_weights = None
        heads.append(head)
    tokens, feats = torch.tensor([3, 5, 7, 2, 9]), torch.randn(5, 64)
    outs = [h.step(tokens[:3], feats[:3], 0) for h in heads]  # a prompt's pass, causal
    outs += [h.step(tokens[3:], feats[3:], 3) for h in heads]  # a catch-up of two rows, masked
    for a, b in zip(outs[0::2], outs[1::2], strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    single = heads[0]
    single.setup_cache(64)  # a bigger cache: a fresh one
    passes = torch.cat([outs[0][0], outs[2][0]]), torch.cat([outs[0][1], outs[2][1]])  # (5, D), (5, V)
    for i in range(5):
        feature, logits = single.step(tokens[i : i + 1], feats[i : i + 1], i)
        assert torch.equal(feature[0], passes[0][i]) and torch.equal(logits[0], passes[1][i])
    # two tree rows at slots 5 and 6, both at position 5, each reading the context and itself only
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[:, :5], mask[0, 5], mask[1, 6] = True, True, True
    tree_feature, tree_logits = single.step(torch.tensor([4, 6]), feats[:2], 5, torch.tensor([5, 5]), mask)
    for r, token in enumerate((4, 6)):
        alone_feature, alone_logits = single.step(torch.tensor([token]), feats[r : r + 1], 5)
        assert torch.equal(tree_feature[r], alone_feature[0]) and torch.equal(tree_logits[r], alone_logits[0])


def test_a_context_vocab_head_drafts_context_tokens_outside_its_fixed_vocabulary(tiny_model: TinyFactory) -> None:
    """A copy head with 8 fixed tokens of 16 scores the context's others too, and drafts them where the
    target repeats its context; the drafts stay the target's greedy output."""
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2)
    head = trained_head(target, "eagle+copy", updates=60, vocab=torch.arange(8))
    drafter = HeadDrafter(head, max_tokens=4)
    proposed: list[int] = []
    inner = drafter.propose

    def spy(*args: object, **kwargs: object) -> Proposal:
        proposal = inner(*args, **kwargs)  # type: ignore[arg-type]
        proposed.extend(proposal.tokens)
        return proposal

    drafter.propose = spy  # type: ignore[method-assign]
    prompt = [0, 9, 12, 3, 14, 9, 12, 3, 14, 9, 12]
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    expected = [t for s in Engine(target).decode_tokens(prompt, replace(config, speculative=False), SpecStats())
                for t in s]
    stats = SpecStats()
    got = [t for s in Engine(target, drafter).decode_tokens(prompt, config, stats) for t in s]
    assert got == expected
    assert drafter.vocab.extra is not None and set(drafter.vocab.extra.tolist()) >= {9, 12, 14}
    assert any(t >= 8 for t in proposed), "no draft outside the fixed vocabulary"
    assert stats.accepted_tokens > 0
