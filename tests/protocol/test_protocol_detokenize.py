"""protocol/detokenize.py: the byte-table decoder and the piecewise response decoder give exactly
`tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)`, on both
test tokenizers: random ids over the whole vocabulary, runs of raw byte tokens (cut and invalid
UTF-8), special and protocol tokens, ids the tokenizer does not know, added tokens whose text is
outside the byte-level alphabet, and a tokenizer whose decoder is not byte-level."""
from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken, decoders

from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tokenizer, default_corpus
from rstar2_cli.protocol.detokenize import ByteDecoder, ResponseDecoder, ids_decoder


def reference(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module", params=["tiny", "qwen3_style"])
def tok(request):
    if request.param == "tiny":
        return build_tokenizer(default_corpus(0), 512)
    return build_qwen3_style_tokenizer()


def id_cases(tok, seed=0):
    """Random ids, raw single-byte tokens (continuation bytes, cut characters), and real text."""
    rng = random.Random(seed)
    vocab = len(tok)
    single_bytes = [i for i in range(vocab) if len(tok.convert_ids_to_tokens(i)) == 1]
    cases = [[], list(range(vocab)), tok.encode("<|im_start|>assistant\n<reason>é ∑ 😀 42<|im_end|>\n",
                                                add_special_tokens=False)]
    cases += [[rng.randrange(vocab) for _ in range(rng.randrange(1, 300))] for _ in range(200)]
    cases += [[rng.choice(single_bytes) for _ in range(rng.randrange(1, 12))] for _ in range(2000)]
    return cases


def test_the_byte_table_decodes_as_the_tokenizer_does(tok):
    decode = ids_decoder(tok)
    assert isinstance(decode, ByteDecoder)       # both test tokenizers are byte-level, as Qwen's
    for ids in id_cases(tok):
        assert decode(ids) == reference(tok, ids), ids


def test_ids_the_tokenizer_does_not_know_are_decided_by_the_rust_decode(tok):
    """Just past the known ids, far past them, negative (which a list would count from the end), too
    large for the Rust tokenizer, not an int: dropped or refused exactly as the Rust decode does."""
    decode = ids_decoder(tok)
    for unknown in (len(tok), len(tok) + 1, 10 * len(tok)):
        assert decode([5, unknown, 7]) == reference(tok, [5, unknown, 7])      # dropped, as Rust drops it
        decoded = ResponseDecoder(decode)
        decoded.extend([5, unknown])
        decoded.extend([7])
        assert decoded.text([5, unknown, 7]) == reference(tok, [5, unknown, 7])
    for bad, error in (([-1], OverflowError), ([5, -len(tok)], OverflowError), ([-10 * len(tok)], OverflowError),
                       ([2 ** 40], OverflowError), ([5, "7"], TypeError)):
        with pytest.raises(error):
            reference(tok, bad)
        with pytest.raises(error):
            decode(bad)
        with pytest.raises(error):
            ResponseDecoder(decode).extend(bad)


def test_a_response_decoded_piece_by_piece_is_the_whole_decode(tok):
    """Pieces cut anywhere (inside a character's bytes too): each piece's text, and the whole's."""
    rng = random.Random(1)
    decode = ids_decoder(tok)
    for ids in id_cases(tok, seed=1)[:600]:
        decoded = ResponseDecoder(decode)
        cuts = sorted(rng.sample(range(len(ids) + 1), min(len(ids) + 1, rng.randrange(1, 5))))
        for a, b in zip([0] + cuts, cuts + [len(ids)]):
            decoded.extend(ids[a:b])
            assert decoded.last() == reference(tok, ids[a:b])
        assert decoded.text(ids) == reference(tok, ids)


def test_a_response_whose_pieces_were_not_all_seen_is_decoded_whole(tok):
    decode = ids_decoder(tok)
    ids = tok.encode("one two three", add_special_tokens=False)
    decoded = ResponseDecoder(decode)
    decoded.extend(ids[:2])
    assert decoded.text(ids) == reference(tok, ids)
    assert ResponseDecoder(decode).last() == ""


def test_added_tokens_outside_the_byte_alphabet_and_tokens_added_later():
    """An added token with a space or a non-alphabet character is its own UTF-8 (byte_level.rs); the
    table follows tokens added after it was built."""
    tok = build_tokenizer(default_corpus(0), 512)
    assert isinstance(ids_decoder(tok), ByteDecoder)
    tok.add_tokens([AddedToken("<|ü ß|>", special=True, normalized=False), AddedToken("Ġx y", normalized=False),
                    AddedToken("ĠĊ", normalized=False)])
    decode = ids_decoder(tok)
    ids = tok.encode("a <|ü ß|>Ġx y b ĠĊ c é", add_special_tokens=False)
    assert len(tok) - 3 <= max(ids) and decode(ids) == reference(tok, ids)
    for ids in id_cases(tok, seed=2)[:300]:
        assert decode(ids) == reference(tok, ids)


def test_a_decoder_that_is_not_byte_level_is_called_as_it_is():
    tok = build_tokenizer(default_corpus(0), 512)
    tok.backend_tokenizer.decoder = decoders.Metaspace()
    decode = ids_decoder(tok)
    assert not isinstance(decode, ByteDecoder)
    ids = tok.encode("▁hello world\n<|im_end|>", add_special_tokens=False)
    assert decode(ids) == reference(tok, ids)
    decoded = ResponseDecoder(decode)
    decoded.extend(ids[:3])
    assert decoded.last() == reference(tok, ids[:3])
    decoded.extend(ids[3:])
    assert decoded.text(ids) == reference(tok, ids)
