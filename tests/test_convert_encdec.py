"""Switch Transformers -> .colibri (ENC_DEC file) and the numpy reference
over that file, judged by transformers: the converter from a checkpoint
directory and from a loaded model (same bytes), on worker processes
(same bytes), the expert-name mapping, and f32 within 1e-4 of transformers on the padded-batch scenario of
tests/golden_switch.py (encoder output, decoder prefill + 8 cached steps)."""
from __future__ import annotations

import numpy as np
import pytest

from colibri.file import format as F
from export_progress import assert_one_line_per_layer
from golden_switch import make_switch, scenario

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

RTOL = 1e-4


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    """(model, checkpoint dir, {quant: file}) with max_seq_len 24."""
    from colibri.model.convert import ColibriExporter
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("switch")
    model = make_switch(seed=0)
    model.save_pretrained(root / "ck")
    files = {q: ColibriExporter(root / "ck", quant=q, max_seq_len=24, max_batch=4)
             .export(root / f"switch-{q}.colibri") for q in ("f32", "int8")}
    yield model, root / "ck", files
    torch.set_num_threads(old)


def test_file_states_the_encoder_decoder(switch):
    model, _, files = switch
    cf = F.read_file(files["f32"])
    d, s = cf.desc, cf.shape
    assert d.has(F.Feat.ENC_DEC) and d.has(F.Feat.RELU_FFN) and d.has(F.Feat.DENSE_LAYERS)
    assert (s.n_layers, d.encoder_layers, s.head_dim, s.n_heads, s.top_k) == (7, 4, 10, 3, 1)
    # Encoder layers 1, 3 and decoder layer 1 (file layer 5) are the MoE ones.
    assert d.dense_layers == (0, 2, 4, 6)
    assert (d.expert_capacity, d.decoder_start, d.attn_scale) == (2, 0, 1.0)
    assert d.lm_scale == np.float32(37 ** -0.5)
    kinds = {e.kind for e in cf.entries}
    assert {F.Kind.XWQ, F.Kind.ENC_POS_BIAS, F.Kind.DEC_POS_BIAS,
            F.Kind.ENC_FINAL_NORM} <= kinds and F.Kind.EXPERT_W3 not in kinds
    assert F.Kind.XWQ not in {e.kind for e in cf.entries if e.layer < 4}
    q8 = F.read_file(files["int8"])
    assert q8.dtypes[F.Kind.XWQ] == q8.dtypes[F.Kind.EXPERT_W1] == F.DType.I8_GROUP
    from colibri.model.inspect import describe
    assert ("enc-dec       layers 0-3 encoder, 4-6 decoder; expert capacity 2; decoder "
            "start token 0") in describe(cf, sections=False)


def test_loaded_model_and_directory_give_the_same_file(switch, tmp_path):
    from colibri.model.convert import ColibriExporter
    model, _, files = switch
    got = ColibriExporter(model=model, tokenizer=None, quant="int8", max_seq_len=24,
                          max_batch=4).export(tmp_path / "m.colibri")
    assert got.read_bytes() == files["int8"].read_bytes()


def test_jobs_write_the_bytes_one_process_writes(tmp_path, monkeypatch):
    """An encoder-decoder's block-type tensors encoded on worker processes
    (`--jobs`, colibri/file/encode_pool.py) are written in the file's order,
    byte for byte what one process writes (d_model 64: the q4 mix stores
    Q5_0 there; every block tensor is sent to a worker here, however
    small), with one progress line per layer in order; through the CLI
    too."""
    from colibri import cli
    from colibri.file import encode_pool
    from colibri.model.convert import ColibriExporter
    monkeypatch.setattr(encode_pool, "POOL_MIN_WEIGHTS", 0)
    sent = []

    class Counting(encode_pool.cf.ProcessPoolExecutor):
        def submit(self, fn, weights, *args):
            sent.append(weights.shape)
            return super().submit(fn, weights, *args)
    monkeypatch.setattr(encode_pool.cf, "ProcessPoolExecutor", Counting)
    make_switch(seed=2, d_model=64, d_ff=64).save_pretrained(tmp_path / "ck")
    kw = dict(quant="q4", max_seq_len=24, max_batch=2)
    one = ColibriExporter(tmp_path / "ck", **kw).export(tmp_path / "one.colibri")
    assert not sent
    lines = []
    ex = ColibriExporter(tmp_path / "ck", jobs=3, progress=lines.append, **kw)
    ex.export(tmp_path / "three.colibri")
    assert sent and one.read_bytes() == (tmp_path / "three.colibri").read_bytes()
    assert F.DType.Q5_0 in {F.DType(e.dtype) for e in F.read_file(one).entries}
    assert_one_line_per_layer(lines, ex.shape.n_layers)
    sent.clear()
    assert cli.main(["convert", str(tmp_path / "ck"), "-o", str(tmp_path / "cli.colibri"),
                     "--quant", "q4", "--max-seq-len", "24", "--max-batch", "2",
                     "--jobs", "2", "-q"]) == 0
    assert sent and (tmp_path / "cli.colibri").read_bytes() == one.read_bytes()


def test_expert_weight_mapping_names_renamed_experts(switch, tmp_path):
    """A checkpoint whose experts are called up/down converts with
    set_expert_weight_mapping({"up": "w1", "down": "w2"}) to the same file;
    without it the error names the missing tensors and the remedy."""
    from colibri.model.convert import ColibriExporter
    from colibri.errors import ConversionError
    model, _, files = switch
    renamed = make_switch(seed=0)
    sd = {k.replace(".wi.weight", ".up.weight").replace(".wo.weight", ".down.weight")
          if ".experts." in k else k: v for k, v in renamed.state_dict().items()}

    class Renamed:   # a loaded model as the exporter sees it
        config = renamed.config

        def state_dict(self):
            return sd
    ex = ColibriExporter(model=Renamed(), quant="int8", max_seq_len=24, max_batch=4)
    with pytest.raises(ConversionError, match="missing.*expert_0.wi.weight.*--expert-map"):
        ex.export(tmp_path / "no.colibri")
    ex.set_expert_weight_mapping({"up": "w1", "down": "w2"})
    assert ex.export(tmp_path / "r.colibri").read_bytes() == files["int8"].read_bytes()
    ex2 = ColibriExporter(model=model, quant="int8", max_seq_len=24, max_batch=4)
    ex2.set_expert_weight_mapping({"wi": "w1", "wo": "w2"})   # Switch's own names
    assert ex2.export(tmp_path / "s.colibri").read_bytes() == files["int8"].read_bytes()
    with pytest.raises(ConversionError, match="w3 has no meaning"):
        ex2.set_expert_weight_mapping({"wi": "w3"})


def _run_reference(path, ids, mask, calls):
    from colibri.model.reference_encdec import from_file
    ref = from_file(path)
    enc = ref.encode(ids, mask)
    return enc, [ref.decode(c) for c in calls]


def test_f32_file_reference_matches_transformers(switch):
    model, _, files = switch
    ids, mask, calls, enc_want, want = scenario(model, (11, 7), 4, 8, seed=3)
    enc, got = _run_reference(files["f32"], ids, mask, calls)
    v = mask.astype(bool)
    err = float(np.abs(enc[v] - enc_want[v]).max() / np.abs(enc_want[v]).max())
    assert err <= RTOL, f"encoder: {err:.3g}"
    for i, (g, w) in enumerate(zip(got, want)):
        err = float(np.abs(g - w).max() / np.abs(w).max())
        assert err <= RTOL, f"decoder call {i}: {err:.3g}"


def test_decoder_only_reference_refuses_the_file(switch):
    from colibri.errors import ColibriError
    from colibri.model.reference import Reference
    with pytest.raises(ColibriError, match="reference_encdec.from_file"):
        Reference(switch[2]["f32"])


def test_int8_file_reference_is_close_but_not_exact(switch):
    """int8 changes the numbers (an int8 file that matched f32 exactly would
    mean the int8 path is not used) but keeps them near transformers'."""
    model, _, files = switch
    ids, mask, calls, _, want = scenario(model, (11, 7), 4, 8, seed=4)
    _, got = _run_reference(files["int8"], ids, mask, calls)
    w, g = np.concatenate([x.reshape(-1) for x in want]), np.concatenate(
        [x.reshape(-1) for x in got])
    rms = float(np.sqrt(np.mean((g - w) ** 2)) / np.sqrt(np.mean(w ** 2)))
    assert 1e-4 < rms < 0.1, rms


def test_position_bias_tables_follow_the_buckets(switch):
    """ENC_POS_BIAS column rel + L - 1 and DEC_POS_BIAS column j hold the
    bucket embedding of transformers' bucket for that distance."""
    from transformers.models.switch_transformers.modeling_switch_transformers import (
        SwitchTransformersAttention as A)
    model, _, files = switch
    cf = F.read_file(files["f32"])
    n = cf.shape.max_seq_len
    for kind, stack, bidir in ((F.Kind.ENC_POS_BIAS, model.encoder, True),
                               (F.Kind.DEC_POS_BIAS, model.decoder, False)):
        emb = stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        rel = torch.arange(-(n - 1), n) if bidir else -torch.arange(n)
        b = A._relative_position_bucket(rel, bidirectional=bidir, num_buckets=8, max_distance=12)
        want = emb.detach().numpy()[b.numpy()].T
        np.testing.assert_array_equal(cf.tensor(kind).values, want)


def test_tokenizer_object_goes_into_the_file(tmp_path):
    """ColibriExporter(model=, tokenizer=<a transformers tokenizer object>):
    a byte-level BPE tokenizer is written as the TOKENIZER section (ids as
    `tokenizers` gives them); one of a kind the section cannot hold (a
    Unigram model, like T5's) is one warning and the file takes ids; a
    tokenizer with more ids than the model is refused by name."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from colibri.model.convert import ColibriExporter
    from colibri.errors import ConversionError
    from colibri.text.tokenizer import Tokenizer as CTokenizer
    from tokenizer_fixtures import corpus_text, train

    hf_tok = train("bl-gpt2-300", corpus_text(300_000))
    n = hf_tok.get_vocab_size()
    model = make_switch(seed=2, vocab_size=n + 3)
    fast = PreTrainedTokenizerFast(tokenizer_object=hf_tok)
    out = ColibriExporter(model=model, tokenizer=fast, quant="f32", max_seq_len=16).export(
        tmp_path / "t.colibri")
    text = "def encode(self, text): return [ord(c) for c in text]"
    assert CTokenizer.from_file(out).encode(text) == hf_tok.encode(text).ids

    warnings = []
    uni = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(
        models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], unk_id=0)))
    out = ColibriExporter(model=model, tokenizer=uni, quant="f32", max_seq_len=16,
                          warn=warnings.append).export(tmp_path / "u.colibri")
    assert len(warnings) == 1 and "without a tokenizer" in warnings[0]
    assert F.read_file(out).entries[-1].kind != 0x100

    small = make_switch(seed=2, vocab_size=n - 10)
    with pytest.raises(ConversionError, match=f"{n} token ids, the model's vocabulary only"):
        ColibriExporter(model=small, tokenizer=fast, quant="f32", max_seq_len=16)
