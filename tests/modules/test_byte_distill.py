"""ByteDistill (000-08): the byte projection against a brute-force ``bytes.startswith`` loop, its two exact
special cases, the distillation losses and the errors; the CLI smoke fit is in tests/test_cli.py."""

from __future__ import annotations

import random

import pytest
import torch

from errors import ConfigError
from modules.byte_distill import (
    ByteDistillModule,
    build_tables,
    byte_distributions,
    divergence,
    first_byte_marginal,
    shared_vocabulary,
)
from modules.components.tiny_gpt import TinyGPT

TEXT = "naïve café — Größe, 日本語 the quick brown fox 🙂 def f(x): return x"


def _vocab(seed: int, extra: int = 120) -> list[bytes]:
    """The 256 single bytes (shuffled ids) plus random multi-byte substrings of a UTF-8 text (cut anywhere,
    so some end inside a character), without duplicates."""
    rng = random.Random(seed)
    data = TEXT.encode("utf-8")
    vocab = [bytes([b]) for b in range(256)]
    rng.shuffle(vocab)
    seen = set(vocab)
    while len(vocab) < 256 + extra:
        i = rng.randrange(len(data) - 1)
        piece = data[i : i + rng.randint(2, 6)]
        if piece not in seen:
            seen.add(piece)
            vocab.append(piece)
    return vocab


def _brute(probs: torch.Tensor, ids: list[int], vocab: list[bytes], mode: str) -> torch.Tensor:
    rows = []
    for i, tok in enumerate(ids):
        for k in range(len(vocab[tok])):
            s = vocab[tok][:k]
            row = torch.zeros(256, dtype=probs.dtype)
            if k == 0:
                for t, tb in enumerate(vocab):
                    row[tb[0]] += probs[i, t]
            else:
                m = torch.zeros(256, dtype=probs.dtype)
                for t, tb in enumerate(vocab):  # tb starts with s + b for exactly one b: b = tb[k]
                    if len(tb) > k and tb.startswith(s):
                        m[tb[k]] += probs[i, t]
                e = sum(probs[i, t] for t, tb in enumerate(vocab) if tb == s)
                f = torch.zeros(256, dtype=probs.dtype)
                for t, tb in enumerate(vocab):
                    f[tb[0]] += probs[i + 1, t]
                row = m / m.sum() if mode == "drop" else (m + e * f) / (m.sum() + e)
            rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("mode", ["next_first_byte", "drop"])
def test_byte_distributions_match_a_brute_force_startswith_loop(mode: str) -> None:
    vocab = _vocab(0)
    gen = torch.Generator().manual_seed(0)
    long_ids = [i for i, t in enumerate(vocab) if len(t) >= 3][:4]
    ids = long_ids + torch.randint(0, len(vocab), (4,), generator=gen).tolist()
    probs = (3 * torch.randn(len(ids) + 1, len(vocab), generator=gen, dtype=torch.float64)).softmax(-1)
    got = byte_distributions(probs, torch.tensor(ids), vocab, mode)
    want = _brute(probs, ids, vocab, mode)
    assert got.shape == (sum(len(vocab[i]) for i in ids), 256)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.sum(1), torch.ones(len(got), dtype=torch.float64))


def test_single_byte_tokens_return_the_token_distribution() -> None:
    vocab = _vocab(1, extra=0)  # the 256 bytes alone, in shuffled id order
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (9,), generator=gen)
    probs = torch.randn(10, 256, generator=gen, dtype=torch.float64).softmax(-1)
    got = byte_distributions(probs, ids, vocab)
    byte_of = torch.tensor([t[0] for t in vocab])
    want = torch.zeros(9, 256, dtype=torch.float64)
    want[:, byte_of] = probs[:9]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_shared_tokenizer_blda_at_boundaries_is_the_kl_of_first_byte_marginals() -> None:
    vocab = _vocab(2)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, len(vocab), (6,), generator=gen)
    p_t = torch.randn(7, len(vocab), generator=gen, dtype=torch.float64).softmax(-1)
    p_s = torch.randn(7, len(vocab), generator=gen, dtype=torch.float64).softmax(-1)
    starts = torch.tensor([0, *torch.tensor([len(vocab[i]) for i in ids]).cumsum(0)[:-1].tolist()])
    bt = byte_distributions(p_t, ids, vocab)[starts]
    bs = byte_distributions(p_s, ids, vocab)[starts]
    marg = torch.zeros(2, 6, 256, dtype=torch.float64)  # the token KD marginals, by a loop
    for j, p in enumerate((p_t, p_s)):
        for i in range(6):
            for t, tb in enumerate(vocab):
                marg[j, i, tb[0]] += p[i, t]
    torch.testing.assert_close(bt, marg[0])
    torch.testing.assert_close(bs, marg[1])
    kl = (marg[0] * (marg[0].log() - marg[1].log())).sum(-1)
    torch.testing.assert_close(divergence(bt, bs, "fkl"), kl, rtol=2e-3, atol=1e-6)  # up to the smoothing


def test_divergences() -> None:
    gen = torch.Generator().manual_seed(3)
    p, q = torch.randn(2, 5, 256, generator=gen, dtype=torch.float64).softmax(-1)
    assert torch.allclose(divergence(p, p, "fkl"), torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(divergence(p, q, "rkl"), divergence(q, p, "fkl"))
    js = divergence(p, q, "js")
    assert (js > 0).all() and (js <= torch.log(torch.tensor(2.0))).all()
    torch.testing.assert_close(js, divergence(q, p, "js"))


def test_shared_vocabulary_and_tables() -> None:
    a, b = [b"a", b"b", b"ab", b"abc"], [b"b", b"abc", b"a", b"x"]
    ta, tb = shared_vocabulary(a, b)
    assert [a[i] for i in ta] == [b[i] for i in tb] == [b"a", b"b", b"abc"]
    tables = build_tables(a)
    assert tables.equal.tolist() == [0, 2]  # prefixes "a" and "ab" are tokens 0 and 2
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    assert first_byte_marginal(probs, tables)[0, ord("a")].item() == pytest.approx(0.8)


def test_errors_name_the_fix() -> None:
    vocab = _vocab(0, extra=4)
    probs = torch.full((3, len(vocab)), 1 / len(vocab))
    ids = torch.tensor([1, 2])
    with pytest.raises(ConfigError, match="len\\(token_bytes\\)"):
        byte_distributions(probs, ids, vocab[:-1])
    with pytest.raises(ConfigError, match="len\\(ids\\) \\+ 1"):
        byte_distributions(probs[:2], ids, vocab)
    with pytest.raises(ConfigError, match="distribution"):
        byte_distributions(probs * 2, ids, vocab)
    with pytest.raises(ConfigError, match="boundary_mode"):
        byte_distributions(probs, ids, vocab, "keep")  # type: ignore[arg-type]


def test_teacher_of_another_vocabulary_is_refused(tmp_path) -> None:
    teacher = TinyGPT(16, 300, n_layer=1, n_head=1, n_embd=8)
    hp = {
        "net": {
            "class_path": "modules.components.tiny_gpt.TinyGPT",
            "init_args": {"n_layer": 1, "n_head": 1, "n_embd": 8},
        },
        "input_shape": (16,),
        "num_classes": 300,
    }
    path = tmp_path / "t.ckpt"
    torch.save({"hyper_parameters": hp, "state_dict": {f"net.{k}": v for k, v in teacher.state_dict().items()}}, path)
    with pytest.raises(ConfigError, match="vocabulary 300, not teacher_vocab=2048"):
        ByteDistillModule(teacher_ckpt=str(path), input_shape=(16,), num_classes=280)
    student = ByteDistillModule(teacher_ckpt=str(path), teacher_vocab=300, input_shape=(16,), num_classes=280)
    with pytest.raises(ConfigError, match="no tokenizer of the teacher's vocabulary 300"):
        student.set_vocabularies([[bytes([i]) for i in range(256)] + [b"ab"] * 24, [b"x"] * 400])


def _greedy(data: bytes, vocab: list[bytes]) -> list[int]:
    """Longest-match tokenization (any segmentation into vocabulary strings will do for the test)."""
    index = {t: i for i, t in enumerate(vocab)}
    ids, j = [], 0
    while j < len(data):
        n = max(n for n in range(1, 7) if data[j : j + n] in index)
        ids.append(index[data[j : j + n]])
        j += n
    return ids


def _windows(texts: list[bytes], vocab: list[bytes], width: int) -> tuple[torch.Tensor, ...]:
    x = torch.zeros(len(texts), width, dtype=torch.long)
    y = torch.full((len(texts), width), -100, dtype=torch.long)
    n_bytes = torch.zeros(len(texts), dtype=torch.long)
    for i, text in enumerate(texts):
        ids = _greedy(text, vocab)
        x[i, : len(ids)] = torch.tensor(ids)
        y[i, : len(ids) - 1] = torch.tensor(ids[1:])
        n_bytes[i] = len(text) - len(vocab[ids[0]])
    return x, y, n_bytes


@pytest.mark.parametrize("loss", ["blda", "vocab_kd"])
def test_the_distillation_term_is_the_per_window_reference(loss: str) -> None:
    """The batched loss against ``byte_distributions`` window by window, aligned by byte offset (BLDA), and
    against a loop over common token starts with the shared strings (vocab KD)."""
    torch.manual_seed(0)
    v_s, v_t = _vocab(4, extra=40), _vocab(5, extra=90)
    data = TEXT.encode("utf-8")
    texts = [data[i : i + 24] for i in (0, 10, 33)]
    s_batch, t_batch = _windows(texts, v_s, 24), _windows(texts, v_t, 24)
    student = ByteDistillModule(
        net=lambda shape, n: TinyGPT(shape, n, n_layer=1, n_head=1, n_embd=8),
        loss=loss,
        teacher_net=lambda shape, n: TinyGPT(shape, n, n_layer=1, n_head=1, n_embd=8),
        teacher_vocab=len(v_t),
        input_shape=(24,),
        num_classes=len(v_s),
    )
    student.set_vocabularies([v_s, v_t])
    with torch.no_grad():
        s_logits, t_logits = student.net(s_batch[0]), student.teacher(t_batch[0])
    got, n = student.distill_term(s_logits, s_batch[0], s_batch[1], t_logits, t_batch[0], t_batch[1])
    want = []
    shared = [(i, v_s.index(t)) for i, t in enumerate(v_t) if t in v_s]
    for w in range(len(texts)):
        per = {}
        for side, (xb, logits, vocab) in {"s": (s_batch, s_logits, v_s), "t": (t_batch, t_logits, v_t)}.items():
            k = int((xb[1][w] != -100).sum())
            ids = xb[1][w, :k]
            probs = logits[w, : k + 1].softmax(-1)
            first = len(vocab[int(xb[0][w, 0])])
            starts = [first + sum(len(vocab[int(t)]) for t in ids[:j]) for j in range(k)]
            if loss == "blda":
                rows = byte_distributions(probs.double(), ids, vocab)
                per[side] = {first + j: rows[j] for j in range(len(rows))}
            else:
                per[side] = {o: probs[j] for j, o in enumerate(starts)}
        for off in sorted(set(per["s"]) & set(per["t"])):
            if loss == "blda":
                want.append(divergence(per["t"][off][None], per["s"][off][None].double(), "fkl"))
            else:
                t_p = per["t"][off][[a for a, _ in shared]]
                s_p = per["s"][off][[b for _, b in shared]]
                want.append(divergence((t_p / t_p.sum())[None], (s_p / s_p.sum())[None], "fkl"))
    assert n == len(want) > 5
    assert got.item() == pytest.approx(torch.cat(want).mean().item(), rel=1e-4)


def test_aligned_chunks_and_their_diagnostic() -> None:
    from callbacks.aligned_chunks import AlignedChunkStats
    from callbacks.diagnostic import Moment

    torch.manual_seed(0)
    v_s, v_t = _vocab(4, extra=40), _vocab(5, extra=90)
    data = TEXT.encode("utf-8")
    texts = [data[i : i + 24] for i in (0, 10, 33)]
    s_batch, t_batch = _windows(texts, v_s, 24), _windows(texts, v_t, 24)
    module = ByteDistillModule(
        net=lambda shape, n: TinyGPT(shape, n, n_layer=1, n_head=1, n_embd=8),
        teacher_net=lambda shape, n: TinyGPT(shape, n, n_layer=1, n_head=1, n_embd=8),
        teacher_vocab=len(v_t),
        input_shape=(24,),
        num_classes=len(v_s),
    )
    module.set_vocabularies([v_s, v_t])
    out = module.aligned_chunks((*s_batch, *t_batch))
    want = []
    for text in texts:  # common token starts after both first tokens, then chunks up to the window's end
        starts = []
        for vocab in (v_s, v_t):
            ids = _greedy(text, vocab)
            starts.append({sum(len(vocab[t]) for t in ids[:j]) for j in range(1, len(ids))})
        common = sorted(starts[0] & starts[1])
        want += [b - a for a, b in zip(common, [*common[1:], len(text)])]
    assert out["chunk_lengths"].tolist() == want
    n_inner = sum(len(v_s[t]) - 1 for text in texts for t in _greedy(text, v_s)[1:])  # inside target tokens
    mass = out["boundary_mass_student"]
    assert mass.numel() == n_inner and ((mass >= 0) & (mass <= 1)).all()
    diag = AlignedChunkStats()
    stats = diag.measure(None, module, Moment("after_step", 1, 0, (*s_batch, *t_batch)))  # type: ignore[arg-type]
    values = diag.finalize(stats)
    assert values["chunk_len_mean"] == pytest.approx(sum(want) / len(want)) and values["n_chunks"] == len(want)
    assert values["boundary_mass_student"] == pytest.approx(mass.double().mean().item())
